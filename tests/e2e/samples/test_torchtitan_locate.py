"""Root cause on TorchTitan's debug model (issue 36's TorchTitan cell): docs/TORCHTITAN.md's
`torchtitan:locate` block, run as written after the `same` block whose `runs/tt-ref` it replays
(that block is recorded once per test run for test_torchtitan_runs.py; linked here, not recorded
again). Two launches of 2 ranks: a traced clean run and a traced replay with the planted fault.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.e2e.samples.test_torchtitan_runs import doc_block, verdict
from tests.samples.torchtitan_doc import ran, run_block

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed (pip install -e '.[dev]' installs it)"),
]


def locate_block(shared_once):
    same, _ = doc_block(shared_once, "same")
    folder, results = shared_once("torchtitan-locate", lambda f: run_block(
        f, "locate", reuse={"runs/tt-ref": same / "runs" / "tt-ref"}))
    for r in results:
        if r["command"].startswith("tracekit record"):
            assert r["rc"] == 0, (r["command"], r["err"][-3000:])
    return folder, results


def test_the_planted_feed_forward_fault_is_named_and_the_clean_step_names_nothing(shared_once):
    import tracekit

    folder, results = locate_block(shared_once)
    diff = ran(results, "tracekit diff runs/tt-trace runs/tt-fault")
    assert diff["rc"] == 1 and "first_step=3" in verdict(diff), diff["out"][-3000:]
    assert ("Root cause: step 3, rank 1, module layers.1.feed_forward, aten.gelu.default [fwd, call 0] (extra op)"
            in diff["out"]), diff["out"][-4000:]

    report = tracekit.diff(str(folder / "runs" / "tt-trace"), str(folder / "runs" / "tt-fault"))
    clean = [tc for tc in report.traces if tc.step == 2]
    assert {tc.rank for tc in clean} == {0, 1}
    assert all(tc.root_cause is None for tc in clean), [(tc.rank, tc.root_cause.to_dict()) for tc in clean
                                                         if tc.root_cause]
    rc = report.root_cause
    assert (rc.step, rc.rank, rc.event.module, rc.event.phase, rc.kind) == (
        3, 1, "layers.1.feed_forward", "fwd", "extra op") and rc.event.op.startswith("aten.gelu"), rc.reason


def test_a_bad_fault_spec_is_one_line_and_exit_2():
    from tests.conftest import REPO

    out = subprocess.run([sys.executable, f"{REPO}/samples/torchtitan/train.py", "--fault", "ffn_act:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and re.fullmatch(r"Error: --fault 'ffn_act:1': .*\n", out.stderr), out.stderr
