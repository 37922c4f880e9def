"""`tracekit record --trace` end to end (real torchrun ranks) and its flag checks."""


import pytest
from click.testing import CliRunner

from tracekit.cli.main import main


@pytest.mark.parametrize("args, message", [
    (["--trace-steps", "2"], "--trace-steps and --trace-full need --trace"),
    (["--trace", "bogus"], "bogus"),
    (["--trace", "ops", "--trace-steps", "0"], "steps count from 1"),
])
def test_bad_trace_flags_are_one_line_usage_errors(tmp_path, args, message):
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "s"), *args, "--", "true"])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "s").exists()


@pytest.mark.parametrize("steps, traced, message", [
    ((3, 5), [3], "asked to trace steps 4-5, which no rank traced (the run ended at step 3)"),
    ((2, None), [2, 3], None),
    (None, [], "--trace ops traced no step"),
    (None, [2], None),
])
def test_trace_steps_asked_and_not_traced_are_reported(steps, traced, message):
    from tracekit.launch.config import RecordConfig
    from tracekit.launch.trace_check import untraced_problem

    got = untraced_problem(RecordConfig(trace="ops", trace_steps=steps), [1, 2, 3], {"ops": traced} if traced else {})
    assert (got is None) == (message is None) and (message is None or message in got)
