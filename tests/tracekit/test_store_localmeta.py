"""A local group's members read without zarr's event loop (tracekit/store/localmeta.py): the same
members zarr lists, and None (zarr lists them, and names the problem) for anything unexpected."""

import json
import os

import pytest
import zarr

from tracekit import open_store
from tracekit.errors import StoreError
from tracekit.store.localmeta import local_members
from tracekit.store.meta import TensorInfo, index_of, misplaced
from tracekit.testing import write_store

from tests.tracekit.test_fuzz_store import _data


def _listed(members):
    return sorted((name, type(node).__name__, dict(node.attrs)) for name, node in members)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_members_are_the_ones_zarr_lists(tmp_path, version):
    path = write_store(tmp_path / "s", _data(), format_version=version)
    root = zarr.open_group(path, mode="r")
    assert _listed(local_members(root)) == _listed(root.members())
    rank = root["rank_0"]
    mine = local_members(rank, max_depth=1)
    assert any("/" in name for name, _ in mine)  # the kinds' index arrays too
    assert _listed(mine) == _listed(rank.members(max_depth=1))
    for name, node in mine:  # the nodes read as zarr's own
        if isinstance(node, zarr.Array):
            assert (node[...] == rank[name][...]).all()


def test_stray_files_and_folders_without_metadata_are_no_members(tmp_path):
    path = write_store(tmp_path / "s", _data(), format_version=3)
    open(os.path.join(path, "rank_0", "notes.txt"), "w").close()
    os.makedirs(os.path.join(path, "rank_0", "scratch"))
    rank = zarr.open_group(os.path.join(path, "rank_0"), mode="r")
    assert "notes.txt" not in dict(local_members(rank)) and "scratch" not in dict(local_members(rank))


@pytest.mark.parametrize("damage", ["fifo", "json", "v2", "node_type"])
def test_anything_unexpected_is_left_to_zarr(tmp_path, damage):
    path = write_store(tmp_path / "s", _data(), format_version=3)
    meta = os.path.join(path, "rank_0", "parameters", "zarr.json")
    if damage == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.unlink(meta)
        os.mkfifo(meta)
    else:
        doc = json.load(open(meta))
        if damage == "json":
            doc = "{not json"
        elif damage == "v2":
            doc["zarr_format"] = 2
        else:
            doc["node_type"] = "table"
        with open(meta, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
    rank = zarr.open_group(os.path.join(path, "rank_0"), mode="r")
    assert local_members(rank, max_depth=1) is None  # never hangs on the FIFO either


def test_damaged_metadata_is_still_one_line_from_the_reader(tmp_path):
    path = write_store(tmp_path / "s", _data(), format_version=3)
    with open(os.path.join(path, "rank_0", "parameters", "zarr.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(StoreError, match="rank 0: unreadable metadata below it .JSONDecodeError"):
        open_store(path).rank(0).tensors("parameters")


def test_a_misplaced_entry_is_found_without_building_the_expected_index():
    good, _ = index_of([("a", "float32", (3, 2)), ("b", "bfloat16", (4,)), ("c", "float32", (5,))])
    assert misplaced(good) is None
    for i, wrong in ((2, {"offset": 5}), (1, {"offset": 1}), (0, {"array": "float64"})):
        infos = list(good)
        infos[i] = TensorInfo(**{**infos[i].__dict__, **wrong})
        assert misplaced(infos) is infos[i]
