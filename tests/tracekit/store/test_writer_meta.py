"""The writer keeps its rank's zarr.json documents itself (tracekit/store/nodemeta.py) on a local store:
the documents must be what zarr writes, open with zarr, xarray and tracekit, and a writer killed at
any point must leave a readable store whose unlisted rows do not count."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

import tracekit
from tracekit import open_store
from tracekit.store import RankWriter, TensorData, create_store, finalize_store
from tracekit.store import nodemeta
from tracekit.store.verify import verify_store

TIMES = ("start_time", "end_time")


def _write(path, version, steps=3, ranks=2, shards=False):
    create_store(path, {"command": ["test"]}, format_version=version)
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks}, "run": {"device": "cpu"}})
        for s in range(steps + 1):
            w.write(s, "parameters", [
                TensorData("w", "float32", (2, 3), np.arange(6, dtype=np.float32) * (s + 1) + r),
                TensorData("n", "int64", (), np.array(s, dtype=np.int64)),
            ])
            if s:
                w.write(s, "loss", [TensorData("loss", "float32", (), np.array(0.5 / s, dtype=np.float32))])
                w.complete_step(s)
        w.update_attrs(extra={"note": "x"})
        w.close()
    return path


def _docs(path):
    """Every zarr.json below the store, parsed, start/end times dropped (they differ between runs)."""
    out = {}
    for folder, _, files in os.walk(path):
        if "zarr.json" in files:
            with open(os.path.join(folder, "zarr.json")) as f:
                doc = json.load(f)
            attrs = doc.get("attributes", {})
            for t in TIMES:  # the root's times are inside its `tracekit` attribute
                attrs.pop(t, None)
                if isinstance(attrs.get("tracekit"), dict):
                    attrs["tracekit"].pop(t, None)
            out[os.path.relpath(folder, path)] = doc
    return out


def _raw(path, node):
    with open(os.path.join(path, node, "zarr.json"), "rb") as f:
        return f.read().decode()


def _through_zarr(monkeypatch):
    """The writer's nodes made by zarr and NodeMeta taking zarr's own path, as for a store at a URL."""
    from tracekit.store import nodes

    monkeypatch.setattr(nodes, "direct", lambda location: False)
    real = nodemeta.NodeMeta.__init__

    def init(self, node):
        real(self, node)
        self.file, self.doc = None, None

    monkeypatch.setattr(nodemeta.NodeMeta, "__init__", init)


@pytest.mark.parametrize("version", [1, 2])
def test_direct_metadata_is_what_zarr_writes(tmp_path, monkeypatch, version):
    direct = _write(str(tmp_path / "direct"), version)
    with monkeypatch.context() as m:
        _through_zarr(m)
        via_zarr = _write(str(tmp_path / "zarr"), version)
    a, b = _docs(direct), _docs(via_zarr)
    assert a == b
    assert a["rank_1/parameters"]["attributes"]["steps"] == [0, 1, 2, 3]
    assert a["rank_1"]["attributes"]["completed_steps"] == [1, 2, 3]
    assert a["rank_1"]["attributes"]["status"] == "finished" and a["rank_1"]["attributes"]["extra"] == {"note": "x"}
    # byte for byte what zarr writes (compact, io.compact_metadata), but where the times differ
    for node in a:
        if node.count(os.sep) >= 1:  # the kinds' groups and arrays
            assert _raw(direct, node) == _raw(via_zarr, node), node
    assert "\n" not in _raw(direct, "rank_0/loss")
    # no temporary left behind
    assert not [f for _, _, fs in os.walk(direct) for f in fs if f.endswith(".partial")]


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_written_directly_opens_with_zarr_xarray_and_tracekit(tmp_path, version):
    path = _write(str(tmp_path / "s"), version)
    g = zarr.open_group(path, mode="r", use_consolidated=False)
    for name, arr in g["rank_0/loss"].arrays():
        assert arr.shape[0] == 3, name  # one row per listed step
    store = open_store(path)
    assert store.rank(1).completed_steps == [1, 2, 3]
    np.testing.assert_array_equal(store.rank(1).read("parameters", 2, "w"),
                                  np.arange(6, dtype=np.float32).reshape(2, 3) * 3 + 1)
    assert verify_store(path).ok
    finalize_store(path, 0)
    # the consolidated metadata finalization writes sees the grown shapes
    consolidated = zarr.open_group(path, mode="r")
    assert consolidated.metadata.consolidated_metadata is not None
    assert consolidated["rank_0/parameters"][next(iter(dict(g["rank_0/parameters"].arrays())))].shape[0] == 4
    tree = tracekit.open(path)
    assert list(tree["loss"].step.values) == [1, 2, 3]
    assert list(tree["parameters"].step.values) == [0, 1, 2, 3]
    assert float(tree["loss"]["loss"].sel(rank=1, step=2)) == 0.25


KILLED = textwrap.dedent("""
    import os, sys
    import numpy as np
    from tracekit.store import RankWriter, TensorData, create_store, io, nodemeta
    path, version, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    create_store(path, {{}}, format_version=version)
    w = RankWriter(path, 0, {{}})
    real_update, real_replace = nodemeta.NodeMeta.update_attrs, io.replace_file
    state = {{"armed": False}}

    def update(self, fields):
        if state["armed"] and where == "before_steps" and "steps" in fields:
            os._exit(0)  # the row's chunks and the arrays' shapes are written; the row is not listed
        real_update(self, fields)

    def replace(file, data):
        if state["armed"] and where == "mid_document":  # the first document of step 3: an array's shape
            tmp = file[:-len("json")] + "deadbeef.partial"
            with open(tmp, "wb") as f:
                f.write(data[: len(data) // 2])
            os._exit(0)  # killed with half a document written beside the old one
        real_replace(file, data)

    real_parts = io.write_parts

    def parts(root, key, chunks, pad_to=None):
        if state["armed"] and where == "mid_chunks":
            os._exit(0)  # an array grown, its row's chunk not written yet
        real_parts(root, key, chunks, pad_to)

    nodemeta.NodeMeta.update_attrs = update
    io.replace_file = replace
    io.write_parts = parts
    for s in (1, 2, 3):
        state["armed"] = s == 3
        w.write(s, "parameters", [TensorData("w", "float32", (3,), np.full(3, s, dtype=np.float32))])
        w.complete_step(s)
""")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("where", ["mid_chunks", "before_steps", "mid_document"])
def test_a_writer_killed_mid_step_leaves_the_row_unlisted_and_the_store_readable(tmp_path, version, where):
    path = str(tmp_path / "s")
    subprocess.run([sys.executable, "-c", KILLED.format(), path, str(version), where], check=True)
    store = open_store(path)
    view = store.rank(0)
    assert view.steps("parameters") == [1, 2]
    assert view.completed_steps == [1, 2]
    np.testing.assert_array_equal(view.read("parameters", 2, "w"), np.full(3, 2, dtype=np.float32))
    result = verify_store(path)
    assert result.ok, [p.line() for p in result.problems]
    g = zarr.open_group(path, mode="r", use_consolidated=False)
    rows = {name: arr.shape[0] for name, arr in g["rank_0/parameters"].arrays()}
    # killed before the listing: every array grown by an unlisted third row; mid-chunks: the first one at
    # least; mid-document: the first array's old document is intact (the half new one lies beside it)
    if where == "before_steps":
        assert set(rows.values()) == {3}, rows
    elif where == "mid_chunks":
        assert max(rows.values()) == 3 and min(rows.values()) >= 2, rows
    else:
        assert set(rows.values()) == {2}, rows


def test_a_document_encodes_as_json_dumps_after_every_change(tmp_path):
    """NodeMeta assembles the JSON from each attribute's kept encoding: after any sequence of
    changes it must still be json.dumps of the document (what zarr writes), NaN and unicode included."""
    g = zarr.open_group(str(tmp_path / "g"), mode="w")
    meta = nodemeta.NodeMeta(g)
    steps = []
    for i, fields in enumerate([{"tensors": [{"name": "w\u00e9", "shape": [2]}], "steps": steps},
                                {"steps": steps + [1]}, {"x": float("nan"), "y": {"z": [1.5, None]}},
                                {"tensors": []}, {"x": -float("inf")}]):
        meta.update_attrs(fields)
        with open(meta.file) as f:
            text = f.read()
        assert text == json.dumps(meta.doc, allow_nan=True), i
        assert json.loads(text)["attributes"].keys() == meta.doc["attributes"].keys()
    assert zarr.open_group(str(tmp_path / "g"), mode="r").attrs["tensors"] == []


def test_an_array_document_encodes_as_json_dumps_after_resizes_and_attribute_changes(tmp_path):
    """An array's document keeps the encoding of every key but the one that changed (its shape
    at a resize, its attributes at an update): interleaved, the file is still json.dumps of the
    document, and zarr reads the last shape."""
    g = zarr.open_group(str(tmp_path / "g"), mode="w")
    arr = g.create_array("a", shape=(0, 5), chunks=(1, 5), dtype=np.float64, fill_value=0)
    meta = nodemeta.NodeMeta(arr)
    for i, change in enumerate([(1, None), (2, None), (2, {"note": "x"}), (3, None), (3, {"note": float("nan")}), (4, None)]):
        rows, fields = change
        if fields is None:
            meta.resize((rows, 5))
        else:
            meta.update_attrs(fields)
        with open(meta.file) as f:
            text = f.read()
        assert text == json.dumps(meta.doc, allow_nan=True), i
        assert json.loads(text)["shape"] == [rows, 5], i
    assert zarr.open_array(str(tmp_path / "g" / "a"), mode="r").shape == (4, 5)


@pytest.mark.parametrize("size", ["large", "small"])
def test_an_unchanged_tensor_is_summarized_once_and_its_summary_is_the_same(tmp_path, monkeypatch, size):
    """Once a tensor's hash (identity and bytes) came back unchanged, the writer hashes it first and
    reuses its last summary while the hash stays the same; what it stores is what summarizing the
    bytes gives. Large tensors are summarized one by one (digest_and_summary), small ones together
    per row (batch_summaries.summaries_of): both reuse."""
    from tracekit.store import batch_summaries
    from tracekit.store import summaries as summaries_mod
    from tracekit.store.summaries import summarize

    calls = []
    if size == "large":
        n = batch_summaries.BATCHED
        real = summaries_mod.digest_and_summary
        monkeypatch.setattr(summaries_mod, "digest_and_summary",
                            lambda ident, parts, dtype: calls.append(dtype) or real(ident, parts, dtype))
    else:
        n = 50
        real_batch = batch_summaries.summaries_of
        monkeypatch.setattr(batch_summaries, "summaries_of",
                            lambda parts, dtype: calls.extend([dtype] * len(parts)) or real_batch(parts, dtype))
    path = str(tmp_path / "s")
    create_store(path, {})
    w = RankWriter(path, 0, {})
    frozen = np.linspace(-1, 1, n, dtype=np.float32)
    for s in (1, 2, 3):
        w.write(s, "parameters", [TensorData("frozen", "float32", (n,), frozen),
                                  TensorData("moving", "float32", (n,), np.full(n, s, dtype=np.float32)),
                                  TensorData("frozen_copy", "float32", (n,), frozen.copy())])  # another name: its own hash
        w.complete_step(s)
    w.close()
    if size == "large":  # hashed first only once the hash came back unchanged: steps 1 and 2 all three, 3 the moving one
        assert len(calls) == 3 + 3 + 1
    else:  # small ones are hashed in the row loop anyway: step 1 all three, then only the moving one
        assert len(calls) == 3 + 1 + 1
    view = open_store(path).rank(0)
    for s in (1, 2, 3):
        got = view.summaries("parameters", s)
        np.testing.assert_array_equal(got["frozen"], summarize(frozen, "float32"))
        np.testing.assert_array_equal(got["frozen_copy"], summarize(frozen, "float32"))
        np.testing.assert_array_equal(got["moving"], summarize(np.full(n, s, dtype=np.float32), "float32"))


def test_nodes_are_created_without_rewriting_their_parents(tmp_path, monkeypatch):
    """The writer creates each node under a group it holds: zarr's "ensure the parents" (read every
    ancestor's metadata, PUT it if none is there: 3-8 requests a node on an object store) is skipped,
    and the store reads back whole. A name with a "/" still gets its intermediate group."""
    from zarr.storage import LocalStore

    from tracekit.store import io

    asked = []
    real = LocalStore.set_if_not_exists

    async def counted(self, key, value):
        asked.append(key)
        return await real(self, key, value)

    monkeypatch.setattr(LocalStore, "set_if_not_exists", counted)
    url = str(tmp_path / "s")
    create_store(url, {})
    w = RankWriter(url, 0, {"coords": {"rank": 0}})
    for step in (1, 2):
        w.write(step, "parameters", [TensorData("w", "float32", (3,), np.arange(3, dtype=np.float32))])
        w.complete_step(step)
    w.close()
    assert asked == []  # every node: its own zarr.json only
    np.testing.assert_array_equal(open_store(url).rank(0).read("parameters", 2, "w"), np.arange(3, dtype=np.float32))
    assert verify_store(url).ok
    # the same call for a nested name creates the group in between, as zarr does
    root = zarr.open_group(url, mode="r+")
    io.child_array(root, "extra/a", shape=(1,), dtype="uint8")
    assert asked and zarr.open_group(url, mode="r")["extra"].attrs is not None
