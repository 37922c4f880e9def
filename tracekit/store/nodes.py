"""The groups and row arrays a writer creates: directly on a local store, through zarr elsewhere.

A rank's writer creates its rank group at its start and, at each kind's first entry, the kind's
group and its row arrays (format 2 on: the hash, finite and summary index arrays; format 1: one
packed array per storage dtype). Through zarr a kind cost 28-41 ms of CPU in a warm writer process
(a TorchTitan rank makes 5 kinds, inside the training steps), and the writer had to import zarr
(~0.1-0.18 s of CPU) for these nodes alone: every later change of their documents goes through
NodeMeta (tracekit/store/nodemeta.py), and the chunks are written as plain files.

On a local store a node here is its folder and its `zarr.json`: the document zarr 3.1 writes for
the same call with json_indent None (io.compact_metadata), keys in zarr's order, encoded as zarr
encodes it (`json.dumps(doc, allow_nan=True)`), and published as zarr publishes it (a temporary
beside it, renamed over it). tests/tracekit/store/test_nodes.py holds every document to what zarr
writes, byte for byte, for every dtype the writer stores. Anywhere else (a URL; a big-endian or
Windows machine, where NodeMeta and the chunk writes take zarr's path too) zarr makes the nodes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from tracekit.errors import StoreError
from tracekit.store import io
from tracekit.store.chunks import default_key
from tracekit.store.local_root import ZARR_JSON, encode, group_meta



def direct(location) -> bool:
    """Whether the writer creates its nodes itself at this Location (tracekit/store/location.py)."""
    return location.is_local and sys.byteorder == "little" and sys.platform != "win32"


@dataclass(frozen=True)
class LocalGroup:
    """A group of a local store, made here (or the store's root, made by create_store: path "")."""

    root: str  # the store's folder
    path: str  # '/'-separated below it
    doc: dict | None  # its zarr.json as written here (NodeMeta takes it over); None: not made here

    @property
    def file(self) -> str:
        return io.local_path(self.root, f"{self.path}/{ZARR_JSON}" if self.path else ZARR_JSON)


@dataclass(frozen=True)
class LocalArray:
    """A row array of a local store, made here: what the writer asks of a zarr array (path, shape
    at creation, chunks, dtype), and where its chunk files go (zarr's default keys: `c/<row>/<col>`,
    or `c.<row>.<col>` with the separator "." of format 6)."""

    root: str
    path: str
    doc: dict
    shape: tuple[int, int]
    chunks: tuple[int, int]
    dtype: np.dtype

    @property
    def file(self) -> str:
        return io.local_path(self.root, f"{self.path}/{ZARR_JSON}")

    def chunk_key(self, row: int, col: int) -> str:
        return f"{self.path}/{default_key(self.doc['chunk_key_encoding']['configuration']['separator'], row, col)}"


def holds(parent, name: str) -> bool:
    """Whether the group `parent` has a member `name` (zarr's `name in group`)."""
    if isinstance(parent, LocalGroup):
        return os.path.exists(io.local_path(parent.root, _child(parent, name) + "/" + ZARR_JSON))
    return name in parent


def child_group(parent, name: str, attributes: dict | None = None):
    """A new group `name` in the group `parent`, which this process holds: a LocalGroup under a
    LocalGroup, else zarr's (io.child_group)."""
    if not isinstance(parent, LocalGroup):
        return io.child_group(parent, name, **({"attributes": attributes} if attributes is not None else {}))
    doc = group_meta(dict(attributes or {}))
    path = _child(parent, name)
    _publish(parent.root, path, doc)
    return LocalGroup(parent.root, path, doc)


def row_array(group, name: str, width: int, chunk: int, dtype, separator: str = "/"):
    """A new array `name` of 0 rows of `width` elements in `group`: chunks of one row and `chunk`
    elements, raw little-endian elements (no compression), fill value 0, each chunk written even
    when all zeros (so a missing chunk always means damage; zarr skips them by default), at zarr's
    default chunk keys with `separator` ("/": a folder per row; ".": format 6's flat keys)."""
    dtype = np.dtype(dtype)
    if not isinstance(group, LocalGroup):
        return io.child_array(group, name, shape=(0, width), chunks=(1, chunk), dtype=dtype,
                              dimension_names=("step", f"{name}_element"), compressors=None, fill_value=0,
                              chunk_key_encoding={"name": "default", "separator": separator},
                              config={"write_empty_chunks": True})
    path = _child(group, name)
    doc = {
        "shape": [0, width],
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, chunk]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": _zero(dtype),
        # zarr names the byte order only where there is one
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}} if dtype.itemsize > 1 else {"name": "bytes"}],
        "attributes": {},
        "dimension_names": ["step", f"{name}_element"],
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }
    _publish(group.root, path, doc)
    return LocalArray(group.root, path, doc, (0, width), (1, chunk), dtype)


def _zero(dtype: np.dtype):
    """The fill value 0 as zarr 3.1 writes it for the dtype."""
    if dtype.kind == "b":
        return False
    if dtype.kind == "c":
        return [0.0, 0.0]
    return 0.0 if dtype.kind == "f" else 0


def _child(parent: LocalGroup, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):  # io.child_group's one level, nothing else
        raise StoreError(f"{parent.root}: cannot make a node named {name!r}")
    return f"{parent.path}/{name}" if parent.path else name


def _publish(root: str, path: str, doc: dict) -> None:
    """The node's folder and its document (written under a temporary name, renamed over it, as
    zarr does). A node already there is refused, as zarr refuses it."""
    folder = io.local_path(root, path)
    try:
        os.mkdir(folder)
    except FileExistsError:
        if os.path.lexists(os.path.join(folder, ZARR_JSON)):
            raise StoreError(f"{root}: {path} exists already") from None
    except OSError as e:
        raise StoreError(f"{root}: cannot create {path} ({e.strerror or e})") from None
    io.replace_file(os.path.join(folder, ZARR_JSON), encode(doc))
