"""An array's size claims checked against its chunk files (tracekit/store/chunks.py check_size_claims),
for both separators of zarr's default chunk keys: `c/<row>/<col>` (to format 5) and `c.<row>.<col>`
(format 6). A lying claim must be one phrase before anything that size is allocated, whatever the keys."""

import json
import os

import numpy as np
import pytest
import zarr

from tracekit.store.chunks import check_size_claims


def _array(tmp_path, sep):
    """A 3-row, 4-wide uint8 array of 2-element chunks, every chunk written."""
    arr = zarr.create_array(str(tmp_path / "a"), shape=(3, 4), chunks=(1, 2), dtype="uint8", fill_value=0,
                            compressors=None, chunk_key_encoding={"name": "default", "separator": sep},
                            config={"write_empty_chunks": True})
    arr[:] = np.arange(12, dtype=np.uint8).reshape(3, 4)
    return arr


def _claim(tmp_path, edit):
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return zarr.open_array(str(tmp_path / "a"), mode="r")


@pytest.mark.parametrize("sep", ["/", "."])
def test_a_true_claim_passes_and_each_lie_is_named(tmp_path, sep):
    arr = _array(tmp_path, sep)
    key = f"c{sep}0{sep}0"
    assert os.path.isfile(tmp_path / "a" / key)  # the keys this test means
    assert check_size_claims(arr, 3, [("t", 0, 4)]) is None
    assert check_size_claims(_claim(tmp_path, lambda d: d["shape"].__setitem__(0, 1000)), 3, []) == \
        "claims 1000 rows but has chunk files for 3"
    _claim(tmp_path, lambda d: d["shape"].__setitem__(0, 3))
    assert check_size_claims(_claim(tmp_path, lambda d: d["shape"].__setitem__(1, 2000)), 3, []) == \
        "claims 1000 chunks per row but row 0 has 2 chunk files"
    arr = _claim(tmp_path, lambda d: d["shape"].__setitem__(1, 4))
    (tmp_path / "a" / key).write_bytes(b"x")
    assert check_size_claims(arr, 3, []) == f"claims chunks of 2 bytes but chunk {key} holds 1"


@pytest.mark.parametrize("sep", ["/", "."])
def test_a_step_list_longer_than_the_rows_is_named(tmp_path, sep):
    assert check_size_claims(_array(tmp_path, sep), 4, []) == "lists 4 rows but holds 3"


def test_a_new_store_makes_no_folder_per_row(tmp_path):
    """Format 6: every index row of every kind is a flat chunk file beside its array's zarr.json;
    a folder per row (`c/<row>/`) was a third of what a step made on the disk."""
    from tracekit.store.format import FINITE_ARRAY, HASH_ARRAY, SUMMARY_ARRAY
    from tracekit.testing import index_chunk, write_store

    steps = {s: {"gradients": {"w": np.full(3, s, np.float32)}, "loss": {"loss": np.float32(s)}} for s in (1, 2, 3)}
    store = write_store(tmp_path / "s", {0: steps, 1: steps})
    for rank in (0, 1):
        for kind in ("gradients", "loss"):
            for array in (HASH_ARRAY, FINITE_ARRAY, SUMMARY_ARRAY):
                folder = os.path.join(store, f"rank_{rank}", kind, array)
                assert sorted(os.listdir(folder)) == ["c.0.0", "c.1.0", "c.2.0", "zarr.json"], folder
                assert index_chunk(store, rank, kind, array, 2) == os.path.join(folder, "c.2.0")
