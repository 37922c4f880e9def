"""The spool entry format (recorders/spool.py): what a rank hands its writer process."""

import numpy as np
import pytest

from tracekit.recorders.spool import read_entry, write_entry
from tracekit.store import TensorData
from tracekit.store.shards import Shard


def test_a_piece_travels_with_its_layout_in_the_header_and_its_name_unchanged(tmp_path):
    piece = np.arange(6, dtype=np.float32).reshape(2, 3)
    shard = Shard((5, 3), (2, 0), (2, 3), (0, 1, 2))
    tensors = [("parameters", TensorData("layers.0.weight", "float32", (2, 3), piece, shard)),
               ("loss", TensorData("loss", "float32", (), np.array(1.5, dtype=np.float32)))]
    path = tmp_path / "1.part"
    write_entry(str(path), 4, True, tensors)
    assert b"layers.0.weight\\u0000" not in path.read_bytes() and b"\0tracekit" not in path.read_bytes()
    entry = read_entry(str(path))
    try:
        (p,), (loss,) = entry.kinds["parameters"], entry.kinds["loss"]
        assert (entry.step, entry.complete) == (4, True)
        assert (p.name, p.shape, p.shard) == ("layers.0.weight", (2, 3), shard)
        np.testing.assert_array_equal(p.data.reshape(2, 3), piece)
        assert (loss.name, loss.shard, float(loss.data[0])) == ("loss", None, 1.5)
    finally:
        entry.close()


def test_a_truncated_entry_is_refused(tmp_path):
    path = tmp_path / "1.part"
    size = write_entry(str(path), 1, True, [("loss", TensorData("loss", "float32", (4,), np.ones(4, np.float32)))])
    with open(path, "r+b") as f:
        f.truncate(size - 64)
    with pytest.raises(ValueError, match="truncated"):
        read_entry(str(path))
