"""The group the launcher makes for a rank whose writer ended before it made one
(tracekit/store/lost_ranks.py)."""

import numpy as np
import pytest

from tracekit import open_store
from tracekit.errors import StoreError
from tracekit.store import RankWriter, TensorData, create_store, finalize_store
from tracekit.store.lost_ranks import make_lost_rank_group

ATTRS = {"coords": {"rank": 1, "world_size": 2}}


def test_a_lost_ranks_group_is_listed_with_its_unwritten_steps_and_how_it_ended(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"launcher": "tracekit record"})
    stored = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 2}})
    stored.write(1, "parameters", [TensorData("w", "float32", (3,), np.ones(3, np.float32))])
    stored.complete_step(1)
    stored.close()
    assert make_lost_rank_group(path, 1, ATTRS) is True
    loss = {"unwritten_steps": [1, 2], "unwritten_cause": "its writer process ended without storing them",
            "status": "finished", "cause": None}
    summary = finalize_store(path, 0, {}, {1: loss})
    assert summary["ranks"]["1"]["unwritten_steps"] == [1, 2]
    rank = open_store(path).rank(1)
    assert rank.completed_steps == [] and rank.status == "finished"  # the rank's own note
    assert rank.coords["world_size"] == 2  # the attributes its rank wrote for its writer
    assert rank.unwritten_cause == loss["unwritten_cause"]


def test_a_rank_with_a_group_already_keeps_it(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"launcher": "tracekit record"})
    writer = RankWriter(path, 1, ATTRS)
    writer.write(1, "parameters", [TensorData("w", "float32", (3,), np.ones(3, np.float32))])
    writer.complete_step(1)
    assert make_lost_rank_group(path, 1, {"coords": {"rank": 1, "world_size": 9}}) is False
    writer.close()
    rank = open_store(path).rank(1)
    assert rank.completed_steps == [1] and rank.coords["world_size"] == 2


def test_a_store_of_another_job_refuses_it(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"launcher": "tracekit record", "run_id": "job-a"})
    with pytest.raises(StoreError):
        make_lost_rank_group(path, 1, ATTRS, run_id="job-b")
    assert open_store(path).ranks == []
