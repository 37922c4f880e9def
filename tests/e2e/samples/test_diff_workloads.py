"""`tracekit diff` on real recordings of the reference workloads (the issue's done-when)."""

import pytest
from click.testing import CliRunner

from tracekit.cli.main import main

from tests.launching import second_recording

MODES = ["ddp", "fsdp", "tp", "simplefsdp_tp"]
RANKS = {"ddp": 2, "fsdp": 2, "tp": 2, "simplefsdp_tp": 4}


def diff(*args):
    result = CliRunner().invoke(main, ["diff", *args])
    return result.exit_code, result.output.rstrip("\n").splitlines()


@pytest.mark.parametrize("mode", MODES)
def test_two_recordings_of_a_mode_pass_exactly(recorded_sample, mode):
    ref, _ = recorded_sample(mode)
    again = second_recording(recorded_sample, mode)  # 8 steps, traced: the common 3 are compared
    code, lines = diff("--exact", ref, again)  # of another structure: refused without --allow-missing
    assert code == 2 and "--allow-missing" in "\n".join(lines), "\n".join(lines[-30:])
    code, lines = diff("--exact", "--allow-missing", ref, again)
    assert code == 0, "\n".join(lines[-30:])
    assert lines[-1] == f"PASS comparison ranks={RANKS[mode]} steps=3 missing_steps=5"
    loss_header = next(i for i, line in enumerate(lines) if line.startswith("Loss"))
    assert [line.split()[0] for line in lines[loss_header + 3 : loss_header + 6]] == ["1", "2", "3"]


@pytest.mark.parametrize("cand", ["fsdp", "tp"])
def test_adding_a_parallel_dimension_passes_with_global_alignment(recorded_sample, cand):
    code, lines = diff("--align", "global", recorded_sample("ddp")[0], recorded_sample(cand)[0])
    assert code == 0, "\n".join(lines[-30:])
    assert lines[-1].startswith("PASS comparison")
    if cand == "tp":  # ddp's per-rank outputs are a slice of the batch, tp's the whole batch
        assert any(line.startswith("not comparable: outputs") for line in lines)


def test_learning_rate_one_percent_off_fails_at_step_one_parameters(recorded_sample):
    ref, _ = recorded_sample("ddp")
    cand, _ = recorded_sample("ddp", extra=("--fault", "lr_scale=1.01"))
    code, lines = diff(ref, cand)
    assert code == 1
    assert lines[-1].startswith("FAIL comparison ranks=2 steps=3 ") and lines[-1].endswith(" first_step=1")
    first = next(line for line in lines if line.startswith("First divergence"))
    assert first.startswith("First divergence: step 1, parameters")
