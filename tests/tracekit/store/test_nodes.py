"""The writer makes its groups and row arrays on a local store itself (tracekit/store/nodes.py): each
document must be the bytes zarr writes for the same node, and a recorded run's store the store
zarr's path makes, but for its times."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

from tracekit import open_store
from tracekit.store import RankWriter, TensorData, create_store, io, nodes, writer
from tracekit.store.dtypes import _BIT_STORED, _NUMPY_NATIVE, storage_dtype
from tracekit.store.format import MAX_CHUNK_BYTES
from tracekit.store.verify import verify_store
from tracekit.writer.handoff import Handoff

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STORAGE_DTYPES = sorted({storage_dtype(d).name for d in (*_NUMPY_NATIVE, *_BIT_STORED)})


def _raw(folder):
    with open(os.path.join(folder, "zarr.json"), "rb") as f:
        return f.read()


def _both(tmp_path):
    """A zarr group and the same folder's twin as a LocalGroup, side by side, empty."""
    via_zarr = io.compact_metadata(lambda: zarr.open_group(str(tmp_path / "zarr"), mode="w"))()
    os.mkdir(tmp_path / "direct")
    return via_zarr, nodes.LocalGroup(str(tmp_path / "direct"), "", None)


@pytest.mark.parametrize("sep", ["/", "."])
@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
def test_a_row_array_is_the_bytes_zarr_writes_for_every_stored_dtype(tmp_path, dtype, sep):
    """Widths of one element, a few, and more than one chunk holds (the chunk narrower than the row),
    as writer._row_array makes them; and a row's chunk files where zarr's keys put them, with either
    separator of zarr's default chunk keys ("/" to format 5, "." in format 6)."""
    via_zarr, direct = _both(tmp_path)
    itemsize = np.dtype(dtype).itemsize
    for width in (1, 7, MAX_CHUNK_BYTES // itemsize + 3):
        name = f"a{width}"
        made = io.compact_metadata(writer._row_array)(via_zarr, name, width, dtype, sep)
        local = writer._row_array(direct, name, width, dtype, sep)
        assert isinstance(local, nodes.LocalArray) and not isinstance(made, nodes.LocalArray)
        assert _raw(tmp_path / "direct" / name) == _raw(tmp_path / "zarr" / name), (dtype, width)
        assert local.doc == json.loads(_raw(tmp_path / "zarr" / name))  # what NodeMeta takes over
        assert (local.shape, local.chunks, local.dtype, local.path) == (made.shape, made.chunks, made.dtype, made.path)
    # a row through each, where zarr reads it back: the same chunk files
    width = 7
    row = np.arange(width).astype(dtype)
    for group, folder in ((via_zarr, "zarr"), (direct, "direct")):
        arr = group[f"a{width}"] if folder == "zarr" else writer._row_array(direct, "b", width, dtype, sep)
        io.compact_metadata(writer.NodeMeta(arr).resize)((1, width))
        writer._write_row_chunks(arr, 0, [row])
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "direct" / "b"), mode="r")[0], row)
    key = os.path.join(*f"c{sep}0{sep}0".split("/"))
    with open(tmp_path / "direct" / "b" / key, "rb") as a, open(tmp_path / "zarr" / f"a{width}" / key, "rb") as b:
        assert a.read() == b.read()


ATTRIBUTES = [None, {}, {"coords": {"rank": 3, "world_size": 4}, "run_id": None, "completed_steps": [], "status": "running"},
              {"x": float("nan"), "y": [1.5, -float("inf"), None, True], "name\u00e9": "w\u00e9\n\"q\"", "deep": {"a": {"b": [[]]}}}]


@pytest.mark.parametrize("attributes", ATTRIBUTES, ids=["none", "empty", "rank", "odd"])
def test_a_group_is_the_bytes_zarr_writes(tmp_path, attributes):
    via_zarr, direct = _both(tmp_path)
    io.compact_metadata(nodes.child_group)(via_zarr, "g", attributes)
    local = nodes.child_group(direct, "g", attributes)
    assert _raw(tmp_path / "direct" / "g") == _raw(tmp_path / "zarr" / "g")
    inner = nodes.child_group(local, "h")  # below a group made here
    io.compact_metadata(nodes.child_group)(via_zarr["g"], "h")
    assert inner.path == "g/h" and _raw(tmp_path / "direct" / "g" / "h") == _raw(tmp_path / "zarr" / "g" / "h")


def test_a_node_that_exists_is_refused_and_left_alone(tmp_path):
    _, direct = _both(tmp_path)
    nodes.child_group(direct, "g", {"a": 1})
    before = _raw(tmp_path / "direct" / "g")
    for make in (lambda: nodes.child_group(direct, "g"), lambda: nodes.row_array(direct, "g", 3, 3, np.uint8)):
        with pytest.raises(Exception, match="exists already"):
            make()
    assert _raw(tmp_path / "direct" / "g") == before
    os.mkdir(tmp_path / "direct" / "empty")  # a folder without a document is no node: zarr makes one there too
    nodes.child_group(direct, "empty")
    assert json.loads(_raw(tmp_path / "direct" / "empty"))["node_type"] == "group"


# Put first on the writer process's PYTHONPATH: its nodes made by zarr (as at a URL), or, by default,
# a note at its exit of whether it imported zarr.
WRITER_SITE = textwrap.dedent("""
    import atexit, os, sys
    if "tracekit.writer.spool_writer" in sys.orig_argv:
        if os.environ.get("TK_TEST_THROUGH_ZARR"):
            from tracekit.store import nodes
            nodes.direct = lambda location: False
        def note():
            with open(os.environ["TK_TEST_IMPORTS"], "a") as f:
                f.write(("zarr" if "zarr" in sys.modules else "no zarr") + "\\n")
        atexit.register(note)
""")
TIME = re.compile(rb'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"')


def _record(path, tmp_path, monkeypatch, through_zarr: bool) -> str:
    """A small run of 2 ranks through the writer program (a rank's Handoff): 3 steps of 3 kinds,
    dtypes and shapes as a rank sends them, a tensor sent as its hash alone (--full), a step's
    attributes; `through_zarr`: the writer's nodes and documents made by zarr."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(WRITER_SITE)
    imports = tmp_path / "imports.txt"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), REPO]))
    monkeypatch.setenv("TK_TEST_IMPORTS", str(imports))
    if through_zarr:
        monkeypatch.setenv("TK_TEST_THROUGH_ZARR", "1")
    else:
        monkeypatch.delenv("TK_TEST_THROUGH_ZARR", raising=False)
    create_store(path, {"command": ["train.py"]})
    for rank in (0, 1):
        handoff = Handoff(path, rank, {"coords": {"rank": rank, "world_size": 2}, "run": {"device": "cpu"},
                                       "config": {"full": ["parameters:*"]}}, 1 << 24)
        rng = np.random.default_rng(rank)
        for step in (0, 1, 2, 3):
            params = [("parameters", TensorData(f"layers.{i}.weight", dt, shape, rng.standard_normal(shape).astype(storage_dtype(dt))))
                      for i, (dt, shape) in enumerate([("float32", (64, 3)), ("float64", (5,)), ("int64", ()),
                                                       ("bfloat16", (4, 4)), ("float16", (3000,))])]
            if step == 0:
                handoff.put(step, params, complete=False)
                continue
            h = np.frombuffer(bytes(range(16)), np.uint8)
            grads = [("gradients", TensorData("layers.0.weight", "float32", (64, 3), np.full((64, 3), step, np.float32))),
                     ("gradients", TensorData("frozen", "float32", (2,), np.zeros(0, np.float32), digest=h.tobytes(),
                                              summary=np.zeros(writer.N_FIELDS)))]
            loss = [("loss", TensorData("loss", "float32", (), np.array(1.0 / step, np.float32)))]
            handoff.put(step, params + grads + loss, complete=True)
        handoff.close("finished", {"note": {"step": 3}})
    return imports.read_text()


def test_a_recorded_run_holds_the_documents_zarr_makes_and_its_writers_never_import_zarr(tmp_path, monkeypatch):
    direct, via_zarr = str(tmp_path / "direct"), str(tmp_path / "zarr")
    assert _record(via_zarr, tmp_path, monkeypatch, through_zarr=True).splitlines() == ["zarr", "zarr"]
    (tmp_path / "imports.txt").unlink()
    assert _record(direct, tmp_path, monkeypatch, through_zarr=False).splitlines() == ["no zarr", "no zarr"]
    docs = {os.path.relpath(folder, direct) for folder, _, files in os.walk(direct) if "zarr.json" in files}
    assert docs == {os.path.relpath(folder, via_zarr) for folder, _, files in os.walk(via_zarr) if "zarr.json" in files}
    assert {"rank_1", "rank_1/gradients/summary", "rank_0/loss/hash", "rank_0/parameters/finite"} <= docs
    for node in docs:  # byte for byte, but for the times
        assert TIME.sub(b"T", _raw(os.path.join(direct, node))) == TIME.sub(b"T", _raw(os.path.join(via_zarr, node))), node
    view = open_store(direct).rank(1)
    assert view.completed_steps == [1, 2, 3] and view.attrs["note"] == {"step": 3} and view.attrs["status"] == "finished"
    assert view.read("parameters", 3, "layers.4.weight").shape == (3000,)  # (--full: only the parameters keep their bytes)
    assert verify_store(direct).ok


COMPACT_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    from tracekit.store import RankWriter, TensorData, create_store
    assert "zarr" not in sys.modules
    url = sys.argv[1]
    create_store(url, {})
    w = RankWriter(url, 0, {"coords": {"rank": 0}})
    w.write(1, "loss", [TensorData("loss", "float32", (), np.array(0.5, np.float32))])
    w.complete_step(1)
    w.close()
    from tracekit.store.location import resolve
    where = resolve(url)
    for key in ("zarr.json", "rank_0/zarr.json", "rank_0/loss/zarr.json", "rank_0/loss/hash/zarr.json"):
        raw = where.read_bytes(key)
        assert raw is not None and b"\\n" not in raw, (key, raw[:80])
    print("compact")
""")


@pytest.mark.parametrize("where", ["folder", "memory"])
def test_documents_are_compact_when_the_first_call_imports_zarr(tmp_path, where):
    """compact_metadata in a process that has not imported zarr yet: zarr is then imported inside
    the call (create_store, a writer at a URL), and must still write its documents unindented."""
    url = str(tmp_path / "s") if where == "folder" else "memory://compact/s"
    out = subprocess.run([sys.executable, "-c", COMPACT_IN_A_FRESH_PROCESS, url], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "compact", out.stderr[-3000:]


def test_the_rank_group_made_directly_refuses_a_second_writer_of_its_rank(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {})
    RankWriter(path, 0, {}).close()
    with pytest.raises(Exception, match="already holds data of rank 0"):
        RankWriter(path, 0, {})
