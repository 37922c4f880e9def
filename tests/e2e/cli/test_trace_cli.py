"""`tracekit record --trace` end to end (real torchrun ranks) and its flag checks."""

import json
import os

from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.store import open_store
from tracekit.store.traces import read_events, trace_steps

from tests.e2e.samples.traced_layouts import STEPS, traced_reference
from tests.paths import CLI_SCRIPTS


TRACE = ["--trace", "ops", "--trace-steps", "2"]


def test_zero_code_traces_name_the_planted_op_on_its_rank(recorded_sample, tmp_path):
    """samples/plain never imports tracekit: zero-code recording traces step 2 of both runs; the
    candidate's rank 1 computes module 0's matmul in bfloat16 from step 2 on. The candidate asks
    `--trace ops` alone: zero-code recording starts inside step 1, so that traces step 2 (it traced
    nothing before), and the record line and `tracekit show` say so."""
    ref, _ = recorded_sample("ddp", script="plain", record_args=TRACE)
    cand, recorded = recorded_sample("ddp", script="plain", record_args=["--trace", "ops"],
                                     extra=["--fault", "op=matmul_bf16:1:2"])
    assert "; traces: ops at step 2;" in recorded.stderr.splitlines()[-1], recorded.stderr[-2000:]
    assert [trace_steps(open_store(cand).rank(r).group, "ops") for r in (0, 1)] == [[2], [2]]
    shown = CliRunner().invoke(main, ["show", cand])
    assert shown.exit_code == 0 and "traces: ops at step 2" in shown.output.splitlines()
    for r in (0, 1):
        events = read_events(open_store(ref).rank(r).group, "ops", 2)
        collectives = [e for e in events if e.group is not None]
        assert collectives and all(e.group == (0, 1) for e in collectives)  # DDP's gradient all-reduce
        assert {e.phase for e in events} == {"fwd", "bwd", "opt"}
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["diff", ref, cand, "--json-file", str(out)])
    assert result.exit_code == 1, result.output
    assert "Root cause: step 2, rank 1, module 0, aten._to_copy.default [fwd, call 0] (extra op)" in result.output
    rc = json.loads(out.read_text())["root_cause"]
    assert (rc["rank"], rc["module"], rc["op"], rc["outputs"][0]["dtype"]) == (1, "0", "aten._to_copy.default", "bfloat16")


def test_ddp_against_fsdp_traces_name_no_root_cause(recorded_sample):
    """Same model and data, other sharding: the op streams differ (gathers, reduce-scatters, shard
    shapes) and are reported, but no op is blamed. (The root-cause matrix's traced references,
    steps 2 to 7: no launch of their own; fsdp's with --log-norms, full_tensor() in the loop.)"""
    ddp, fsdp = traced_reference(recorded_sample, "ddp"), traced_reference(recorded_sample, "fsdp")
    assert trace_steps(open_store(fsdp).rank(1).group, "ops") == list(range(2, STEPS + 1))
    result = CliRunner().invoke(main, ["diff", ddp, fsdp, "--align", "global"])
    assert result.exit_code == 0, result.output
    assert "no root cause" in result.output and "Root cause:" not in result.output
    assert "missing from candidate" in result.output  # the all-reduce ddp runs and fsdp does not


def test_cli_traces_modules_over_a_step_range_and_keeps_the_bytes_it_is_asked_for(tmp_path):
    """Through `tracekit record` (one process, no torchrun): --trace modules over --trace-steps 2:3,
    then --trace ops with --trace-full on the forward only, whose kept bytes are the values the
    step computed (the recorded output)."""
    import subprocess
    import sys

    import numpy as np

    from tracekit.store.traces import read_full

    tiny = [sys.executable, os.path.join(CLI_SCRIPTS, "tiny_train.py")]

    def record(store, *args):
        r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, *args, "--", *tiny,
                            "--steps", "4"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return open_store(store).rank(0)

    mods = record(str(tmp_path / "modules"), "--trace", "modules", "--trace-steps", "2:3")
    assert trace_steps(mods.group, "modules") == [2, 3] and trace_steps(mods.group, "ops") == []
    for step in (2, 3):  # the model is one Linear: its output forward; its input (the batch) needs no gradient
        assert [(e.phase, e.module, e.op) for e in read_events(mods.group, "modules", step)] == [
            ("fwd", "", "forward")]

    ops = record(str(tmp_path / "ops"), "--full", "outputs:*", "--trace", "ops", "--trace-steps", "3",
                 "--trace-full", "fwd:*")
    assert trace_steps(ops.group, "ops") == [3]
    events = read_events(ops.group, "ops", 3)
    assert {e.phase for e in events} == {"fwd", "bwd", "opt"}
    kept = {e.phase for e in events for t in e.inputs + e.outputs if t.full is not None}
    assert kept == {"fwd"}
    addmm = next(e for e in events if e.op == "aten.addmm.default")
    data, dtype, shape = read_full(ops.group, "ops", 3, addmm.outputs[0].full)
    assert dtype == "float32" and shape == [3, 2]
    np.testing.assert_array_equal(data.reshape(shape), ops.read("outputs", 3, "output"))


def _record_plain(store, *args, steps=3):
    import subprocess
    import sys

    script = os.path.join(CLI_SCRIPTS, "plain_tiny_train.py")
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, *args, "--", sys.executable,
                           script, "--steps", str(steps)], capture_output=True, text=True, timeout=120)


def test_zero_code_step_it_cannot_trace_is_a_one_line_error(tmp_path):
    r = _record_plain(str(tmp_path / "s"), "--trace", "ops", "--trace-steps", "1:2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: --trace-steps 1:2 asked to trace step 1, which no rank traced (zero-code recording starts inside "
        "step 1 and traces from step 2)")
