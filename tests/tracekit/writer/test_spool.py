"""The spool entry format (tracekit/writer/spool.py): what a rank hands its writer process."""

import numpy as np
import pytest

from tracekit.writer.spool import read_entry, write_entry
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
    from tracekit.writer.spool import ALIGN

    with open(path, "r+b") as f:
        f.truncate(size - ALIGN + 8)  # the padding after the 16 bytes of data, and 8 of them
    with pytest.raises(ValueError, match="truncated"):
        read_entry(str(path))


def _entry_with_layout(path, layout: dict) -> None:
    """An entry whose one piece has the header layout `layout` (as if a rank wrote it so)."""
    import json
    import struct

    from tracekit.writer.spool import ALIGN, MAGIC

    write_entry(str(path), 1, True, [("parameters", TensorData(
        "w", "float32", (2, 3), np.zeros((2, 3), np.float32), Shard((5, 3), (2, 0), (2, 3), (0, 1))))])
    raw = path.read_bytes()
    start = len(MAGIC) + 8
    (hlen,) = struct.unpack("<Q", raw[len(MAGIC):start])
    header = json.loads(raw[start:start + hlen])
    data = raw[start + hlen + -(start + hlen) % ALIGN:]
    header["tensors"][0]["shard"] = layout
    head = MAGIC + struct.pack("<Q", len(json.dumps(header))) + json.dumps(header).encode()
    path.write_bytes(head + b"\0" * (-len(head) % ALIGN) + data)


def test_layouts_read_again_are_the_same_and_a_bad_one_is_still_refused(tmp_path):
    """read_entry remembers the layouts it checked (a rank sends the same ones every step); one
    that fails the check is never remembered, so it is refused every time it comes."""
    good = {"full_shape": [5, 3], "offset": [2, 0], "shape": [2, 3], "peers": [0, 1]}
    first = read_entry(str(_write_and_path(tmp_path / "a.step", good)))
    second = read_entry(str(_write_and_path(tmp_path / "b.step", good)))
    try:
        assert first.kinds["parameters"][0].shard == Shard((5, 3), (2, 0), (2, 3), (0, 1))
        assert second.kinds["parameters"][0].shard is first.kinds["parameters"][0].shard  # checked once
    finally:
        first.close()
        second.close()
    for bad in ({"full_shape": [5, 3], "offset": [4, 0], "shape": [2, 3], "peers": [0, 1]},   # outside the tensor
                {"full_shape": [5, 3], "offset": [2, 0], "shape": [2, 3], "peers": [1, 1]},   # peers twice
                {"full_shape": [5, 3], "offset": "20", "shape": [2, 3], "peers": [0, 1]},     # not a list
                {"full_shape": [5, 3], "offset": [[2], 0], "shape": [2, 3], "peers": [0, 1]}):
        for _ in range(2):
            with pytest.raises((ValueError, TypeError)):
                read_entry(str(_write_and_path(tmp_path / "c.step", bad)))


def _write_and_path(path, layout):
    _entry_with_layout(path, layout)
    return path


@pytest.mark.parametrize("populate", [True, False])
def test_an_entry_reads_the_same_mapped_at_once_or_page_by_page(tmp_path, populate):
    data = np.arange(100_000, dtype=np.float32)
    path = tmp_path / "1.step"
    write_entry(str(path), 3, False, [("gradients", TensorData("g", "float32", (100_000,), data))])
    entry = read_entry(str(path), populate=populate)
    try:
        assert (entry.step, entry.complete) == (3, False)
        np.testing.assert_array_equal(entry.kinds["gradients"][0].data, data)
    finally:
        entry.close()


def test_a_digested_tensor_travels_as_its_record_and_kept_bytes_stay_page_aligned(tmp_path):
    from tracekit.writer.spool import ALIGN, DIGEST_RECORD, read_entry as read
    from tracekit.store.summaries import summarize

    kept = np.arange(1000, dtype=np.float32)
    shard = Shard((8, 3), (4, 0), (4, 3), (0, 1))
    summary = summarize(np.array([1.0, -2.0, np.nan], dtype=np.float32), "float32")
    tensors = [("gradients", TensorData("g", "float32", (4, 3), np.empty(0, np.float32), shard,
                                        digest=bytes(range(16)), summary=summary)),
               ("gradients", TensorData("h", "bfloat16", (2,), np.empty(0, np.uint16), digest=b"\xff" * 16,
                                        summary=summary * 2)),
               ("parameters", TensorData("w", "float32", (1000,), kept))]
    path = tmp_path / "1.part"
    size = write_entry(str(path), 3, True, tensors)
    raw = path.read_bytes()
    assert len(raw) == size and size % ALIGN == 0 and size < 4 * ALIGN + kept.nbytes  # records take no page each
    entry = read(str(path))
    try:
        g, h = entry.kinds["gradients"]
        (w,) = entry.kinds["parameters"]
        assert (g.digest, g.shard, g.shape, g.data.size) == (bytes(range(16)), shard, (4, 3), 0)
        assert g.summary.tobytes() == summary.tobytes() and h.summary.tobytes() == (summary * 2).tobytes()
        assert (h.dtype, h.digest) == ("bfloat16", b"\xff" * 16)
        assert w.digest is None and np.array_equal(w.data, kept)
        # the kept tensor's bytes start on a page of the file (O_DIRECT writes straight from the spool)
        assert raw.find(kept.tobytes()) % ALIGN == 0
    finally:
        entry.close()
    assert DIGEST_RECORD == 16 + 8 * len(summary)
