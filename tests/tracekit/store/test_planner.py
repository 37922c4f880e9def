"""The read planner (store/planner.py) and the format readers (store/formats/): a request for a
region of a tensor reads exactly the saved pieces it overlaps, whatever the format."""

import os
import re
from pathlib import Path

import numpy as np
import pytest

from tracekit import StoreError, open_store
from tracekit.store import RankWriter, TensorData, create_store, planner
from tracekit.store.formats import READERS
from tracekit.store.shards import Shard
from tracekit.testing import write_store

RANKS = 2
W = np.arange(35, dtype=np.float32).reshape(7, 5) - 3.5  # sharded by rows: 4 + 3
B = np.arange(6, dtype=np.float32) * 0.25  # whole on every rank


def _sharded(path, version):
    create_store(path, {"command": ["test"]}, format_version=version)
    for r in range(RANKS):
        lo, hi = (0, 4) if r == 0 else (4, 7)
        part = np.ascontiguousarray(W[lo:hi])
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": RANKS}})
        w.write(1, "parameters", [TensorData("w", "float32", part.shape, part, Shard(W.shape, (lo, 0), part.shape, (0, 1))),
                                  TensorData("b", "float32", B.shape, B)])
        w.complete_step(1)
        w.close()
    return path


@pytest.mark.parametrize("version", [2, 3, 4])
def test_a_region_reads_only_the_pieces_it_overlaps(tmp_path, version):
    view = open_store(_sharded(str(tmp_path / "s"), version)).rank(1)
    inside = planner.plan_read(view, "parameters", 1, "w", ((1, 1), (2, 3)))  # rows 1-2: rank 0's piece alone
    assert [i.piece for i in inside.items] == [((0, 0), (4, 5))]
    across = planner.plan_read(view, "parameters", 1, "w", ((3, 0), (2, 5)))  # rows 3-4: both pieces
    assert [(i.piece, i.overlap) for i in across.items] == [(((0, 0), (4, 5)), ((3, 0), (1, 5))),
                                                           (((4, 0), (3, 5)), ((4, 0), (1, 5)))]
    assert all(i.digest is not None and i.key.startswith("objects/") for i in across.items)
    np.testing.assert_array_equal(view.read_region("parameters", 1, "w", ((3, 0), (2, 5))), W[3:5])
    np.testing.assert_array_equal(view.read_region("parameters", 1, "w", ((1, 1), (2, 3))), W[1:3, 1:4])
    np.testing.assert_array_equal(view.read_region("parameters", 1, "w"), W)
    np.testing.assert_array_equal(view.read_region("parameters", 1, "b", ((2,), (3,))), B[2:5])


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_every_format_reads_the_same_regions(tmp_path, version):
    path = write_store(tmp_path / "s", {0: {1: {"parameters": {"w": W, "b": B}}}}, format_version=version)
    view = open_store(path).rank(0)
    assert view.store.format is READERS[version]
    assert view.saves_pieces == (version >= 2)
    np.testing.assert_array_equal(view.read_region("parameters", 1, "w", ((2, 1), (3, 2))), W[2:5, 1:3])
    np.testing.assert_array_equal(view.read_region("parameters", 1, "b"), B)


def test_a_region_outside_the_tensor_is_refused(tmp_path):
    view = open_store(_sharded(str(tmp_path / "s"), 4)).rank(0)
    with pytest.raises(ValueError, match="outside tensor 'w'"):
        planner.plan_read(view, "parameters", 1, "w", ((6, 0), (2, 5)))


def test_a_damaged_piece_is_damage_when_a_region_touches_it(tmp_path):
    path = _sharded(str(tmp_path / "s"), 2)
    view = open_store(path).rank(0)
    key = view.pieces("parameters", 1, "w")[1].loc.key
    with open(os.path.join(path, *key.split("/")), "r+b") as f:
        f.write(b"\xff\xff\xff\x7f")
    view = open_store(path).rank(0)
    np.testing.assert_array_equal(view.read_region("parameters", 1, "w", ((0, 0), (4, 5))), W[:4])  # the intact piece
    with pytest.raises(StoreError, match="damaged store: .* do not match their hash"):
        view.read_region("parameters", 1, "w", ((3, 0), (2, 5)))


@pytest.mark.parametrize("version, message", [(99, "newer than this tracekit reads"), (0, "which no tracekit wrote")])
def test_a_format_no_reader_knows_is_one_line(tmp_path, version, message):
    path = write_store(tmp_path / "s", {0: {1: {"parameters": {"b": B}}}})
    zarr_json = Path(path) / "zarr.json"
    zarr_json.write_text(re.sub(r'"format_version": \d+', f'"format_version": {version}', zarr_json.read_text()))
    with pytest.raises(StoreError, match=message):
        open_store(path)


def test_format_versions_are_tested_only_in_store_formats():
    """Adding or dropping a format touches store/formats/, not its readers or the writer."""
    root = Path(__file__).resolve().parents[3]
    compared = re.compile(r"format_version\s*(==|!=|>=|<=|>|<)|(==|!=|>=|<=|>|<)\s*\S*format_version")
    found = [f"{p.relative_to(root)}:{n}" for folder in ("tracekit", "cli", "recorders") for p in (root / folder).rglob("*.py")
             if "formats" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if compared.search(line)]
    assert found == []


@pytest.mark.parametrize("second, message", [((3, 4), "overlap"), ((5, 2), "do not cover it")])
def test_pieces_that_do_not_tile_the_tensor_are_damage_for_every_read(tmp_path, second, message):
    """Rank 1's piece overlaps rank 0's (rows 3-6 against 0-3) or leaves row 4 out (rows 5-6):
    whole reads, region reads and the xarray-facing read() refuse it before reading a byte,
    never filling a gap with whatever memory held."""
    path = str(tmp_path / "s")
    create_store(path, {"command": ["test"]})
    for r, (lo, n) in enumerate([(0, 4), second]):
        part = np.ascontiguousarray(W[lo:lo + n])
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": RANKS}})
        w.write(1, "parameters", [TensorData("w", "float32", part.shape, part, Shard(W.shape, (lo, 0), part.shape, (0, 1)))])
        w.complete_step(1)
        w.close()
    view = open_store(path).rank(0)
    for read in (lambda: view.read("parameters", 1, "w"), lambda: view.read_region("parameters", 1, "w", ((0, 0), (2, 5))),
                 lambda: view.assemble("parameters", 1, "w")):
        with pytest.raises(StoreError, match=f"damaged store: .*tensor w: the pieces of ranks \\[0, 1\\] {message}"):
            read()


@pytest.mark.parametrize("version", [1, 4])
def test_export_and_replay_reads_execute_read_plans(tmp_path, monkeypatch, version):
    """`tracekit export` and replay's read_kind ask the planner for each tensor (FORMAT.md says so)."""
    from tracekit.interchange.export import export_file

    path = write_store(tmp_path / "s", {0: {1: {"parameters": {"w": W, "b": B}}}}, format_version=version)
    asked = []
    real = planner.plan_read
    monkeypatch.setattr(planner, "plan_read", lambda view, kind, step, name, region=None: asked.append(name) or real(view, kind, step, name, region))
    export_file(path, str(tmp_path / "out.safetensors"), 1)
    assert sorted(asked) == ["b", "w"]
    asked.clear()
    got = open_store(path).rank(0).read_kind("parameters", 1)
    assert sorted(asked) == ["b", "w"]
    np.testing.assert_array_equal(got["w"], W)
