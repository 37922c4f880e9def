"""Group commit (RankWriter.write/complete_step with stage=True, then commit()): a writer process
that finds several spooled steps waiting stores their bytes, then lists them all at once. The
store it leaves must be the store one commit per step leaves, byte for byte, and a reader must
never see a step complete before all of its rows are listed."""

import os
import re

import numpy as np
import pytest

from tracekit import open_store
from tracekit.store import RankWriter, TensorData, create_store
from tracekit.store import nodemeta

STEPS = 7
TIME = re.compile(rb'"(start_time|end_time)": "[^"]*"')


def _tensors(step: int, rank: int) -> dict[str, list[TensorData]]:
    """Several kinds, a large tensor (its own object) and small ones (packed), one frozen between steps."""
    rng = np.random.default_rng(step * 10 + rank)
    big = rng.standard_normal(300_000).astype(np.float32)  # over a pack's size: its own object
    return {
        "parameters": [TensorData("w", "float32", (3, 4), rng.standard_normal((3, 4)).astype(np.float32)),
                       TensorData("big", "float32", (300_000,), big),
                       TensorData("frozen", "float32", (5,), np.arange(5, dtype=np.float32))],
        "gradients": [TensorData("w", "float32", (3, 4), rng.standard_normal((3, 4)).astype(np.float32))],
        "loss": [TensorData("loss", "float32", (), np.array(1.0 / step, dtype=np.float32))],
    }


def _record(path, groups: list[list[int]], rank: int = 0) -> str:
    """One rank's steps written in `groups`: a group of one is written as the writer always did
    (stage=False), a larger one staged step by step and then committed at once."""
    if rank == 0:
        create_store(path, {"command": ["test"]})
    w = RankWriter(path, rank, {"coords": {"rank": rank, "world_size": 1}})
    for group in groups:
        stage = len(group) > 1
        for step in group:
            for kind, tensors in _tensors(step, rank).items():
                w.write(step, kind, tensors, stage=stage)
            w.complete_step(step, stage=stage)
        if stage:
            w.commit()
    w.update_attrs(extra={"note": "x"})
    w.close()
    return path


def _files(path) -> dict[str, bytes]:
    """Every file below the store, its bytes; the start and end times (they differ between runs) blanked."""
    out = {}
    for folder, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                raw = f.read()
            out[os.path.relpath(os.path.join(folder, name), path)] = TIME.sub(rb'"\1": ""', raw) if name == "zarr.json" else raw
    return out


@pytest.mark.parametrize("groups", [
    [list(range(1, STEPS + 1))],                 # the whole run as one group (a writer draining at the end)
    [[1], [2, 3, 4], [5], [6, 7]],               # groups and single steps mixed, as a backlog comes and goes
])
def test_a_group_commit_leaves_the_bytes_of_one_commit_per_step(tmp_path, groups):
    single = _files(_record(str(tmp_path / "single"), [[s] for s in range(1, STEPS + 1)]))
    grouped = _files(_record(str(tmp_path / "grouped"), groups))
    assert sorted(grouped) == sorted(single)
    different = [name for name in single if grouped[name] != single[name]]
    assert different == []
    assert any(name.endswith("zarr.json") and b'"completed_steps": [1, 2, 3, 4, 5, 6, 7]' in raw
               for name, raw in grouped.items())  # the comparison saw the rank's document


def test_a_group_commit_rewrites_each_document_once(tmp_path, monkeypatch):
    """What the group commit is for: the metadata documents are rewritten once per group, not per step."""
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    for step in (1, 2):  # the kinds' creation and a first row, one commit each
        for kind, tensors in _tensors(step, 0).items():
            w.write(step, kind, tensors)
        w.complete_step(step)
    writes = []
    real = nodemeta.NodeMeta._write
    monkeypatch.setattr(nodemeta.NodeMeta, "_write", lambda self: (writes.append(self.file), real(self))[1])
    for step in range(3, 3 + 5):
        for kind, tensors in _tensors(step, 0).items():
            w.write(step, kind, tensors, stage=True)
        w.complete_step(step, stage=True)
    assert writes == []  # nothing listed while staged
    w.commit()
    # per kind: three index arrays resized and the steps list; then the rank's completed steps
    assert len(writes) == len(set(writes)) == 3 * 4 + 1
    w.close()
    assert open_store(path).rank(0).completed_steps == list(range(1, 8))


def test_staged_steps_are_not_seen_until_they_are_committed(tmp_path):
    """A reader of the live store sees whole steps only: a staged step is neither complete nor in any
    kind's steps, and after the commit every staged step is both."""
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    for kind, tensors in _tensors(1, 0).items():
        w.write(1, kind, tensors)
    w.complete_step(1)
    for step in (2, 3):
        for kind, tensors in _tensors(step, 0).items():
            w.write(step, kind, tensors, stage=True)
        w.complete_step(step, stage=True)
    live = open_store(path).rank(0)
    assert live.completed_steps == [1]
    assert {kind: live.steps(kind) for kind in ("parameters", "gradients", "loss")} == {k: [1] for k in ("parameters", "gradients", "loss")}
    w.commit()
    live = open_store(path).rank(0)
    assert live.completed_steps == [1, 2, 3]
    assert live.steps("parameters") == [1, 2, 3]
    np.testing.assert_array_equal(live.read("parameters", 3, "big").reshape(-1),
                                  _tensors(3, 0)["parameters"][1].data)
    w.close()


def test_a_step_that_failed_half_way_is_dropped_and_the_whole_ones_before_it_kept(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    for step in (1, 2):
        for kind, tensors in _tensors(step, 0).items():
            w.write(step, kind, tensors, stage=True)
        w.complete_step(step, stage=True)
    w.write(3, "parameters", _tensors(3, 0)["parameters"], stage=True)  # then the entry fails
    w.drop_staged(3)
    w.commit()
    w.close(status="failed", cause="test")
    rank = open_store(path).rank(0)
    assert rank.completed_steps == [1, 2]
    assert rank.steps("parameters") == [1, 2]
