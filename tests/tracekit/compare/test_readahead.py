"""The diff's read-ahead (compare/readahead.py): hints given in order, within the byte budget, and
a diff of stores on disk hints exactly the files it then reads."""

import os

import numpy as np
import pytest

import tracekit
from tracekit.compare.readahead import Readahead
from tracekit.store import RankWriter, TensorData, create_store


def _ahead(budget, sizes):
    got = []
    ra = Readahead(budget)
    for i, n in enumerate(sizes):
        ra.add(i, n, lambda i=i: got.append(i))
    return ra, got


def test_hints_follow_the_running_comparison_within_the_budget():
    ra, got = _ahead(100, [40, 40, 40, 40, 40])
    ra.started(0)  # 0 reads for itself; 1, 2 and 3 hinted (80 < 100, then 120: the budget is reached)
    assert got == [1, 2, 3]
    ra.started(1)  # 80 ahead: below the budget, the next one goes
    assert got == [1, 2, 3, 4]
    ra.started(2)
    ra.started(3)
    ra.started(4)
    assert got == [1, 2, 3, 4]  # each hinted once


def test_a_comparison_that_starts_before_its_hint_is_not_hinted():
    ra, got = _ahead(10, [50, 50, 50])
    ra.started(0)
    assert got == [1]
    ra.started(2)  # ran early (another worker): its own reads need no hint
    ra.started(1)
    assert got == [1]


def test_a_failing_hint_does_not_fail_the_comparison():
    ra = Readahead(10)
    ra.add("a", 1, lambda: 1 / 0)
    ra.add("b", 1, lambda: None)
    assert ra.run("first", lambda x: x + 1, 1) == 2  # "a" hinted and failed quietly


def test_adding_a_token_twice_keeps_one():
    ra, got = _ahead(1000, [1, 1])
    ra.add(1, 1, lambda: got.append("again"))
    ra.started(0)
    assert got == [1]


def _store(path, seed, ranks=2, steps=3, tensors=3, noise=0.0, format_version=2):
    create_store(str(path), {"mode": "ddp"}, format_version=format_version)
    for r in range(ranks):
        w = RankWriter(str(path), r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r}})
        for s in range(1, steps + 1):
            rows = []
            for t in range(tensors):
                x = np.random.default_rng([r, s, t]).standard_normal(5000).astype(np.float32)
                if noise:
                    x = x * np.float32(1 + noise)
                rows.append(TensorData(f"w{t}", "float32", x.shape, x))
            w.write(s, "parameters", rows)
            w.complete_step(s)
        w.close()
    return str(path)


def _objects(path):
    out = set()
    for d, _, fs in os.walk(path):
        for f in fs:
            p = os.path.realpath(os.path.join(d, f))
            if "objects" in p.split(os.sep) and f != "zarr.json":
                out.add(p)
    return out


@pytest.fixture
def hinted(monkeypatch):
    """The files given a WILLNEED hint, in order."""
    seen = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            seen.append(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    return seen


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_diff_hints_every_object_it_reads(tmp_path, hinted):
    ref = _store(tmp_path / "ref", 0)
    cand = _store(tmp_path / "cand", 0, noise=1e-7)
    report = tracekit.diff(ref, cand, jobs=2)
    assert report.bytes_compared > 0
    objects = _objects(ref) | _objects(cand)
    assert len(objects) == 2 * 2 * 3 * 3  # every tensor its own bytes: nothing decided by hash
    assert set(hinted) == objects
    assert len(hinted) <= 2 * len(objects)  # each by the read-ahead or its own reader, not more


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_packed_tensor_is_hinted_its_own_bytes_not_its_whole_pack(tmp_path, monkeypatch):
    """Format 3 packs a row's small tensors into one file: each is hinted its range of it (the
    kernel walks every page hinted; whole-pack hints per member cost a diff ~30% of its time)."""
    ref = _store(tmp_path / "ref", 0, format_version=3)
    cand = _store(tmp_path / "cand", 0, noise=1e-7, format_version=3)
    hints = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            hints.append((os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")), offset, length))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    report = tracekit.diff(ref, cand, jobs=2)
    assert report.bytes_compared == 2 * 2 * 3 * 3 * 5000 * 4
    packs = _objects(ref) | _objects(cand)
    assert len(packs) == 2 * 2 * 3  # a pack per side, rank and step, of its 3 tensors
    assert {path for path, _, _ in hints} == packs
    member = 5000 * 4
    assert all(length == member and offset % member == 0 for _, offset, length in hints)  # one tensor each
    assert len(set(hints)) == 2 * 2 * 3 * 3  # every tensor of every pack


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_identical_stores_hint_nothing(tmp_path, monkeypatch):
    ref = _store(tmp_path / "ref", 0)
    same = _store(tmp_path / "same", 0)
    hinted = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: hinted.append(a))
    report = tracekit.diff(ref, same)
    assert report.passed and report.bytes_compared == 0
    assert hinted == []  # decided by hash: nothing to read


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_format_1_diff_hints_the_chunk_files_it_reads(tmp_path, hinted):
    def v1(path, noise):
        create_store(str(path), {"mode": "ddp"}, format_version=1)
        w = RankWriter(str(path), 0, {"coords": {"rank": 0, "world_size": 1}})
        for s in (1, 2):
            x = np.random.default_rng(s).standard_normal(20000).astype(np.float32) * np.float32(1 + noise)
            w.write(s, "parameters", [TensorData("w", "float32", x.shape, x)])
            w.complete_step(s)
        w.close()
        return str(path)

    ref, cand = v1(tmp_path / "ref", 0), v1(tmp_path / "cand", 1e-7)
    report = tracekit.diff(ref, cand)
    assert report.bytes_compared == 2 * 2 * 20000 * 4
    stores = (os.path.realpath(ref) + os.sep, os.path.realpath(cand) + os.sep)
    assert hinted and all(p.startswith(stores) for p in hinted)
    assert sum(os.path.getsize(p) for p in set(hinted)) >= report.bytes_compared  # the chunks it read


def test_a_step_planned_early_reports_its_problem_after_the_earlier_steps(tmp_path, monkeypatch):
    """The next step is planned while the current one is compared (to hint its reads); a problem
    planning it (a damaged index) must still come after the current step's own problem."""
    from tracekit.compare import engine, pieces
    from tracekit.errors import StoreError

    ref = _store(tmp_path / "ref", 0)
    cand = _store(tmp_path / "cand", 0, noise=1e-7)
    plans, compare = engine._Engine.sharded_plans, pieces.compare_shared_region

    def bad_plan(self, kp, step, skip):
        if step == 3:
            raise StoreError("planning step 3 failed")
        return plans(self, kp, step, skip)

    def bad_compare(tp, i, new_acc):
        if tp.step == 2:
            raise StoreError("comparing step 2 failed")
        return compare(tp, i, new_acc)

    monkeypatch.setattr(engine._Engine, "sharded_plans", bad_plan)
    monkeypatch.setattr(pieces, "compare_shared_region", bad_compare)
    with pytest.raises(StoreError, match="comparing step 2"):
        tracekit.diff(ref, cand, jobs=2)
    monkeypatch.setattr(pieces, "compare_shared_region", compare)
    with pytest.raises(StoreError, match="planning step 3"):
        tracekit.diff(ref, cand, jobs=2)
