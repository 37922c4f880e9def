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

from tests.builders import small_run_data


def _listed(members):
    return sorted((name, type(node).__name__, dict(node.attrs)) for name, node in members)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_members_are_the_ones_zarr_lists(tmp_path, version):
    path = write_store(tmp_path / "s", small_run_data(), format_version=version)
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
    path = write_store(tmp_path / "s", small_run_data(), format_version=3)
    open(os.path.join(path, "rank_0", "notes.txt"), "w").close()
    os.makedirs(os.path.join(path, "rank_0", "scratch"))
    rank = zarr.open_group(os.path.join(path, "rank_0"), mode="r")
    assert "notes.txt" not in dict(local_members(rank)) and "scratch" not in dict(local_members(rank))


@pytest.mark.parametrize("damage", ["fifo", "json", "v2", "node_type"])
def test_anything_unexpected_is_left_to_zarr(tmp_path, damage):
    path = write_store(tmp_path / "s", small_run_data(), format_version=3)
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
    path = write_store(tmp_path / "s", small_run_data(), format_version=3)
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


@pytest.mark.parametrize("version", [3, 5])  # 5: the index is one JSON text, compared as a string
def test_equal_indexes_are_parsed_once_per_comparison_and_damage_is_never_masked(tmp_path, version):
    """A store opened to share with another reuses the other's parsed index where its entries are
    equal (the same TensorInfo objects), parses its own where they differ, and still refuses a
    damaged one."""
    from tracekit.store import open_store as open_
    from tracekit.store.meta import edit_index

    data = small_run_data()
    ref = open_(write_store(tmp_path / "ref", data, format_version=version))
    same = open_(write_store(tmp_path / "same", data, format_version=version), share_with=ref)
    other = {r: {s: {k: {n: v * 2 for n, v in ts.items()} for k, ts in kinds.items()} for s, kinds in steps.items()}
             for r, steps in data.items()}
    renamed = {r: {s: {k: {f"x.{n}": v for n, v in ts.items()} for k, ts in kinds.items()} for s, kinds in steps.items()}
               for r, steps in data.items()}
    equal = open_(write_store(tmp_path / "equal", other, format_version=version), share_with=ref)
    differ = open_(write_store(tmp_path / "differ", renamed, format_version=version), share_with=ref)
    mine = ref.rank(0).tensors("parameters")
    assert all(a is b for a, b in zip(same.rank(0).tensors("parameters"), mine, strict=True))
    assert all(a is b for a, b in zip(equal.rank(0).tensors("parameters"), mine, strict=True))  # values differ, index not
    theirs = differ.rank(0).tensors("parameters")
    assert [t.name for t in theirs] == [f"x.{t.name}" for t in mine]

    damaged_path = write_store(tmp_path / "damaged", data, format_version=version)
    meta = os.path.join(damaged_path, "rank_0", "parameters", "zarr.json")
    doc = json.load(open(meta))
    edit_index(doc["attributes"], lambda e: e[-1].update(offset=e[-1]["offset"] + 1))  # an address that does not follow from the index
    with open(meta, "w") as f:
        json.dump(doc, f)
    damaged = open_(damaged_path, share_with=ref)
    with pytest.raises(StoreError, match="does not follow from the index"):
        damaged.rank(0).tensors("parameters")


def test_shared_indexes_pass_over_malformed_entries():
    from tracekit.store.meta import SharedIndexes

    shared = SharedIndexes()
    for entries in (None, "x", [1], [{"name": ["a"]}], [{}]):
        assert shared.get(entries, 3) is None
        shared.put(entries, 3, "parsed")  # kept nowhere
        assert shared.get(entries, 3) is None
    shared.put([{"name": "a"}], 3, "parsed")
    assert shared.get([{"name": "a"}], 3) == "parsed" and shared.get([{"name": "a"}], 2) is None
    shared.put('[{"name":"a"}]', 5, "text")  # format 5: the JSON text, compared as a string
    assert shared.get('[{"name":"a"}]', 5) == "text" and shared.get('[{"name":"b"}]', 5) is None


def test_byte_equal_metadata_is_parsed_once_and_each_store_still_reads_its_own_bytes(tmp_path):
    """Two stores opened to share (a comparison's sides) parse each distinct zarr.json once: a kind
    whose metadata is byte-equal in both gets the same metadata object, yet every node reads its own
    store's files; metadata that differs is parsed for itself."""
    import numpy as np

    from tracekit.store import open_store as open_

    data = small_run_data()
    doubled = {r: {s: {k: {n: v * 2 for n, v in ts.items()} for k, ts in kinds.items()} for s, kinds in steps.items()}
               for r, steps in data.items()}
    ref = open_(write_store(tmp_path / "ref", data, format_version=3))
    cand = open_(write_store(tmp_path / "cand", doubled, format_version=3), share_with=ref)
    alone = open_(write_store(tmp_path / "alone", data, format_version=3))
    kind = "parameters"
    for a, b in ((ref, cand), (ref, alone)):
        raw = [open(os.path.join(s.path, "rank_0", kind, "zarr.json"), "rb").read() for s in (a, b)]
        assert raw[0] == raw[1]  # the same model and layout: the same bytes
    ref_group, cand_group = ref.rank(0)._kind_groups[kind], cand.rank(0)._kind_groups[kind]
    assert ref_group.metadata is cand_group.metadata
    assert alone.rank(0)._kind_groups[kind].metadata is not ref_group.metadata  # not opened to share
    name = ref.rank(0).tensors(kind)[0].name
    step = ref.rank(0).steps(kind)[-1]
    assert np.array_equal(cand.rank(0).read(kind, step, name), 2 * ref.rank(0).read(kind, step, name))


def test_metadata_that_fails_to_parse_is_not_kept():
    from tracekit.store.localmeta import ParsedNodes, _builders, _Unexpected

    parsed = ParsedNodes()
    for raw in (b"{not json", b'{"zarr_format": 2}', b'{"zarr_format": 3, "node_type": "table"}'):
        with pytest.raises(_Unexpected):
            parsed.parse(raw, _builders())
    group = b'{"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}'
    first = parsed.parse(group, _builders())
    assert first[0] == "group" and first[1].attributes == {"a": 1}
    assert parsed.parse(group, _builders()) is first
    assert len(parsed._by_bytes) == 1
