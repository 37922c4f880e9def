"""docs/LOCATE.md beyond what every doc block gets (tests/e2e/docs/test_doc_commands.py runs its block
and compares the outputs it shows): the root cause and source line it names, what the replayed
trace holds, and a clean replay of the traced step (`record --replay-from --trace`), which names
no root cause. The block's results come from the same run of the block (doc_runs.run_group)."""

from __future__ import annotations

import json
import os

import pytest

import tracekit

from tests.conftest import REPO
from tests.docs.doc_runs import _bash, run_group
from tracekit.store import open_store
from tracekit.store.traces import read_events, trace_steps

T = "torchrun --standalone --nproc-per-node=2 samples/tutorial/train.py --parallelism ddp --steps 3"
# a candidate whose rank 1 differs from step 1 on (gradients scaled in step 1 only) and whose
# model is clean: replayed from the reference at step 2, its traced step 2 is the reference's
CLEAN_REPLAY = (f"tracekit record -o runs/locate/clean-replay --replay-from runs/locate/ref --replay-steps 2:2 "
                f"--trace ops --trace-steps 2 -- {T} --fault grad_scale=1:1:1.01")


@pytest.fixture(scope="module")
def locate(recorded_sample, shared_once):
    folder, result = run_group("locate", recorded_sample, shared_once)
    assert T in open(os.path.join(REPO, "docs", "LOCATE.md")).read(), "the doc's T changed: update T here"
    commands = result["ran"][0]["commands"]

    def clean(_):
        return _bash(CLEAN_REPLAY + " && tracekit diff runs/locate/ref-trace runs/locate/clean-replay "
                     "--json-file runs/locate/clean.json", folder)

    _, out = shared_once("locate-doc-clean", clean)
    return os.path.join(folder, "runs", "locate"), commands, out


def test_locate_doc_commands_show_what_the_doc_shows(locate):
    runs, commands, _ = locate
    assert len(commands) == 6, "the doc records two runs, then promises four commands"
    assert [c["rc"] for c in commands] == [0, 0, 1, 0, 0, 1], {c["cmd"]: c["stderr"][-2000:] for c in commands}
    out = {"4": commands[5]}
    # the planted op, its module and rank, as the doc says
    assert "Root cause: step 2, rank 1, module 0, aten._to_copy.default [fwd, call 0] (extra op)" in out["4"]["stdout"]
    # our own source line: where samples/common/op_faults.py casts to bfloat16
    src = open(os.path.join(REPO, "samples", "common", "op_faults.py")).read().splitlines()
    cast = next(i for i, line in enumerate(src, 1) if "self.bias.to(torch.bfloat16)" in line)
    assert f"source: samples/common/op_faults.py:{cast}" in out["4"]["stdout"]


def test_replayed_traced_step_is_recorded_from_the_reference_state(locate):
    """Command 3 (--replay-from REF --replay-steps 2:2 --trace ops): each rank's store holds the
    trace of step 2, and says step 2 started from REF's state."""
    runs, _, _ = locate
    store = open_store(os.path.join(runs, "cand-trace"))
    for r in (0, 1):
        rank = store.rank(r).group
        assert trace_steps(rank, "ops") == [2]
        assert rank.attrs["replay"]["replayed_steps"] == [2]
        assert {e.phase for e in read_events(rank, "ops", 2)} == {"fwd", "bwd", "opt"}


def test_clean_replay_names_no_root_cause(locate):
    """A candidate whose rank 1 left the reference in step 1 (its gradients scaled), replayed at
    step 2 from the reference: the step-level diff fails at step 1 only, and the traced step 2 is
    the reference's, bit for bit on every rank, so no op is named."""
    runs, _, clean = locate
    out = {"clean": clean}
    assert out["clean"]["rc"] == 1, out["clean"]["stderr"][-3000:]
    report = json.loads(open(os.path.join(runs, "clean.json")).read())
    assert report["first_divergence"]["step"] == 1 and report["summary_line"].endswith("first_step=1")
    assert "Root cause:" not in out["clean"]["stdout"] and "no root cause" in out["clean"]["stdout"]
    assert report["root_cause"] is None
    assert sorted((t["step"], t["rank"]) for t in report["traces"]) == [(2, 0), (2, 1)]
    assert all(t["matched"] > 0 and not t["extra"] and not t["missing"] for t in report["traces"])
    ref, cand = os.path.join(runs, "ref-trace"), os.path.join(runs, "clean-replay")
    ds = tracekit.open_diff(ref, cand)
    for r in (0, 1):
        ev = ds.tracekit.events(rank=r, step=2)
        # suspect: a collective whose inputs match and whose output no reader saw land (read in flight)
        assert set(ev.status.values) <= {"ok", "unknown", "suspect"} and (ev.status == "ok").sum() > 0
        # what the diff vouches for matches exactly (unknown: memory the trace cannot vouch for,
        # e.g. `empty` buffers, read before they are written)
        assert float(ev.max_stat_abs_err.where(ev.status == "ok").max()) == 0.0
        # the step-level tensors the chain ends at (the update's parameters, the gradients) are
        # bitwise the reference's
        named = [{(t.name, t.hash) for e in read_events(open_store(s).rank(r).group, "ops", 2)
                  for t in e.outputs if t.name} for s in (ref, cand)]
        assert len(named[0]) >= 4 and named[0] == named[1]
