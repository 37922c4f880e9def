"""Format 3 packs: a row's small tensors in a few objects, found from the hashes, checked one by one."""

import os

import numpy as np
import pytest

import tracekit
from tracekit import open_store
from tracekit.store import RankWriter, TensorData, create_store
from tracekit.store.packs import Located, PackSpec, groups, locations, pack_key
from tracekit.store.shards import Shard
from tracekit.store.verify import verify_store
from tracekit.testing import tensor_bytes
from tracekit.store.places import located


def test_groups_keep_whole_tensors_and_pieces_apart_and_split_at_max():
    spec = PackSpec(below=10, max=12)
    sizes = [4, 20, 5, None, 3, 6, 0, 9]
    sharded = [False, False, False, False, True, True, True, False]
    # whole: 4, 5 (9), then 9 would pass 12: a new pack; 20 is too large, None keeps no bytes;
    # pieces: 3, 6, 0 (9 <= 12)
    assert groups(spec, sizes, sharded) == [[0, 2], [7], [4, 5, 6]]
    assert groups(PackSpec(below=0, max=12), sizes, sharded) == []


def test_locations_follow_the_members_and_skip_tensors_unchanged_since_the_previous_row():
    spec = PackSpec(below=100, max=1000)
    d = [bytes([i]) * 16 for i in range(3)]
    locs = locations(spec, d, [8, 12, 4], [False] * 3)
    key = pack_key(d)
    assert locs == [Located(key, 0, 8), Located(key, 8, 12), Located(key, 20, 4)]
    later = locations(spec, d, [8, 12, 4], [False] * 3, previous=[d[0], b"x" * 16, d[2]])
    assert later[1] == Located(pack_key([d[1]]), 0, 12)  # changed: packed alone
    assert later[0].length is None and later[0].key.endswith(d[0].hex()[2:])  # unchanged: its own object
    assert pack_key(d) != pack_key(d[::-1])  # a pack's name covers its members' order


def _mixed(step):
    """Tensors of every width in one row, odd sizes, so members start at unaligned offsets."""
    rng = np.random.default_rng(step)
    return [
        TensorData("i8", "int8", (3,), rng.integers(-9, 9, 3).astype(np.int8)),
        TensorData("f64", "float64", (5,), rng.standard_normal(5)),
        TensorData("bf16", "bfloat16", (7,), rng.integers(0, 2**16, 7).astype(np.uint16)),
        TensorData("flag", "bool", (2,), np.array([True, step % 2 == 0])),
        TensorData("empty", "float32", (0,), np.zeros(0, np.float32)),
        TensorData("c64", "complex64", (2,), (rng.standard_normal(2) + 1j).astype(np.complex64)),
        TensorData("big", "float32", (40,), rng.standard_normal(40).astype(np.float32)),  # >= below: its own object
        TensorData("piece", "float32", (2, 3), rng.standard_normal((2, 3)).astype(np.float32),
                   Shard((4, 3), (0, 0), (2, 3), (0,))),
    ]


def _write(path, monkeypatch, spec, steps=(1, 2, 3)):
    import tracekit.store.formats.v3 as v3  # the format that packs chooses a new kind's spec

    monkeypatch.setattr(v3, "PackSpec", lambda: spec)
    create_store(path, {})
    w = RankWriter(path, 0, {"coords": {"rank": 0}})
    rows = {}
    for s in steps:
        rows[s] = _mixed(s)
        w.write(s, "outputs", rows[s])
        w.complete_step(s)
    w.close()
    return rows


def test_a_row_of_many_dtypes_packs_and_reads_back_bit_for_bit(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    # small packs, so the row's whole tensors fill two of them; the readers use the recorded spec
    rows = _write(path, monkeypatch, PackSpec(below=100, max=64))
    view = open_store(path).rank(0)
    assert view._pack_spec("outputs") == PackSpec(100, 64)
    files = {tensor_bytes(path, 0, "outputs", 2, t.name)[0] for t in rows[2]}
    # two packs of whole tensors (i8, f64, bf16, flag: 59 bytes; then c64), big's own object, the
    # piece's pack, and empty's own object (unchanged since step 1: not packed again)
    assert len(files) == 5
    for s, tensors in rows.items():
        for t in tensors:
            got = view.read_bits("outputs", s, t.name) if t.shard is None else view.read_piece(
                "outputs", s, view._object_piece("outputs", s, t.name))
            assert got.tobytes() == np.ascontiguousarray(t.data).tobytes(), (s, t.name)
    assert verify_store(path).ok
    assert tracekit.diff(path, path, exact=True, trust_index=False).passed  # every member read and checked


def test_a_pack_longer_than_its_members_is_damage_verify_names(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    _write(path, monkeypatch, PackSpec(below=100, max=1 << 20), steps=(1,))
    file, base, n = tensor_bytes(path, 0, "outputs", 1, "i8")
    with open(file, "ab") as f:
        f.write(b"\0")
    (problem,) = verify_store(path).problems
    assert (problem.rank, problem.kind, problem.step, problem.tensor) == (0, "outputs", 1, None)
    assert "pack" in problem.what and "its members" in problem.what


def test_damage_in_one_member_is_that_tensor_s_alone(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    _write(path, monkeypatch, PackSpec(below=100, max=1 << 20), steps=(1,))
    file, base, n = tensor_bytes(path, 0, "outputs", 1, "f64")
    raw = bytearray(open(file, "rb").read())
    raw[base + n - 1] ^= 0x40
    open(file, "wb").write(bytes(raw))
    assert [p.tensor for p in verify_store(path).problems] == ["f64"]
    view = open_store(path).rank(0)
    with pytest.raises(tracekit.StoreError, match=r"tensor f64: bytes do not match their hash \(object objects/.* \(pack bytes"):
        view.read("outputs", 1, "f64")
    np.testing.assert_array_equal(view.read("outputs", 1, "i8"), _mixed(1)[0].data)  # its neighbours read fine


def test_format_2_is_still_written_on_request_and_has_no_packs(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {}, format_version=2)
    w = RankWriter(path, 0, {})
    w.write(1, "outputs", _mixed(1))
    w.complete_step(1)
    w.close()
    view = open_store(path).rank(0)
    assert view._pack_spec("outputs") is None
    assert all(located(view, "outputs", 1, t.name).length is None for t in _mixed(1))
    files = [f for d, _, fs in os.walk(os.path.join(path, "objects")) for f in fs if f != "zarr.json"]
    assert len(files) == len(_mixed(1))
