"""A new local store's root, written without zarr: the root group's zarr.json and, in the formats
that keep tensor bytes as objects, the `objects` array's, byte for byte as zarr 3.1 writes them
(compact, as io.compact_metadata has zarr write every document; tests compare with zarr's own).

`tracekit record` creates its store before its command starts, and zarr's import (~0.15 s of CPU,
numpy's included) delayed every recorded command by that much; the ranks open the store through
zarr as before. A store at a URL is still created through zarr (tracekit/store/writer.py).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil

from tracekit.errors import StoreError
from tracekit.store.format import FORMAT_VERSION, OBJECTS_DIR, ROOT_KEY
from tracekit.store.io import replace_file
from tracekit.store.ownership import LOCK_ENTRIES
from tracekit.store.target import check_target

ZARR_JSON = "zarr.json"
OBJECTS_NOTE = "content-addressed tensor bytes (docs/FORMAT.md)"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_root_meta(meta: dict, format_version: int) -> dict:
    """The tracekit metadata of a new store's root group."""
    return {"format_version": format_version, "start_time": now_iso(), **meta}


def encode(doc: dict) -> bytes:
    """zarr's own encoding of a v3 document: json.dumps(doc, indent=json_indent, allow_nan=True), indent None."""
    return json.dumps(doc, allow_nan=True).encode()


def group_meta(attributes: dict) -> dict:
    """A zarr 3 group's document (GroupMetadata.to_dict's keys, in its order)."""
    return {"attributes": attributes, "zarr_format": 3, "node_type": "group"}


def group_doc(attributes: dict) -> bytes:
    """A zarr 3 group's zarr.json."""
    return encode(group_meta(attributes))


def objects_doc() -> bytes:
    """The zarr.json of the `objects` folder, declared an empty uint8 array so that zarr and xarray
    treat it as a leaf and never list (or warn about) the files inside, which are not zarr chunks:
    what zarr writes for create_array(shape=(0,), dtype=uint8, chunks=(1,), dimension_names=
    ("object_byte",)) with its default codecs (bytes, then zstd level 0)."""
    return encode({
        "shape": [0], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 0, "checksum": False}}],
        "attributes": {ROOT_KEY: OBJECTS_NOTE}, "dimension_names": ["object_byte"],
        "zarr_format": 3, "node_type": "array", "storage_transformers": []})


def create_local_store(path: str, meta: dict, force: bool = False, format_version: int = FORMAT_VERSION,
                       objects: bool = True) -> None:
    """Create a store's root in the local folder `path`, refused as create_store refuses it; with
    force, an old store's contents go, except its lock files (the caller may hold one).
    `objects`: whether the format keeps tensor bytes as objects (its reader is `hashed`), as the
    current one does; create_store asks the format's reader (formats.READERS), whose import
    (numpy's) `tracekit record` spares its command's start."""
    check_target(path, force)
    if os.path.isdir(path):
        for name in os.listdir(path):
            if name in LOCK_ENTRIES:
                continue
            full = os.path.join(path, name)
            try:
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)
            except OSError as e:
                raise StoreError(f"{path}: cannot remove the old store's {name} ({e.strerror or e})") from None
    try:
        os.makedirs(path, exist_ok=True)
        # each document written atomically (a temporary renamed over zarr.json), as zarr writes it
        replace_file(os.path.join(path, ZARR_JSON), group_doc({ROOT_KEY: new_root_meta(meta, format_version)}))
        if objects:
            os.makedirs(os.path.join(path, OBJECTS_DIR), exist_ok=True)
            replace_file(os.path.join(path, OBJECTS_DIR, ZARR_JSON), objects_doc())
    except OSError as e:
        raise StoreError(f"{path}: cannot create the store ({e.strerror or e})") from None
