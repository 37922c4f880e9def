"""Shard-local tensors (format 2): each rank writes its piece; readers see whole tensors per rank."""

import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit import StoreError, open_store
from tracekit.cli.main import main
from tracekit.store import RankWriter, TensorData, create_store
from tracekit.testing import tensor_bytes
from tracekit.store.shards import Shard
from tracekit.store.verify import verify_store

RANKS = 2


def _full(step):
    return {"w": (np.arange(15, dtype=np.float32).reshape(5, 3) + 0.5) * step,  # 5 rows: 3 + 2
            "e": np.full((1, 3), 2.0 * step, np.float32),  # 1 row: rank 1's piece is empty
            "b": np.arange(4, dtype=np.float32) - step}  # not sharded


def _piece(name, arr, rank):
    per = -(-arr.shape[0] // RANKS)  # rows per rank, torch.chunk style (as DTensor Shard(0))
    lo = min(arr.shape[0], rank * per)
    hi = min(arr.shape[0], lo + per)
    part = np.ascontiguousarray(arr[lo:hi])
    shard = Shard(arr.shape, (lo,) + (0,) * (arr.ndim - 1), part.shape, tuple(range(RANKS)))
    return TensorData(name, "float32", part.shape, part, shard)


def _write(path, sharded=True, steps=(1, 2, 3), steps_of=None, version=None, bump=None):
    create_store(path, {"command": ["test"]}, format_version=version)
    for r in range(RANKS):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": RANKS}})
        for s in (steps_of or {}).get(r, steps):
            tensors = [_piece(n, a, r) if sharded and n != "b" else TensorData(n, "float32", a.shape, a)
                       for n, a in _full(s).items()]
            if bump == (r, s):
                tensors[0].data.flat[0] += 1
            w.write(s, "parameters", tensors)
            w.complete_step(s)
        w.close()
    return path


def _objects(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "objects")) for f in fs if f != "zarr.json"]


@pytest.mark.parametrize("version", [2, 3])
def test_every_rank_reads_whole_tensors_assembled_from_the_pieces(tmp_path, version):
    path = _write(str(tmp_path / "s"), version=version)
    store = open_store(path)
    for r in range(RANKS):
        view = store.rank(r)
        assert view.steps("parameters") == [1, 2, 3]
        assert {t.name: t.shape for t in view.tensors("parameters")} == {"w": (5, 3), "e": (1, 3), "b": (4,)}
        for s in (1, 2, 3):
            for name, arr in _full(s).items():
                np.testing.assert_array_equal(view.read("parameters", s, name), arr)
            got = view.read_kind("parameters", s)
            assert all(np.array_equal(got[n], a) for n, a in _full(s).items())
    # per step: two pieces of w, rank 0's piece of e, one b shared by both ranks; rank 1's empty
    # piece of e is the same object at every step. Format 3 packs them: per step each rank's
    # pieces, and b (shared); rank 1's empty piece, unchanged after step 1, is its own object.
    assert len(_objects(path)) == (3 * 4 + 1 if version == 2 else 3 * 3 + 1)
    assert sum(os.path.getsize(o) for o in _objects(path)) == 3 * (15 + 3 + 4) * 4  # w, e, b: each element once
    assert verify_store(path).ok


@pytest.mark.parametrize("version", [2, 3])
def test_verify_counts_the_bytes_of_the_objects_it_hashed_not_of_whole_tensors(tmp_path, version):
    path = _write(str(tmp_path / "s"), version=version)
    result = verify_store(path)
    # every object once: a piece of w or e counts its own bytes, not the whole tensor's. Format 3:
    # each packed tensor is checked on its own, 5 a step (b shared); rank 1's empty piece of e is
    # in step 1's pack, then its own object for steps 2 and 3
    assert result.ok and result.objects == (len(_objects(path)) if version == 2 else 3 * 5 - 1)
    assert result.bytes_read == sum(os.path.getsize(o) for o in _objects(path))


def test_a_sharded_store_diffs_like_the_gathered_one(tmp_path):
    sharded = _write(str(tmp_path / "sharded"))
    gathered = _write(str(tmp_path / "gathered"), sharded=False)
    v1 = _write(str(tmp_path / "v1"), sharded=False, version=1)
    for ref, cand in ((sharded, gathered), (gathered, sharded), (v1, sharded)):
        assert tracekit.diff(ref, cand, exact=True).passed
    # two sharded stores: whole tensors decided by their pieces' hashes
    report = tracekit.diff(sharded, _write(str(tmp_path / "again")), exact=True)
    assert report.passed and report.identical_by_hash == RANKS * 3 * 3


def test_open_presents_whole_tensors_per_rank(tmp_path):
    pytest.importorskip("dask")
    sharded = tracekit.open(_write(str(tmp_path / "sharded")))["parameters"].to_dataset()
    gathered = tracekit.open(_write(str(tmp_path / "gathered"), sharded=False))["parameters"].to_dataset()
    for name in ("w", "e", "b"):
        np.testing.assert_array_equal(sharded[name].values, gathered[name].values)


def test_a_changed_piece_is_a_difference_on_every_rank_that_holds_it(tmp_path):
    ref = _write(str(tmp_path / "ref"))
    cand = _write(str(tmp_path / "cand"), bump=(1, 2))  # rank 1's piece of w differs at step 2
    report = tracekit.diff(ref, cand, exact=True)
    assert not report.passed
    assert {(v.rank, v.step, v.tensor) for v in report.violations} == {(0, 2, "w"), (1, 2, "w")}


@pytest.mark.parametrize("twin", [False, True])
def test_a_damaged_piece_is_damage_for_every_rank_that_reads_it(tmp_path, twin):
    path = _write(str(tmp_path / "s"))
    obj, base, _ = tensor_bytes(path, 1, "parameters", 2, "w")  # rank 1's piece of w, step 2
    data = bytearray(open(obj, "rb").read())
    data[base + 1] ^= 0x10
    open(obj, "wb").write(bytes(data))
    with pytest.raises(StoreError, match=r"^damaged store: .*: rank 1 parameters step 2 tensor w: bytes do not match"):
        open_store(path).rank(0).read("parameters", 2, "w")
    ref = _write(str(tmp_path / "ref"))
    if twin:  # `diff lie lie`: every hash agrees
        ref = str(tmp_path / "twin")
        shutil.copytree(path, ref)
    result = CliRunner().invoke(main, ["diff", ref, path, "--exact", "--check-hashes"])
    assert result.exit_code == 2 and "damaged store" in result.output and "PASS" not in result.output, result.output
    (problem,) = verify_store(path).problems
    assert (problem.rank, problem.step, problem.tensor) == (1, 2, "w")


def test_a_step_exists_only_once_every_piece_of_it_does(tmp_path):
    path = _write(str(tmp_path / "s"), steps_of={0: (1, 2, 3), 1: (1, 2)})  # rank 1 died in step 3
    store = open_store(path)
    assert store.rank(0).own_steps("parameters") == [1, 2, 3]
    assert store.rank(0).steps("parameters") == store.rank(1).steps("parameters") == [1, 2]
    np.testing.assert_array_equal(store.rank(0).read("parameters", 2, "w"), _full(2)["w"])


def test_a_missing_peer_rank_is_damage_not_zeros(tmp_path):
    path = _write(str(tmp_path / "s"))
    shutil.rmtree(os.path.join(path, "rank_1"))
    with pytest.raises(StoreError, match=r"^damaged store: .*: rank 0 parameters step 1 tensor w: its piece on rank 1 is missing"):
        open_store(path).rank(0).read("parameters", 1, "w")


def test_pieces_found_once_for_a_layout_still_name_the_rank_that_asks(tmp_path):
    # ranks 0 and 1 hold the same layout (w over ranks 0-2): its pieces are found once per store, and
    # the damage (rank 2 gone) is reported under the entry of whichever rank asks
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]})
    full = np.arange(6, dtype=np.float32).reshape(3, 2)
    for r in range(3):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": 3}})
        part = np.ascontiguousarray(full[r : r + 1])
        w.write(1, "parameters", [TensorData("w", "float32", part.shape, part, Shard((3, 2), (r, 0), (1, 2), (0, 1, 2)))])
        w.complete_step(1)
        w.close()
    store = open_store(path)
    np.testing.assert_array_equal(store.rank(1).read("parameters", 1, "w"), full)
    shutil.rmtree(os.path.join(path, "rank_2"))
    store = open_store(path)
    for r in (0, 1, 0):
        with pytest.raises(StoreError, match=rf"^damaged store: .*: rank {r} parameters step 1 tensor w: its piece on rank 2 is missing"):
            store.rank(r).digests("parameters", 1)


def test_a_peer_entry_that_does_not_fit_is_damage(tmp_path):
    import json

    from tracekit.store.meta import edit_index

    path = _write(str(tmp_path / "s"))
    meta = os.path.join(path, "rank_1", "parameters", "zarr.json")
    doc = json.load(open(meta))

    def claim(entries):  # rank 1 claims another tiling of w
        next(e for e in entries if e["name"] == "w")["shard"]["peers"] = [1, 0]

    edit_index(doc["attributes"], claim)
    json.dump(doc, open(meta, "w"))
    view = open_store(path).rank(0)
    for ask in (lambda: view.read("parameters", 1, "w"), lambda: view.digests("parameters", 2)):
        with pytest.raises(StoreError, match=r"^damaged store: .*: rank 0 parameters step \d tensor w: rank 1 holds no matching piece"):
            ask()


def test_format_1_refuses_shards(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]}, format_version=1)
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": RANKS}})
    with pytest.raises(StoreError, match="format 1 holds whole tensors only"):
        w.write(1, "parameters", [_piece("w", _full(1)["w"], 0)])
    w.close()


def test_sharded_index_entries_match_the_schema_and_roundtrip(tmp_path):
    import json

    import jsonschema

    from tracekit.schemas import load, part
    from tracekit.store.meta import KindMeta, decode_index

    path = _write(str(tmp_path / "s"))
    attrs = json.load(open(os.path.join(path, "rank_1", "parameters", "zarr.json")))["attributes"]
    jsonschema.validate(attrs, part(load("store-metadata"), "kind"))
    attrs["tensors"] = decode_index(attrs["tensors"])  # format 5's JSON text: the entries of the formats before
    jsonschema.validate(attrs, part(load("store-metadata"), "kind"))
    meta = KindMeta.from_attrs(attrs)
    assert meta.to_attrs() == attrs
    assert meta.tensors[0].shard == Shard((5, 3), (3, 0), (2, 3), (0, 1))
    with pytest.raises(ValueError, match="outside the tensor"):
        KindMeta.from_attrs({**attrs, "tensors": [{**attrs["tensors"][0], "shard": {"offset": [4, 0], "shape": [2, 3], "peers": [0, 1]}}]})
