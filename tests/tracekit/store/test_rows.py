"""Index rows read straight from their chunk files (tracekit/store/rows.py RowFiles): the values
zarr reads, and each kind of damage one StoreError naming rank, kind, step and the chunk."""

import os

import numpy as np
import pytest
import zarr

from tracekit import open_store
from tracekit.errors import StoreError
from tracekit.store.rows import RowFiles
from tracekit.testing import index_chunk, write_store

from tests.builders import small_run_data


@pytest.fixture(params=[3, 6])
def store(tmp_path, request):
    """Format 3 (a folder per row, `c/<row>/0`) and format 6 (flat keys, `c.<row>.0`)."""
    return write_store(tmp_path / "s", small_run_data(), format_version=request.param)


def test_rows_read_as_files_are_the_rows_zarr_reads(store):
    kind = zarr.open_group(os.path.join(store, "rank_0", "parameters"), mode="r")
    for name, arr in kind.arrays():
        files = RowFiles.of(arr)
        assert files is not None, name
        for row in range(arr.shape[0]):
            got = files.read(row)
            assert got.dtype == arr.dtype and np.array_equal(got, arr[row]), (name, row)


def _hash_chunk(store, row):
    return index_chunk(store, 0, "parameters", "hash", row)


@pytest.mark.parametrize("damage, message", [
    ("deleted", "chunk {key} of its hash index is missing"),
    ("fifo", "chunk {key} of its hash index is missing"),
    ("short", "unreadable hash index .StoreError: chunk file {key} holds 3 bytes"),
])
def test_a_damaged_index_chunk_is_one_line_naming_it(store, damage, message):
    path = _hash_chunk(store, 1)
    message = message.format(key="c/1/0" if path.endswith(os.path.join("c", "1", "0")) else r"c\.1\.0")
    os.unlink(path)
    if damage == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.mkfifo(path)  # must not block the open
    elif damage == "short":
        with open(path, "wb") as f:
            f.write(b"abc")
    view = open_store(store).rank(0)
    step = next(s for s, row in view._step_rows("parameters").items() if row == 1)
    other = next(s for s, row in view._step_rows("parameters").items() if row != 1)
    with pytest.raises(StoreError, match=f"rank 0 parameters step {step}: {message}"):
        view.digests("parameters", step)
    assert view.digests("parameters", other)  # the other rows stay readable
