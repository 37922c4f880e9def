"""tracekit.open: a store as a lazy xarray DataTree, checked against the same values read with plain zarr."""

import json
import os
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

import tracekit
from tracekit.errors import StoreError
from tracekit.store.format import FORMAT_VERSION
from tracekit.store import RankWriter, TensorData, create_store
from tests.paths import REPO


def _bf16_bits(values):
    # round-to-nearest-even float32 -> bfloat16 bits, independent of the code under test
    f = np.asarray(values, np.float32).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


def _coords(rank, world, tp=2):
    return {"rank": rank, "local_rank": rank, "world_size": world, "dp_degree": world // tp, "dp_rank": rank // tp,
            "tp_degree": tp, "tp_rank": rank % tp,
            "meshes": [{"dim_names": ["dp", "tp"], "shape": [world // tp, tp], "coordinate": [rank // tp, rank % tp]}]}


def write_store(path, world=4, steps=3, completed=None, shard_shapes=False, version=None):
    """Parameters (float32 w, bfloat16 h, int64 n; step 0 too), loss, gradients; values depend on (rank, step).

    completed: {rank: last completed step}; rows past it are written but never completed (a crash).
    shard_shapes: gradient `g` has a different shape on every rank (a layout recording local shards).
    version: the store format (default: the current one; 1 for tests of the packed chunk files).
    """
    create_store(path, {"command": ["train.py", "--device", "cpu"], "versions": {"torch": "x"}},
                 format_version=version or FORMAT_VERSION)
    for r in range(world):
        w = RankWriter(path, r, {"coords": _coords(r, world), "run": {"device": "cpu", "backend": "gloo"}})
        last = (completed or {}).get(r, steps)
        for s in range(0, steps + 1):
            w.write(s, "parameters", [
                TensorData("w", "float32", (2, 3), np.arange(6, dtype=np.float32) * (s + 1) + 10 * r),
                TensorData("h", "bfloat16", (4,), _bf16_bits([1.0 + r, -2.5, 3.0e38, 0.0078125 * (s + 1)])),
                TensorData("n", "int64", (), np.array(100 * r + s, dtype=np.int64)),
            ])
            if s == 0:
                continue
            w.write(s, "loss", [TensorData("loss", "float32", (), np.array(1.0 / s, dtype=np.float32))])
            gshape = (r + 1, 2) if shard_shapes else (3, 2)
            w.write(s, "gradients", [TensorData("g", "float32", gshape, np.full(gshape, s + 0.25 * r, np.float32))])
            if s <= last:
                w.complete_step(s)
        w.close()
    return path


def _plain_zarr(path, rank, kind, name, step):
    """The same tensor read with zarr alone: find its row and columns from the kind group's attrs."""
    g = zarr.open_group(os.path.join(path, f"rank_{rank}", kind), mode="r")
    entry = next(e for e in g.attrs["tensors"] if e["name"] == name)
    row = list(g.attrs["steps"]).index(step)
    bits = g[entry["array"]][row, entry["offset"]: entry["offset"] + entry["numel"]]
    if entry["dtype"] == "bfloat16":
        bits = (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.reshape(entry["shape"])


def test_every_value_matches_plain_zarr(tmp_path):
    path = write_store(str(tmp_path / "s"), version=1)  # format 1: plain zarr arrays hold the values
    tree = tracekit.open(path)
    assert list(tree.children) == ["loss", "gradients", "parameters"]  # compute order
    checked = 0
    for kind in tree.children:
        ds = tree[kind].to_dataset()
        for name, var in ds.data_vars.items():
            assert var.dims[:2] == ("rank", "step")
            for r in ds["rank"].values:
                for s in ds["step"].values:
                    got = var.sel(rank=r, step=s).values
                    np.testing.assert_array_equal(got, _plain_zarr(path, int(r), kind, name, int(s)))
                    checked += 1
    assert checked == 4 * (3 + 3 + 3 * 4)  # loss, g over steps 1-3; w, h, n over steps 0-3


def test_dtypes_dims_coords_and_attrs(tmp_path):
    tree = tracekit.open(write_store(str(tmp_path / "s")))
    p = tree["parameters"]
    assert p["h"].dtype == np.float32 and p["h"].attrs["recorded_dtype"] == "bfloat16"
    assert p["n"].dtype == np.int64 and p["n"].dims == ("rank", "step")
    assert p["w"].dims == ("rank", "step", "w_dim0", "w_dim1")
    assert list(p.step.values) == [0, 1, 2, 3]
    assert list(tree["gradients"].step.values) == [1, 2, 3]
    assert float(p["h"].sel(rank=3, step=0, h_dim0=0)) == 4.0  # bfloat16 decoded
    root = tree.to_dataset()
    assert list(root.dp_rank.values) == [0, 0, 1, 1] and list(root.tp_rank.values) == [0, 1, 0, 1]
    assert list(root.mesh_dp.values) == [0, 0, 1, 1] and list(root.mesh_tp.values) == [0, 1, 0, 1]
    assert root.attrs["device"] == "cpu" and root.attrs["backend"] == "gloo"
    assert root.attrs["command"] == ["train.py", "--device", "cpu"] and root.attrs["world_size"] == 4
    # rank coordinates are inherited by every kind, so selecting by them works anywhere
    grads = tree["gradients"].to_dataset()
    sel = grads.where(grads.tp_rank == 1, drop=True)
    assert list(sel["rank"].values) == [1, 3]


def test_missing_last_steps_read_as_nan(tmp_path):
    # rank 1 died after step 1 (steps 2-3 written but not completed), rank 3 after step 2
    path = write_store(str(tmp_path / "s"), completed={1: 1, 3: 2})
    tree = tracekit.open(path)
    g = tree["gradients"]["g"]
    assert list(tree["gradients"].step.values) == [1, 2, 3]  # the union: rank 0 and 2 finished
    assert g.dtype == np.float32
    assert np.isnan(g.sel(rank=1, step=2)).all() and np.isnan(g.sel(rank=1, step=3)).all()
    assert float(g.sel(rank=1, step=1)[0, 0]) == 1.25
    assert np.isnan(g.sel(rank=3, step=3)).all() and float(g.sel(rank=3, step=2)[0, 0]) == 2.75
    rec = tree["gradients"]["recorded"]
    assert rec.sel(rank=1).values.tolist() == [True, False, False]
    # an integer tensor with holes becomes float so the holes can be NaN
    n = tree["parameters"]["n"]
    assert n.dtype == np.float64 and np.isnan(float(n.sel(rank=1, step=3))) and float(n.sel(rank=1, step=1)) == 101
    root = tree.to_dataset()
    assert root.last_step.values.tolist() == [3, 1, 3, 2]
    assert root.steps_completed.values.tolist() == [3, 1, 3, 2]


def test_all_ranks_missing_last_steps_shows_what_exists(tmp_path):
    tree = tracekit.open(write_store(str(tmp_path / "s"), completed={r: 2 for r in range(4)}))
    assert list(tree["gradients"].step.values) == [1, 2]
    assert not np.isnan(tree["gradients"]["g"].values).any()


def test_open_reads_only_metadata(tmp_path):
    # 64 ranks, 10 steps; then every chunk is deleted: open must still succeed, computing must not.
    # Rank 0 is written by the writer; ranks 1-63 are copies of it with their own coordinates
    # (writing 64 ranks for real costs ~10 s of chunk writes on a busy CI machine).
    path = str(tmp_path / "big")
    create_store(path, {"command": ["x"]}, format_version=1)  # format 1: the chunk files are per rank
    w = RankWriter(path, 0, {"coords": _coords(0, 64, tp=4)})
    for s in range(1, 11):
        w.write(s, "gradients", [TensorData("a", "float32", (4,), np.full(4, s, np.float32)),
                                 TensorData("b", "float32", (2, 2), np.ones((2, 2), np.float32))])
        w.complete_step(s)
    w.close()
    for r in range(1, 64):
        shutil.copytree(os.path.join(path, "rank_0"), os.path.join(path, f"rank_{r}"))
        meta_file = os.path.join(path, f"rank_{r}", "zarr.json")
        with open(meta_file) as f:
            meta = json.load(f)
        meta["attributes"]["coords"] = _coords(r, 64, tp=4)
        with open(meta_file, "w") as f:
            json.dump(meta, f)
    value = float(tracekit.open(path)["gradients"]["a"].sel(rank=63, step=10)[0])
    assert value == 10.0
    removed = 0
    for root, dirs, _files in os.walk(path):
        if "c" in dirs:
            shutil.rmtree(os.path.join(root, "c"))
            removed += 1
    assert removed == 64
    tree = tracekit.open(path)
    assert tree["gradients"]["a"].shape == (64, 10, 4) and tree["gradients"]["b"].shape == (64, 10, 2, 2)
    assert tree.to_dataset().tp_rank.values.tolist()[:5] == [0, 1, 2, 3, 0]
    # the data was never read: computing now meets the missing chunks, which is damage, not zeros
    # (named as every reader names it: the one read path, store/planner.py)
    with pytest.raises(StoreError, match=r"rank 63 gradients step 10: unreadable data \(FileNotFoundError: chunk c/9/0 of float32 is missing\)"):
        tree["gradients"]["a"].sel(rank=63, step=10).values


def test_shapes_differing_over_ranks_become_per_rank_variables(tmp_path):
    tree = tracekit.open(write_store(str(tmp_path / "s"), shard_shapes=True))
    ds = tree["gradients"].to_dataset()
    assert "g" not in ds
    assert sorted(ds.data_vars) == ["g@rank0", "g@rank1", "g@rank2", "g@rank3"]
    v = ds["g@rank2"]
    assert v.dims == ("step", "g@rank2_dim0", "g@rank2_dim1") and v.shape == (3, 3, 2) and v.attrs["rank"] == 2
    assert float(v.sel(step=2)[0, 0]) == 2.5


def test_corrupt_chunk_is_one_store_error(tmp_path):
    path = write_store(str(tmp_path / "s"), version=1)
    chunk = os.path.join(path, "rank_1", "gradients", "float32", "c", "1", "0")
    with open(chunk, "wb") as f:
        f.write(b"xx")  # truncated
    g = tracekit.open(path)["gradients"]["g"]
    with pytest.raises(StoreError, match=r"rank 1 gradients step 2: unreadable data"):
        g.sel(rank=1, step=2).values
    assert float(g.sel(rank=1, step=1)[0, 0]) == 1.25  # the rest stays readable


def test_kinds_filter_and_errors(tmp_path):
    path = write_store(str(tmp_path / "s"))
    assert list(tracekit.open(path, kinds="loss").children) == ["loss"]
    with pytest.raises(tracekit.TracekitError, match="no deltas data"):
        tracekit.open(path, kinds=["deltas"])
    with pytest.raises(StoreError, match="no such store"):
        tracekit.open(str(tmp_path / "nope"))


def test_open_returns_a_datatree_and_import_stays_light(tmp_path):
    assert isinstance(tracekit.open(write_store(str(tmp_path / "s"))), xr.DataTree)
    import subprocess
    import sys

    code = "import sys, tracekit; tracekit.open; print('xarray' in sys.modules, 'dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.split() == ["False", "False"]


def test_deleted_chunk_is_one_store_error_not_zeros(tmp_path):
    # the writer writes every chunk, all-zero ones included: a missing one is damage
    path = write_store(str(tmp_path / "s"), version=1)
    os.remove(os.path.join(path, "rank_1", "gradients", "float32", "c", "1", "0"))
    g = tracekit.open(path)["gradients"]["g"]
    with pytest.raises(StoreError, match=r"rank 1 gradients step 2: unreadable data \(FileNotFoundError: chunk c/1/0 of float32 is missing\)"):
        g.sel(rank=1, step=2).values
    assert float(g.sel(rank=1, step=1)[0, 0]) == 1.25  # the rest stays readable
