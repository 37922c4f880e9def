"""Closing a store: the launcher's last word in the root metadata (tracekit/store/finalize.py)."""

import json
import os

import numpy as np

from tracekit import open_store
from tracekit.store.finalize import mark_writers_outlived
from tracekit.testing import write_store


def test_writers_outliving_the_launcher_are_noted_unindented_and_atomically(tmp_path):
    path = write_store(str(tmp_path / "s"), {0: {1: {"loss": {"loss": np.float32(0.5)}}}},
                       meta={"launcher": "tracekit record"})
    with open(os.path.join(path, "zarr.json"), "rb") as f:
        before = json.load(f)
    mark_writers_outlived(path, 3)
    with open(os.path.join(path, "zarr.json"), "rb") as f:
        raw = f.read()
    assert b"\n" not in raw  # as zarr writes the store's other documents (io.compact_metadata)
    after = json.loads(raw)
    noted = after["attributes"]["tracekit"].pop("writers_outlived_launcher")
    assert noted["command_exit_status"] == 3 and after == before  # nothing else changed
    assert open_store(path).job_state == "launcher died"
    assert not [n for n in os.listdir(path) if n.endswith((".tmp", ".partial"))]  # no temporary left


def test_a_killed_writers_unwritten_steps_and_its_ranks_own_status_are_kept(tmp_path):
    """The launcher killed rank 0's writer at --flush-timeout, after it stored steps 1-2 (and began
    step 2's removal from its spool): finalization lists the steps left in the spool less the ones
    stored, with the cause, and keeps the status the rank noted (finished, not `died`)."""
    from tracekit.store import RankWriter, TensorData, create_store, finalize_store

    path = str(tmp_path / "s")
    create_store(path, {"launcher": "tracekit record"})
    writer = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    for step in (1, 2):
        value = np.full(3, step, dtype=np.float32)
        writer.write(step, "parameters", [TensorData("w", "float32", value.shape, value)])
        writer.complete_step(step)
    # the writer is killed here: its rank group still says `running`
    loss = {"unwritten_steps": [2, 3, 4], "unwritten_cause": "its writer process was killed",
            "status": "finished", "cause": None}
    summary = finalize_store(path, 0, {}, {0: loss})
    assert summary["ranks"]["0"]["unwritten_steps"] == [3, 4]
    rank = open_store(path).rank(0)
    assert rank.status == "finished" and rank.completed_steps == [1, 2]
    assert rank.unwritten_steps == [3, 4] and rank.unwritten_cause == "its writer process was killed"
    # without the rank's note, the launcher's usual word: it never closed its recording
    path2 = str(tmp_path / "t")
    create_store(path2, {"launcher": "tracekit record"})
    RankWriter(path2, 0, {"coords": {"rank": 0, "world_size": 1}})
    finalize_store(path2, 0, {}, {0: {**loss, "status": None}})
    assert open_store(path2).rank(0).status == "died"
