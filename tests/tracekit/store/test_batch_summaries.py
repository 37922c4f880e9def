"""Small tensors are summarized together (store/batch_summaries.py), and their summaries are the
ones summarize() gives each alone, bit for bit: a store written with the batch holds the same
index rows as one written tensor by tensor."""

import numpy as np
import pytest

from tracekit.store import RankWriter, TensorData, create_store, open_store
from tracekit.store.batch_summaries import BATCHED, RowSummaries, summaries_of
from tracekit.store.summaries import summarize


def _parts(rng, dtype, lengths):
    # values over many magnitudes: sums that round, so a different order of addition shows (float16
    # overflows to Inf at some: those tensors are summarized alone)
    with np.errstate(over="ignore"):
        return [(rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 4)).astype(dtype) for n in lengths]


def _alone(parts, dtype):
    return np.stack([summarize(p, dtype) for p in parts])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("lengths", [[1] * 9, [7] * 30, [1048] * 50, [BATCHED - 1] * 3,
                                     [3, 3, 5, 5, 5, 700, 700, 9000, 1], [BATCHED] * 2 + [BATCHED + 1] * 2],
                         ids=["scalars", "7s", "1048s", "below-batched", "mixed", "not-batched"])
def test_the_batch_gives_each_tensor_the_summary_it_has_alone(dtype, lengths):
    parts = _parts(np.random.default_rng(len(lengths)), dtype, lengths)
    assert summaries_of(parts, dtype).tobytes() == _alone(parts, dtype).tobytes()


def test_nonfinite_zero_and_odd_dtypes_are_summarized_alone_and_still_equal():
    rng = np.random.default_rng(3)
    parts = _parts(rng, np.float32, [64] * 8)
    parts[0][5] = np.nan
    parts[1][:] = 0.0
    parts[2][3] = -np.inf
    parts[3][:] = -0.0
    parts[4][7] = np.inf
    with np.errstate(all="raise"):  # the batch hides no warning either
        got = summaries_of(parts, "float32")
    assert got.tobytes() == _alone(parts, "float32").tobytes()
    assert got[0, 4] == 1 and got[2, 6] == 1  # the NaN and the -Inf are counted
    bf16 = [(rng.standard_normal(100).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for _ in range(6)]
    assert summaries_of(bf16, "bfloat16").tobytes() == _alone(bf16, "bfloat16").tobytes()
    ints = [rng.integers(-9, 9, size=40).astype(np.int64) for _ in range(4)]
    assert summaries_of(ints, "int64").tobytes() == _alone(ints, "int64").tobytes()
    flags = [rng.integers(0, 2, size=40).astype(bool) for _ in range(4)]
    assert summaries_of(flags, "bool").tobytes() == _alone(flags, "bool").tobytes()


def test_row_summaries_reuse_an_unchanged_tensors_summary_and_redo_a_changed_one():
    rng = np.random.default_rng(4)
    cache = RowSummaries()
    first = _parts(rng, np.float32, [16] * 3)
    out = np.zeros((3, 7))
    cache.fill(out, [(i, b"h%d" % i, p, "float32") for i, p in enumerate(first)])
    changed = _parts(rng, np.float32, [16])[0]
    again = np.zeros((3, 7))
    cache.fill(again, [(0, b"h0", first[0], "float32"), (1, b"new", changed, "float32"),
                       (2, b"h2", first[2], "float32")])
    assert again[[0, 2]].tobytes() == out[[0, 2]].tobytes()
    assert again[1].tobytes() == summarize(changed, "float32").tobytes()


def test_a_stores_summaries_of_many_small_tensors_are_each_tensors_own(tmp_path):
    """Through the writer: every summary in the index row is summarize()'s of that tensor's bytes."""
    rng = np.random.default_rng(5)
    path = str(tmp_path / "s")
    create_store(path, {"launcher": "test"})
    writer = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}})
    rows = {}
    for step in (1, 2):
        parts = _parts(rng, np.float32, [100] * 40 + [3, 3, 20000])
        if step == 2:
            parts[1] = rows[1][1]  # unchanged: its summary comes from the cache
        rows[step] = parts
        writer.write(step, "gradients", [TensorData(f"t{i}", "float32", p.shape, p) for i, p in enumerate(parts)])
        writer.complete_step(step)
    writer.close()
    view = open_store(path).rank(0)
    for step, parts in rows.items():
        stored = view.summaries("gradients", step)
        for i, p in enumerate(parts):
            assert np.asarray(stored[f"t{i}"]).tobytes() == summarize(p, "float32").tobytes()
