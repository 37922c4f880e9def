import json
import os

import numpy as np
import pytest
import xarray as xr
import zarr

from tracekit import StoreError, open_store
from tracekit.store import RankWriter, TensorData, create_store, finalize_store
from tracekit.store.format import FORMAT_VERSION
from tracekit.store.meta import edit_index


def _bf16_bits(values):
    import torch

    return torch.tensor(values).bfloat16().view(torch.int16).numpy().view(np.uint16)


def write_run(path, ranks=2, steps=3, crash_after=None, version=FORMAT_VERSION):
    create_store(path, {"command": ["test"]}, format_version=version)
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks}, "run": {"device": "cpu"}})
        for s in range(0, steps + 1):
            w.write(s, "parameters", [
                TensorData("w", "float32", (2, 3), np.arange(6, dtype=np.float32) * (s + 1) + r),
                TensorData("h", "bfloat16", (4,), _bf16_bits([1.0, -2.5, 3.0e38, 0.0078125])),
                TensorData("n", "int64", (), np.array(s, dtype=np.int64)),
            ])
            if s == 0:
                continue
            w.write(s, "loss", [TensorData("loss", "float32", (), np.array(0.5 / s, dtype=np.float32))])
            if crash_after is not None and s > crash_after:
                break  # written but never completed, as when a rank dies mid-step
            w.complete_step(s)
        w.close()
    return path


@pytest.mark.parametrize("version", [1, 2])
def test_roundtrip_values_dtypes_and_steps(tmp_path, version):
    store = open_store(write_run(str(tmp_path / "s"), version=version))
    assert store.ranks == [0, 1]
    r1 = store.rank(1)
    assert r1.completed_steps == [1, 2, 3]
    assert r1.steps("parameters") == [0, 1, 2, 3]
    assert r1.steps("loss") == [1, 2, 3]
    np.testing.assert_array_equal(r1.read("parameters", 2, "w"), np.arange(6, dtype=np.float32).reshape(2, 3) * 3 + 1)
    assert r1.read("parameters", 3, "n") == 3
    info = {t.name: t for t in r1.tensors("parameters")}
    assert info["h"].dtype == "bfloat16" and info["h"].shape == (4,)


@pytest.mark.parametrize("version", [1, 2])
def test_bfloat16_roundtrips_bitwise(tmp_path, version):
    import torch

    store = open_store(write_run(str(tmp_path / "s"), version=version))
    bits = store.rank(0).read_bits("parameters", 1, "h")
    want = torch.tensor([1.0, -2.5, 3.0e38, 0.0078125]).bfloat16()
    assert np.array_equal(bits, want.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(store.rank(0).read("parameters", 1, "h"), want.float().numpy())


@pytest.mark.parametrize("version", [1, 2])
def test_crashed_rank_shows_only_completed_steps(tmp_path, version):
    store = open_store(write_run(str(tmp_path / "s"), crash_after=2, version=version))
    r0 = store.rank(0)
    assert r0.completed_steps == [1, 2]
    assert r0.steps("loss") == [1, 2]  # step 3's row was written but never completed
    with pytest.raises(StoreError, match="no loss data for step 3"):
        r0.read("loss", 3, "loss")


def test_plain_xarray_opens_v1_store_with_named_dims(tmp_path):
    path = write_run(str(tmp_path / "s"), version=1)
    finalize_store(path, 0)
    tree = xr.open_datatree(path, engine="zarr")
    ds = tree["rank_1/parameters"].to_dataset()
    assert ds["float32"].dims == ("step", "float32_element")
    assert ds.sizes["step"] == 4
    np.testing.assert_array_equal(ds["float32"].values[2, :6], np.arange(6, dtype=np.float32) * 3 + 1)


def test_plain_xarray_opens_v2_store_and_sees_its_index(tmp_path):
    path = write_run(str(tmp_path / "s"))
    finalize_store(path, 0)
    tree = xr.open_datatree(path, engine="zarr")
    ds = tree["rank_1/parameters"].to_dataset()
    assert ds["hash"].dims == ("step", "hash_element") and ds["hash"].shape == (4, 3 * 16)
    assert ds["finite"].values.tolist() == [[1, 1, 1]] * 4
    assert tree["objects"].shape == (0,)  # the object folder is a leaf zarr never lists


def test_finalize_records_exit_status_and_ranks(tmp_path):
    path = write_run(str(tmp_path / "s"), crash_after=1)
    summary = finalize_store(path, 137)
    meta = open_store(path).meta
    assert meta["exit_status"] == 137 == summary["exit_status"]
    assert meta["ranks"]["0"] == {"completed_steps": [1], "status": "finished", "cause": None, "exit_code": None}
    assert meta["format_version"] == FORMAT_VERSION


def test_create_refuses_existing_store_and_foreign_dirs(tmp_path):
    path = write_run(str(tmp_path / "s"))
    with pytest.raises(StoreError, match="--force"):
        create_store(path, {"command": []})
    create_store(path, {"command": ["again"]}, force=True)
    assert open_store(path).ranks == []
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not a tracekit store"):
        create_store(str(foreign), {"command": []}, force=True)
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_rank_cannot_be_written_twice(tmp_path):
    path = write_run(str(tmp_path / "s"), ranks=1)
    with pytest.raises(StoreError, match="already holds data of rank 0"):
        RankWriter(path, 0, {})


def test_tensor_set_is_fixed_per_kind(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"command": []})
    w = RankWriter(path, 0, {})
    w.write(1, "gradients", [TensorData("a", "float32", (2,), np.zeros(2, np.float32))])
    with pytest.raises(StoreError, match="changed between steps"):
        w.write(2, "gradients", [TensorData("a", "float32", (3,), np.zeros(3, np.float32))])


@pytest.mark.parametrize("damage, message", [
    ("missing", "no such store"),
    ("empty_dir", "no zarr.json"),
    ("foreign_zarr", "not a tracekit store"),
    ("newer", "newer than this tracekit reads"),
    ("garbage_json", "unreadable root metadata"),
])
def test_open_rejects_bad_stores_in_one_line(tmp_path, damage, message):
    path = str(tmp_path / "s")
    if damage == "empty_dir":
        os.mkdir(path)
    elif damage == "foreign_zarr":
        zarr.open_group(path, mode="w", attributes={"something": 1})
    elif damage == "newer":
        write_run(path, ranks=1)
        doc = json.load(open(os.path.join(path, "zarr.json")))
        doc["attributes"]["tracekit"]["format_version"] = FORMAT_VERSION + 1
        json.dump(doc, open(os.path.join(path, "zarr.json"), "w"))
    elif damage == "garbage_json":
        os.mkdir(path)
        open(os.path.join(path, "zarr.json"), "w").write("{not json")
    with pytest.raises(StoreError, match=message) as info:
        open_store(path)
    assert "\n" not in str(info.value)


def test_missing_chunk_is_a_store_error(tmp_path):
    path = write_run(str(tmp_path / "s"), ranks=1, version=1)
    os.remove(os.path.join(path, "rank_0", "loss", "float32", "c", "1", "0"))
    with pytest.raises(StoreError, match="rank 0 loss step 2"):
        open_store(path).rank(0).read_kind("loss", 2)


def test_all_zero_rows_are_written_and_read_back(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"command": []}, format_version=1)
    w = RankWriter(path, 0, {})
    w.write(1, "gradients", [TensorData("frozen", "float32", (3,), np.zeros(3, np.float32))])
    w.complete_step(1)
    assert os.path.isfile(os.path.join(path, "rank_0", "gradients", "float32", "c", "0", "0"))
    np.testing.assert_array_equal(open_store(path).rank(0).read("gradients", 1, "frozen"), np.zeros(3))


def test_direct_chunk_writes_read_back_through_plain_zarr(tmp_path, monkeypatch):
    import tracekit.store.writer as writer

    monkeypatch.setattr(writer, "MAX_CHUNK_BYTES", 40)  # 10 float32 per chunk: tensors straddle chunk edges
    path = str(tmp_path / "s")
    create_store(path, {"command": []}, format_version=1)
    w = RankWriter(path, 0, {})
    a, b = np.arange(7, dtype=np.float32), np.arange(100, 116, dtype=np.float32)
    for step in (1, 2):
        w.write(step, "gradients", [TensorData("a", "float32", (7,), a * step), TensorData("b", "float32", (16,), b * step)])
        w.complete_step(step)
    z = zarr.open_array(os.path.join(path, "rank_0", "gradients", "float32"), mode="r")
    assert z.chunks == (1, 10) and z.shape == (2, 23)
    np.testing.assert_array_equal(z[1], np.concatenate([a, b]) * 2)
    assert sorted(os.listdir(os.path.join(path, "rank_0", "gradients", "float32", "c", "1"))) == ["0", "1", "2"]
    np.testing.assert_array_equal(open_store(path).rank(0).read("gradients", 2, "b"), b * 2)


def _edit_json(path, fn):
    doc = json.load(open(path))
    fn(doc["attributes"])
    json.dump(doc, open(path, "w"))


@pytest.mark.parametrize("damage", [
    "garbage_rank_json", "garbage_kind_json", "tensors_not_a_list", "tensor_without_offset", "unknown_dtype",
    "tensors_not_json", "steps_not_a_list", "completed_not_a_list", "coords_not_an_object", "root_meta_not_an_object",
])
@pytest.mark.parametrize("version", [1, 2, 5])
def test_damaged_metadata_is_one_store_error(tmp_path, damage, version):
    path = write_run(str(tmp_path / "s"), version=version)
    rank = os.path.join(path, "rank_1")
    kind = os.path.join(rank, "parameters", "zarr.json")
    edits = {
        "garbage_rank_json": lambda: open(os.path.join(rank, "zarr.json"), "w").write("{garbage"),
        "garbage_kind_json": lambda: open(kind, "w").write("{garbage"),
        "tensors_not_a_list": lambda: _edit_json(kind, lambda a: a.update(tensors=5)),
        "tensor_without_offset": lambda: _edit_json(kind, lambda a: edit_index(a, lambda e: e[0].pop("offset"))),
        "unknown_dtype": lambda: _edit_json(kind, lambda a: edit_index(a, lambda e: e[0].update(dtype="foo"))),
        "tensors_not_json": lambda: _edit_json(kind, lambda a: a.update(tensors='[{"name": ')),
        "steps_not_a_list": lambda: _edit_json(kind, lambda a: a.update(steps="1")),
        "completed_not_a_list": lambda: _edit_json(os.path.join(rank, "zarr.json"), lambda a: a.update(completed_steps="x")),
        "coords_not_an_object": lambda: _edit_json(os.path.join(rank, "zarr.json"), lambda a: a.update(coords=[1])),
        "root_meta_not_an_object": lambda: _edit_json(os.path.join(path, "zarr.json"), lambda a: a.update(tracekit=5)),
    }
    edits[damage]()
    with pytest.raises(StoreError) as info:
        store = open_store(path)
        view = store.rank(1)
        view.coords, view.completed_steps, view.tensors("parameters"), view.steps("parameters")
    assert "\n" not in str(info.value)
