"""Root cause on TorchTitan's debug model (issue 36's TorchTitan cells): docs/TORCHTITAN.md's
`torchtitan:locate` block, run as written after the `same` block whose `runs/tt-ref` it replays and
whose traced clean run `runs/tt-trace` it diffs against (that block is recorded once per test run
for test_torchtitan_runs.py; linked here, not recorded again). One launch of 2 ranks: a traced
replay with the planted fault, which is also the doc's replay of the reference (exact until the
fault: no replay launch of its own). Then the `torchtitan:cells` block: one more traced replay holding
four faults (backward-only op, in-place write through a view, collective input, optimizer op), one
per rank and step, in a run whose learning rate is also 1% higher (the `same` block's lr check
reads its step 1: no launch of its own), diffed against the same traced clean run. (The runner's one-line error for a bad
`--fault` spec is checked in-process: tests/samples/test_torchtitan.py.)
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from click.testing import CliRunner

from tests.samples.torchtitan_doc import cells_block, cli, doc_block, ran, run_block, verdict

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed (pip install -e '.[dev]' installs it)"),
]


def locate_block(shared_once):
    same, _ = doc_block(shared_once, "same")
    folder, results = shared_once("torchtitan-locate", lambda f: run_block(
        f, "locate", reuse={"runs/tt-ref": same / "runs" / "tt-ref", "runs/tt-trace": same / "runs" / "tt-trace"}))
    for r in results:
        if r["command"].startswith("tracekit record"):
            assert r["rc"] == 0, (r["command"], r["err"][-3000:])
    return folder, results


# (step, rank) -> (module, phase, kind, op prefix): each fault of the cells block where it is planted
CELLS = {
    (2, 0): ("", "fwd", "extra op", ("aten.copy_", "aten.fill_")),  # nan_grad:0:2, the write through a view
    (2, 1): ("", "opt", "argument", "aten._fused_adamw_"),  # opt_lr:1:2, the update's lr
    (3, 0): ("", "fwd", "extra op", "aten.mul.Tensor"),  # loss_scale:0:3, the loss feeding the reduce-scatter
    (3, 1): ("layers.5.feed_forward", "bwd", "extra op", "aten.mul.Tensor"),  # ffn_bwd:1:3, silu's wrong derivative
}


def test_four_faults_in_one_replay_each_name_their_rank_module_op_and_phase(shared_once):
    import tracekit

    folder, results = cells_block(shared_once)
    diff = ran(results, "tracekit diff runs/tt-trace runs/tt-cells")
    # step 1, untraced, differs by the run's 1% higher learning rate alone (test_torchtitan_runs.py's
    # test_an_lr_one_percent_higher_fails_at_step_1); the traced steps name the faults, not the lr
    assert diff["rc"] == 1 and "first_step=1" in verdict(diff), diff["out"][-3000:]
    # the printed root cause is one of step 2's two (which one goes first across ranks is the
    # order of their events); each rank's own is checked below
    assert re.search(r"Root cause: step 2, rank [01], module \(top level\), aten\.(copy_|_fused_adamw_)", diff["out"]), \
        diff["out"][-4000:]

    # the doc's diff above printed the verdict; the traces' comparisons come from the structured
    # report, whose tensor part is cut to the outputs (the traces are compared the same whatever
    # kinds are: tracekit.compare.traces pairs ranks as the outputs are paired)
    report = tracekit.diff(str(folder / "runs" / "tt-trace"), str(folder / "runs" / "tt-cells"), kinds=["outputs"])
    named = {(tc.step, tc.rank): (tc.root_cause.event.module, tc.root_cause.event.phase, tc.root_cause.kind,
                                  tc.root_cause.event.op, tc.root_cause.reason)
             for tc in report.traces if tc.root_cause}
    assert set(named) == set(CELLS), named
    for where, (module, phase, kind, op) in CELLS.items():
        got = named[where]
        assert got[:3] == (module, phase, kind) and got[3].startswith(op), (where, got)
    assert "lr=0.0012" in named[(2, 1)][4] and "vs 0.0008" in named[(2, 1)][4], named[(2, 1)]


def test_the_planted_feed_forward_fault_is_named_and_the_clean_step_names_nothing(shared_once):
    import tracekit
    from tracekit.compare.rootcause import first_root_cause

    folder, results = locate_block(shared_once)
    diff = ran(results, "tracekit diff runs/tt-trace runs/tt-fault")
    assert diff["rc"] == 1 and "first_step=3" in verdict(diff), diff["out"][-3000:]
    assert ("Root cause: step 3, rank 1, module layers.1.feed_forward, aten.gelu.default [fwd, call 0] (extra op)"
            in diff["out"]), diff["out"][-4000:]

    # the traces' comparisons (the doc's diff above printed the verdict and this root cause), the
    # tensor part cut to the outputs as in the four-fault test
    report = tracekit.diff(str(folder / "runs" / "tt-trace"), str(folder / "runs" / "tt-fault"), kinds=["outputs"])
    clean = [tc for tc in report.traces if tc.step == 2]
    assert {tc.rank for tc in clean} == {0, 1}
    assert all(tc.root_cause is None for tc in clean), [(tc.rank, tc.root_cause.to_dict()) for tc in clean
                                                         if tc.root_cause]
    rc = first_root_cause(report.traces)  # what the failing diff names (report.root_cause of a FAIL)
    assert (rc.step, rc.rank, rc.event.module, rc.event.phase, rc.kind) == (
        3, 1, "layers.1.feed_forward", "fwd", "extra op") and rc.event.op.startswith("aten.gelu"), rc.reason


def test_the_faulty_replay_reproduces_the_reference_exactly_until_its_fault(shared_once, tmp_path):
    """The doc's replay (`runs/tt-fault`, replayed from `runs/tt-ref`): `tracekit diff --exact
    runs/tt-ref runs/tt-fault` fails first at step 3, where the fault is, so steps 1 and 2 (step 2
    restarted from the reference's parameters and AdamW state) are the reference's bit for bit; the
    store names its reference."""
    import json

    from tracekit.cli.main import main as tracekit_main

    folder, _ = locate_block(shared_once)
    ref, fault = str(folder / "runs" / "tt-ref"), str(folder / "runs" / "tt-fault")
    out = tmp_path / "exact.json"
    result = CliRunner().invoke(tracekit_main, ["diff", "--exact", ref, fault, "--json-file", str(out)])
    assert result.exit_code == 1, result.output[-3000:]
    report = json.loads(out.read_text())
    assert report["first_divergence"]["step"] == 3 and report["summary_line"].endswith("first_step=3"), \
        report["summary_line"]
    assert report["summary_line"].startswith("FAIL comparison ranks=2 steps=3"), report["summary_line"]
    shown = json.loads(cli("show", "--json", fault))
    assert shown["run"].get("replay_of"), "the replay store names its reference"
