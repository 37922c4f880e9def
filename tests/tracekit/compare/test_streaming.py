"""Chunked reading: tensors spanning chunks, rows packed differently on each side, block metrics."""

import numpy as np
import pytest

import tracekit
import tracekit.store.writer as writer
from tracekit.compare import compare_arrays
from tracekit.testing import write_store


def _data(order, bump=None):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((30, 7)).astype(np.float32), "b": rng.standard_normal(500).astype(np.float32),
               "c": np.arange(9, dtype=np.int64), "d": rng.standard_normal((3, 3)).astype(np.float32)}
    if bump:
        name, index, value = bump
        tensors[name] = tensors[name].copy()
        tensors[name][index] += value
    return {0: {1: {"gradients": {n: tensors[n] for n in order}}}}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 26])
def test_tensors_across_chunks_and_differently_packed_rows(tmp_path, monkeypatch, chunk_bytes, version):
    monkeypatch.setattr(writer, "MAX_CHUNK_BYTES", chunk_bytes)  # many small chunks: tensors straddle them
    monkeypatch.setattr(tracekit.store.format, "MAX_CHUNK_BYTES", chunk_bytes)  # v2's virtual chunks too
    ref = write_store(tmp_path / "ref", _data("abcd"), format_version=version)
    same = write_store(tmp_path / "same", _data("dcba"), format_version=version)  # other offsets in the rows
    report = tracekit.diff(ref, same, exact=True, details="all", jobs=2)
    assert report.passed and {r.tensor for r in report.results} == {"a", "b", "c", "d"}
    if version == 1:
        assert report.bytes_compared == 2 * (30 * 7 * 4 + 500 * 4 + 9 * 8 + 9 * 4)
    else:  # equal content hashes: decided without reading a byte
        assert report.bytes_compared == 0 and report.identical_by_hash == 4

    cand = write_store(tmp_path / "cand", _data("bdca", bump=("a", (17, 5), 1e-3)), format_version=version)
    report = tracekit.diff(ref, cand, jobs=2)
    (bad,) = report.violations
    expected = compare_arrays(_data("a")[0][1]["gradients"]["a"], _data("a", bump=("a", (17, 5), 1e-3))[0][1]["gradients"]["a"],
                              rtol=1.3e-6, atol=1e-5)
    assert bad.tensor == "a" and bad.metrics.worst.index == (17, 5)
    assert bad.metrics.violations == expected.violations == 1
    assert bad.metrics.max_abs_err == expected.max_abs_err
    assert bad.metrics.rel_l2_err == pytest.approx(expected.rel_l2_err, rel=1e-6)
    assert bad.metrics.cosine == pytest.approx(expected.cosine, abs=1e-12)
    # only the changed tensor is read in v2: the others' hashes agree
    assert report.bytes_compared == (2 * 30 * 7 * 4 if version == 2 else 2 * (30 * 7 * 4 + 500 * 4 + 9 * 8 + 9 * 4))


def test_the_zarr_path_gives_the_same_report(tmp_path, monkeypatch):
    """Stores that are not plain local chunk files (other codecs, remote) are read through zarr."""
    monkeypatch.setattr(writer, "MAX_CHUNK_BYTES", 1000)
    ref = write_store(tmp_path / "ref", _data("abcd"), format_version=1)
    cand = write_store(tmp_path / "cand", _data("bdca", bump=("b", (321,), 1e-3)), format_version=1)
    direct = tracekit.diff(ref, cand, details="all").to_dict()
    import tracekit.store.rows as reading

    monkeypatch.setattr(reading, "_direct_folder", lambda arr: None)
    via_zarr = tracekit.diff(ref, cand, details="all").to_dict()
    for d in (direct, via_zarr):
        d.pop("stats")
    assert via_zarr == direct and direct["first_divergence"]["worst"]["index"] == [321]
    chunk = tmp_path / "cand" / "rank_0" / "gradients" / "float32" / "c" / "0" / "1"
    chunk.unlink()
    with pytest.raises(tracekit.StoreError, match="chunk file rank_0/gradients/float32/c/0/1 is missing"):
        tracekit.diff(ref, cand)
