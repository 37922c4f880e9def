"""docs/LOCATE.md beyond what every doc block gets (tests/e2e/docs/test_doc_commands.py runs its block
and compares the outputs it shows): the root cause and source line it names, what the replayed
trace holds, and a clean replay of a traced step after a step that left the reference, which names
no root cause there. The block's results come from the same run of the block (doc_runs.run_group);
the clean replay is step 2 of the root-cause matrix's ddp candidate (no launch of its own)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main

from tests.e2e.samples.test_root_cause_matrix import OFF_SINCE_STEP_1, matrix_runs
from tests.paths import REPO
from tests.docs.doc_runs import run_group
from tracekit.store import open_store
from tracekit.store.traces import read_events, trace_steps

# samples/plain, as tests/e2e/cli/test_trace_cli.py records it: the doc's traced reference is that test's
# (conftest's recorded_sample, one launch for both)
T = "torchrun --standalone --nproc-per-node=2 samples/plain/train.py --parallelism ddp --steps 3"


@pytest.fixture(scope="module")
def locate(recorded_sample, shared_once):
    folder, result = run_group("locate", recorded_sample, shared_once)
    assert T in open(os.path.join(REPO, "docs", "LOCATE.md")).read(), "the doc's T changed: update T here"
    return os.path.join(folder, "runs", "locate"), result["ran"][0]["commands"]


@pytest.fixture(scope="module")
def clean(recorded_sample, tmp_path_factory):
    """The root-cause matrix's ddp pair (a traced reference; a candidate replayed from it from step 2
    on, rank 1 off the reference since step 1, the model clean until step 3) and `tracekit diff` of it."""
    assert OFF_SINCE_STEP_1 == "grad_scale=1:1:1.01"  # what docs/LOCATE.md says the candidate does in step 1
    ref, cand = matrix_runs(recorded_sample, "ddp")
    out = tmp_path_factory.mktemp("clean") / "clean.json"
    result = CliRunner().invoke(main, ["diff", ref, cand, "--json-file", str(out)])
    return ref, cand, result, json.loads(out.read_text())


def test_locate_doc_commands_show_what_the_doc_shows(locate):
    runs, commands = locate
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
    runs, _ = locate
    store = open_store(os.path.join(runs, "cand-trace"))
    for r in (0, 1):
        rank = store.rank(r).group
        assert trace_steps(rank, "ops") == [2]
        assert rank.attrs["replay"]["replayed_steps"] == [2]
        assert {e.phase for e in read_events(rank, "ops", 2)} == {"fwd", "bwd", "opt"}


def test_clean_replay_names_no_root_cause(clean):
    """A candidate whose rank 1 left the reference in step 1 (its gradients scaled), replayed from
    the reference from step 2 on: the step-level diff fails from step 1, and the traced step 2 is
    the reference's, bit for bit on every rank, so no op is named there. (The candidate's planted
    faults start at step 3: what the diff names is theirs, tests/e2e/samples/test_root_cause_matrix.py.)"""
    ref, cand, result, report = clean
    assert result.exit_code == 1, result.output[-3000:]
    assert report["first_divergence"]["step"] == 1 and report["summary_line"].endswith("first_step=1")
    assert report["root_cause"]["step"] > 2, report["root_cause"]
    step2 = sorted((t for t in report["traces"] if t["step"] == 2), key=lambda t: t["rank"])
    assert [t["rank"] for t in step2] == [0, 1]
    assert all(t["root_cause"] is None for t in step2), [t["root_cause"] for t in step2]
    assert all(t["matched"] > 0 and not t["extra"] and not t["missing"] for t in step2)
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
