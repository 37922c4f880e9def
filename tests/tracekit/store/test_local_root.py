"""A local store's root written without zarr: the same bytes zarr writes, the same refusals."""

import json
import os

import numpy as np
import pytest
import zarr

from tracekit.environment import run_environment
from tracekit.errors import StoreError
from tracekit.store import create_store, open_store
from tracekit.store.format import FORMAT_VERSION, OBJECTS_DIR, ROOT_KEY
from tracekit.store.formats import READERS
from tracekit.store.ownership import LOCK_ENTRIES, JobClaim
from tracekit.store.local_root import OBJECTS_NOTE, create_local_store, group_doc, objects_doc
from tracekit.testing import write_store

from tests.files import folder_bytes

# what the launcher puts in a root, and what JSON makes of odd values: NaN, infinities, text
# outside ASCII (escaped), nesting, None, tuples (lists)
META = {**run_environment(["python", "train.py", "--lr", "1e-3"]), "run_id": "0123456789abcdef",
        "odd": {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "text": "é\u2028🙂\"\\",
                "none": None, "flags": [True, False], "tuple": (1, 2.5), "empty": {}}}


def _zarr_root(path, attributes: dict, objects: bool):
    """The root zarr itself writes (as create_store does for a store at a URL), with every document
    unindented as io.compact_metadata has it write them."""
    with zarr.config.set({"json_indent": None}):
        root = zarr.open_group(str(path), mode="w", attributes=attributes)
        if objects:
            root.create_array(OBJECTS_DIR, shape=(0,), dtype=np.uint8, chunks=(1,), dimension_names=("object_byte",),
                              attributes={ROOT_KEY: OBJECTS_NOTE})


def test_the_root_group_document_is_zarrs_byte_for_byte(tmp_path):
    _zarr_root(tmp_path / "z", {ROOT_KEY: META}, objects=False)
    assert (tmp_path / "z" / "zarr.json").read_bytes() == group_doc({ROOT_KEY: META})


def test_the_objects_array_document_is_zarrs_byte_for_byte(tmp_path):
    _zarr_root(tmp_path / "z", {}, objects=True)
    assert (tmp_path / "z" / OBJECTS_DIR / "zarr.json").read_bytes() == objects_doc()


@pytest.mark.parametrize("version", sorted(READERS))
def test_a_new_store_holds_the_files_zarr_writes_for_it(tmp_path, version):
    """create_store of a folder (the launcher's create_local_store) against zarr's own root for the
    attributes it wrote: the same files, the same bytes."""
    create_store(str(tmp_path / "ours"), META, format_version=version)
    written = json.loads((tmp_path / "ours" / "zarr.json").read_bytes())["attributes"]
    assert written[ROOT_KEY]["format_version"] == version and written[ROOT_KEY]["run_id"] == META["run_id"]
    _zarr_root(tmp_path / "zarrs", written, objects=READERS[version].hashed)
    assert folder_bytes(tmp_path / "ours") == folder_bytes(tmp_path / "zarrs")


def test_the_launchers_default_is_the_current_formats_layout(tmp_path):
    """create_local_store writes objects/ by default, which is right only while the current format
    keeps tensor bytes as objects."""
    assert READERS[FORMAT_VERSION].hashed
    create_local_store(str(tmp_path / "s"), {"launcher": "tracekit record"})
    assert open_store(str(tmp_path / "s")).format is READERS[FORMAT_VERSION]
    assert os.path.isfile(tmp_path / "s" / OBJECTS_DIR / "zarr.json")


def test_force_replaces_an_old_store_and_keeps_its_lock_groups(tmp_path):
    old = write_store(tmp_path / "s", {0: {1: {"loss": {"loss": np.float32(1.0)}}}})
    JobClaim.acquire(old).release()  # the job lock group (the writers' one: made by the rank)
    locks = {name: folder_bytes(os.path.join(old, name)) for name in LOCK_ENTRIES}
    with pytest.raises(StoreError, match="already holds a tracekit store; pass --force"):
        create_local_store(old, {})
    create_local_store(old, {"launcher": "x"}, force=True)
    assert sorted(os.listdir(old)) == sorted([*LOCK_ENTRIES, OBJECTS_DIR, "zarr.json"])  # the rank's group went
    assert open_store(old).ranks == []
    assert {name: folder_bytes(os.path.join(old, name)) for name in LOCK_ENTRIES} == locks


@pytest.mark.parametrize("layout, message", [("foreign", "not a tracekit store"), ("inside", "inside the tracekit store"),
                                             ("file", "exists and is not a directory")])
def test_the_refusals_are_create_stores(tmp_path, layout, message):
    outer = write_store(tmp_path / "outer", {0: {1: {"loss": {"loss": np.float32(1.0)}}}})
    target = {"foreign": tmp_path / "foreign", "inside": os.path.join(outer, "rank_0"), "file": tmp_path / "f"}[layout]
    if layout == "foreign":
        target.mkdir()
        (target / "data.csv").write_text("1,2\n")
    if layout == "file":
        target.write_text("x")
    before = folder_bytes(tmp_path)
    with pytest.raises(StoreError, match=message):
        create_local_store(str(target), {}, force=True)
    assert folder_bytes(tmp_path) == before  # nothing touched
