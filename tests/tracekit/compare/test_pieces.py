"""The diff of sharded tensors (format 2) region by region: the same report whether the regions
come from pieces (shared layout) or from a whole tensor, and one piece per side in memory."""

import math
import tracemalloc

import numpy as np
import pytest

import tracekit
from tracekit.compare.metrics import compare_arrays
from tracekit.store import RankWriter, TensorData, create_store
from tracekit.store.shards import Shard
from tracekit.testing import index_chunk

RANKS = 2


def _cut(n: int, parts: int) -> list[tuple[int, int]]:
    per = -(-n // parts)  # torch.chunk style, as DTensor Shard(d)
    return [(min(n, p * per), min(n, p * per) + max(0, min(per, n - p * per))) for p in range(parts)]


def _piece(name, arr, rank, dim, cuts):
    lo, hi = cuts[rank]
    index = [slice(None)] * arr.ndim
    index[dim] = slice(lo, hi)
    part = np.ascontiguousarray(arr[tuple(index)])
    offset = tuple(lo if d == dim else 0 for d in range(arr.ndim))
    return TensorData(name, str(arr.dtype), part.shape, part, Shard(arr.shape, offset, part.shape, tuple(range(RANKS))))


def _write(path, tensors, layout):
    """layout[name]: None (every rank writes it whole) or (dim, cuts) (rank r writes cut r along dim)."""
    create_store(path, {"command": ["test"]}, format_version=2)
    for r in range(RANKS):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": RANKS}})
        w.write(1, "parameters", [
            TensorData(n, str(a.dtype), a.shape, a) if layout.get(n) is None else _piece(n, a, r, *layout[n])
            for n, a in tensors.items()])
        w.complete_step(1)
        w.close()
    return path


def _data(seed, nan=False):
    rng = np.random.default_rng(seed)
    out = {"w": rng.standard_normal((7, 5)).astype(np.float32),  # rows cut 4 + 3
           "c": rng.standard_normal((3, 6)).astype(np.float32),  # columns cut: pieces not consecutive in flat order
           "big": rng.standard_normal((64, 33)).astype(np.float32)}
    for a in out.values():
        a.flat[5] = a.flat[12] = 1.0  # _cand moves both by exactly 2
    if nan:
        out["w"][5, 1] = np.nan  # in rank 1's piece, on both sides (a violation without equal_nan)
    return out


def _cand(ref):
    out = {}
    for i, (n, a) in enumerate(ref.items()):
        b = a.copy()
        b.flat[::3] += np.float32(1e-3) * (i + 1)
        # two violations of exactly the same size; in "c" (cut by columns) the one at the lower
        # flat index, (0, 5), lies in the second piece: it is the worst element all the same
        b.flat[5] = b.flat[12] = 3.0
        out[n] = b
    return out


SHARDED = {"w": (0, _cut(7, 2)), "c": (1, _cut(6, 2)), "big": (0, _cut(64, 2))}
OTHER = {"w": (0, [(0, 3), (3, 7)]), "c": (1, [(0, 2), (2, 6)]), "big": (1, _cut(33, 2))}


def _results(report):
    return {(r.rank, r.tensor): r.metrics.to_dict() for r in report.results}


@pytest.mark.parametrize("nan", [False, True])
def test_shared_layout_gives_the_report_of_the_whole_tensor_path(tmp_path, nan):
    ref = _data(0, nan)
    cand = _cand(ref)
    if nan:
        cand["c"][2, 4] = cand["c"][1, 0] = np.inf  # in the second piece, then the first: (1, 0) is first
    shared = tracekit.diff(_write(str(tmp_path / "r"), ref, SHARDED), _write(str(tmp_path / "c"), cand, SHARDED),
                           details="all")
    # the candidate gathered (written whole by every rank), or sharded another way: the
    # regions are cut out of its whole tensor instead of read from matching pieces
    whole = tracekit.diff(str(tmp_path / "r"), _write(str(tmp_path / "g"), cand, {}), details="all")
    other = tracekit.diff(str(tmp_path / "r"), _write(str(tmp_path / "o"), cand, OTHER), details="all")
    assert not shared.passed
    assert _results(shared) == _results(whole) == _results(other)
    assert [s.__dict__ for s in shared.summary] == [s.__dict__ for s in whole.summary] == [s.__dict__ for s in other.summary]
    # and the flat comparison of the assembled tensors: the same counts, maxima and worst element
    # (index included); the sums behind rel L2 and cosine add the same terms in another order
    for (rank, name), got in _results(shared).items():
        flat = compare_arrays(ref[name], cand[name], rtol=got["rtol"], atol=got["atol"], rel_l2=got["rel_l2"]).to_dict()
        for key in ("rel_l2_err", "cosine", "margin"):
            a, b = got.pop(key), flat.pop(key)
            assert a == b or math.isclose(a, b, rel_tol=1e-5)
        assert got == flat, (rank, name)
    w = next(r for r in shared.results if r.tensor == "c").metrics
    if nan:
        assert w.nonfinite == 2 and w.worst.index == (1, 0)
        assert next(r for r in shared.results if r.tensor == "w").metrics.counts.ref_nan == 1
    else:
        assert w.worst.index == (0, 5) and w.worst.abs_err == 2.0


def test_a_region_shared_by_rank_pairs_is_read_once(tmp_path, monkeypatch):
    ref = _data(1)
    r, c = _write(str(tmp_path / "r"), ref, SHARDED), _write(str(tmp_path / "c"), _cand(ref), SHARDED)
    from tracekit.compare import pieces

    reads = []
    original = pieces.PieceReader

    def counted(kind, step, piece, **options):
        reads.append(piece.digest)
        return original(kind, step, piece, **options)

    monkeypatch.setattr(pieces, "PieceReader", counted)
    report = tracekit.diff(r, c, details="all")
    assert {x.rank for x in report.results} == {0, 1}  # both ranks report every tensor
    assert len(reads) == len(set(reads)) == 2 * 2 * len(SHARDED)  # each piece of each side once


def test_shared_layout_holds_one_piece_per_side(tmp_path):
    """A 32 MiB tensor in 16 pieces of 2 MiB: with the layout shared the diff's allocations stay
    below half of one side's whole tensor; with another layout they hold one whole tensor, not two."""
    global RANKS
    rows, cols, parts = 2048, 4096, 16
    rng = np.random.default_rng(3)
    ref = {"huge": rng.standard_normal((rows, cols), dtype=np.float32)}
    cand = {"huge": ref["huge"] + np.float32(1e-3)}
    saved, RANKS = RANKS, parts
    try:
        layout = {"huge": (0, _cut(rows, parts))}
        r, c = _write(str(tmp_path / "r"), ref, layout), _write(str(tmp_path / "c"), cand, layout)
        g = _write(str(tmp_path / "g"), cand, {})
    finally:
        RANKS = saved
    whole = ref["huge"].nbytes
    del ref, cand
    peaks = {}
    for name, other in (("shared", c), ("gathered", g)):
        tracemalloc.start()
        report = tracekit.diff(r, other, jobs=1, kinds=["parameters"], allow_missing=True)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert [(s.tensors, s.ranks, s.comparisons) for s in report.summary] == [(1, parts, parts)]
    # shared layout: a piece per side (2 MiB each) plus the metrics' block buffers and
    # temporaries (~7 MiB here, whatever the tensor size)
    assert peaks["shared"] < whole / 2, peaks
    # another layout: the candidate whole, once (the reference still piece by piece), per worker
    assert whole <= peaks["gathered"] < whole * 1.5, peaks


@pytest.mark.parametrize("lie", ["finite flag", "flipped bit"])
@pytest.mark.parametrize("sharded", [True, False])
def test_streamed_objects_are_checked_before_their_metrics_count(tmp_path, lie, sharded):
    """Region by region, each object is hashed as it streams past and its finiteness is taken from
    the metrics' NaN/Inf counts: a flag calling NaN data finite, or a flipped bit, in a tensor
    that differs (so it is compared, not decided by hash) is a damaged store, never a result."""
    import os

    from tracekit.errors import StoreError
    from tracekit.store import open_store
    from tracekit.store.format import FINITE_ARRAY, object_key

    ref = _data(4, nan=True)  # "w" holds a NaN in rank 1's piece (row 5)
    layout = SHARDED if sharded else {}
    r, c = _write(str(tmp_path / "r"), ref, layout), _write(str(tmp_path / "c"), _cand(ref), layout)
    view = open_store(r).rank(1)
    if lie == "finite flag":
        chunk = index_chunk(r, 1, "parameters", FINITE_ARRAY, 0)
        raw = bytearray(open(chunk, "rb").read())
        raw[view.position("parameters", "w")] = 1  # "all finite"
        open(chunk, "wb").write(bytes(raw))
    else:
        digest = (view.pieces("parameters", 1, "w")[1] if sharded else view.saved_pieces("parameters", 1, "w")[0]).digest
        with open(os.path.join(r, object_key(digest)), "r+b") as f:
            f.seek(4)
            b = f.read(1)[0]
            f.seek(4)
            f.write(bytes([b ^ 0x01]))
    # the flag is rank 1's entry, the sharded piece rank 1's; an unsharded w is one object that
    # both ranks' entries name, reported through whichever reads it
    rank = "1" if lie == "finite flag" or sharded else "[01]"
    with pytest.raises(StoreError, match=rf"^damaged store: .*rank {rank} parameters step 1 tensor w"):
        tracekit.diff(r, c)


def test_equal_replicas_in_packs_that_differ_are_each_verified(tmp_path):
    """DDP replicas after a one-rank fault: tensor "a" is equal on both ranks, "b" is not, so each
    rank packs "a" beside a different "b" and its equal bytes lie in two packs. Each rank pair
    reads and verifies its own pack (the diff raised `check_entries before the region's objects
    were read` when the second pair reused the first's comparison)."""
    from tracekit.testing import tensor_bytes, write_store

    rng = np.random.default_rng(3)
    a = rng.standard_normal(16).astype(np.float32)
    b = [rng.standard_normal(16).astype(np.float32) for _ in range(RANKS)]

    def store(name, scale):
        return write_store(str(tmp_path / name), {r: {1: {"deltas": {"a": a * np.float32(scale), "b": b[r]}}}
                                                  for r in range(RANKS)})

    ref, cand = store("r", 1.0), store("c", 1.5)
    assert tensor_bytes(cand, 0, "deltas", 1, "a")[0] != tensor_bytes(cand, 1, "deltas", 1, "a")[0]  # two packs
    report = tracekit.diff(ref, cand, kinds=["deltas"], tol={"deltas": (1e-3, 0)})
    assert {(r.rank, r.tensor) for r in report.violations} == {(0, "a"), (1, "a")}
    # the second rank's pack is read too: damage there is found, not hidden behind rank 0's copy
    path, base, length = tensor_bytes(cand, 1, "deltas", 1, "a")
    with open(path, "r+b") as f:
        f.seek(base)
        f.write(b"\x00" * 4)
    with pytest.raises(tracekit.StoreError, match="damaged store"):
        tracekit.diff(ref, cand, kinds=["deltas"])
