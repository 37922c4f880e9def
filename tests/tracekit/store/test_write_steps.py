"""RankWriter.write_steps: several steps at once (the writer process stores the steps it held back so)
leave the store byte for byte as write() and complete_step() step by step do, in every format."""

import errno
import json

import numpy as np
import pytest

from tracekit import StoreError, open_store
from tracekit.store import RankWriter, TensorData, create_store
from tracekit.store.format import FORMAT_VERSION
from tests.files import folder_bytes

TIMES = ("start_time", "end_time")  # when the rank's group was opened and closed: not the same in two runs


def _steps(n: int):
    """(step, {kind: tensors}, complete): step 0 holds the initial parameters only; the last step is
    incomplete (a rank that died in it); a large tensor and small ones (format 3 packs the small)."""
    rng = np.random.default_rng(0)
    out = []
    for s in range(n + 1):
        kinds = {"parameters": [TensorData("big", "float32", (64, 64), rng.standard_normal((64, 64)).astype(np.float32)),
                                TensorData("small", "float32", (3,), rng.standard_normal(3).astype(np.float32))]}
        if s:
            kinds["loss"] = [TensorData("loss", "float32", (), np.array(1.0 / s, dtype=np.float32))]
            kinds["gradients"] = [TensorData("big", "float32", (64, 64), np.full((64, 64), s, np.float32))]
        out.append((s, kinds, 0 < s < n))
    return out


def _record(path: str, version: int, batched: bool) -> dict[str, bytes]:
    create_store(path, {"command": ["test"]}, format_version=version)
    writer = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    steps = _steps(5)
    if batched:
        writer.write_steps(steps[:2])  # in two calls: a batch after the rows already stored
        writer.write_steps(steps[2:])
    else:
        for step, kinds, complete in steps:
            for kind, tensors in kinds.items():
                writer.write(step, kind, tensors)
            if complete:
                writer.complete_step(step)
    writer.close()
    files = folder_bytes(path)
    group = json.loads(files.pop("rank_0/zarr.json"))
    for key in TIMES:
        group["attributes"].pop(key)
    files["rank_0/zarr.json"] = json.dumps(group, sort_keys=True).encode()
    files.pop("zarr.json")  # the root: the store's own creation time
    return files


@pytest.mark.parametrize("version", sorted({1, 2, 3, FORMAT_VERSION}))
def test_write_steps_stores_what_step_by_step_writes_store(tmp_path, version):
    one_by_one = _record(str(tmp_path / "a"), version, batched=False)
    together = _record(str(tmp_path / "b"), version, batched=True)
    assert sorted(together) == sorted(one_by_one)
    assert together == one_by_one
    view = open_store(str(tmp_path / "b")).rank(0)
    assert view.completed_steps == [1, 2, 3, 4]  # step 5 was written, never completed
    assert view.steps("parameters") == [0, 1, 2, 3, 4]  # (step 5's row is there, not listed: not complete)
    assert float(view.read("loss", 4, "loss")) == np.float32(0.25)


@pytest.mark.parametrize("version", sorted({1, 2, FORMAT_VERSION}))
def test_a_step_that_fails_in_a_batch_keeps_the_steps_before_it(tmp_path, version):
    """As step by step: the steps before the failing one are stored and complete, then the error."""
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]}, format_version=version)
    writer = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    steps = _steps(5)
    bad = steps[3][1]["gradients"][0]
    steps[3][1]["gradients"] = [TensorData("big", "float32", (32, 64), bad.data[:32])]  # its shape changed
    with pytest.raises(StoreError, match="tensors changed between steps"):
        writer.write_steps(steps)
    writer.close(status="failed")
    view = open_store(path).rank(0)
    assert view.completed_steps == [1, 2]
    assert view.steps("gradients") == [1, 2] and float(view.read("loss", 2, "loss")) == np.float32(0.5)


@pytest.mark.parametrize("version", sorted({2, 3, FORMAT_VERSION}))
def test_a_full_disk_mid_batch_keeps_the_steps_before_it_and_no_row_names_a_missing_object(tmp_path, monkeypatch, version):
    """An object write that fails (from the object queue's thread): the steps before its step are
    stored and complete, the store verifies, and the error is raised once no write is in flight."""
    from tracekit.store.local_bytes import LocalBytes
    from tracekit.store.verify import verify_store

    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]}, format_version=version)
    writer = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    step_3_gradients = np.full((64, 64), 3, np.float32).tobytes()
    real = LocalBytes.write_objects
    calls = {"started": 0, "ended": 0}

    def write_objects(self, items, direct=None):
        calls["started"] += 1
        try:
            if any(b"".join(bytes(p) for p in parts) == step_3_gradients for _, parts in items):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(self, items, direct)
        finally:
            calls["ended"] += 1

    monkeypatch.setattr(LocalBytes, "write_objects", write_objects)
    with pytest.raises(OSError, match="No space left"):
        writer.write_steps(_steps(5))
    assert calls["started"] == calls["ended"]
    writer.close(status="failed")
    view = open_store(path).rank(0)
    assert view.completed_steps == [1, 2]
    assert 3 not in view.steps("gradients")
    assert float(view.read("gradients", 2, "big")[0, 0]) == 2.0
    assert verify_store(path).ok
