"""A local group's members read without zarr's event loop.

zarr lists a group's members by reading every child's `zarr.json` as a task on its I/O thread; for
the small local folders of a store, the hops to that thread and back cost more than the reads:
8-9 ms for a rank group of 3 kinds and their 9 index arrays, against ~3 ms for the same files
read and parsed here (2026-12-03). A diff or `tracekit.open` lists every rank of both stores.

The nodes are built as zarr builds them in `Group.members` (its metadata classes from the same
JSON, the same node types over the same store), so everything after reads them through zarr
as before. Anything this does not expect (not a local store, a `zarr.json` that is no regular
file or no valid v3 metadata, a member that is neither folder nor file, zarr's internals moved)
gives None, and the caller lists through zarr, whose error names the problem.

A `ParsedNodes` memo, shared by the two stores of a diff, parses each distinct `zarr.json` once:
two recordings of one model and layout hold byte-equal kind metadata (as do DDP replicas within a
store), and decoding the tensor indexes in it (~40 KB a kind for 200 tensors) was the largest part
of opening an FSDP store.
"""

from __future__ import annotations

import json
import os
import stat

import zarr

ZARR_JSON = "zarr.json"


def _builders():
    """zarr's node classes and metadata parsers (internal names: None where this zarr moved them)."""
    try:
        from zarr.core.array import AsyncArray
        from zarr.core.group import AsyncGroup, GroupMetadata
        from zarr.core.metadata.v3 import ArrayV3Metadata
        from zarr.storage import StorePath
    except ImportError:
        return None
    return AsyncArray, AsyncGroup, GroupMetadata, ArrayV3Metadata, StorePath


class ParsedNodes:
    """zarr metadata parsed from `zarr.json` bytes, kept under those bytes: equal bytes, one parse.
    The metadata classes are frozen; their attributes are read, never written, by the reader (the
    only user). Lookups and inserts are single dict operations (atomic under the GIL): two
    threads parsing the same bytes at once both get a valid, equal result."""

    def __init__(self):
        self._by_bytes: dict[bytes, object] = {}

    def parse(self, raw: bytes, builders):
        known = self._by_bytes.get(raw)
        if known is None:
            known = self._by_bytes[raw] = _parse(raw, builders)
        return known


def _parse(raw: bytes, builders):
    """('group' or 'array', its metadata); _Unexpected for anything zarr should name itself."""
    _, _, GroupMetadata, ArrayV3Metadata, _ = builders
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
            raise _Unexpected
        node_type = doc.get("node_type")
        if node_type == "group":
            return node_type, GroupMetadata.from_dict(doc)
        if node_type == "array":
            return node_type, ArrayV3Metadata.from_dict(doc)
    except _Unexpected:
        raise
    except Exception as e:  # unreadable or invalid metadata: zarr's own message is the one to give
        raise _Unexpected from e
    raise _Unexpected


class _Unexpected(Exception):
    """Something zarr should handle (and name) itself."""


def _node(store, path: str, folder: str, parsed: ParsedNodes):
    """The member in `folder` (None: a folder with no zarr.json, which zarr skips too)."""
    AsyncArray, AsyncGroup, _, _, StorePath = _BUILDERS
    meta_path = os.path.join(folder, ZARR_JSON)
    try:
        st = os.stat(meta_path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Unexpected from e
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block a read forever
        raise _Unexpected
    try:
        with open(meta_path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise _Unexpected from e
    node_type, meta = parsed.parse(raw, _BUILDERS)
    where = StorePath(store=store, path=path)
    if node_type == "group":
        return zarr.Group(AsyncGroup(meta, store_path=where))
    return zarr.Array(AsyncArray(meta, store_path=where))


def _walk(store, folder: str, path: str, prefix: str, depth: int, out: list, parsed: ParsedNodes) -> None:
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise _Unexpected from e
    for name in names:
        if name == ZARR_JSON:
            continue
        here = os.path.join(folder, name)
        try:
            mode = os.stat(here).st_mode
        except OSError as e:
            raise _Unexpected from e
        if stat.S_ISREG(mode):  # a stray file: no member (zarr skips it, with a warning)
            continue
        if not stat.S_ISDIR(mode):
            raise _Unexpected
        child_path = f"{path}/{name}" if path else name
        node = _node(store, child_path, here, parsed)
        if node is None:
            continue
        out.append((prefix + name, node))
        if depth > 0 and isinstance(node, zarr.Group):
            _walk(store, here, child_path, f"{prefix}{name}/", depth - 1, out, parsed)


def local_members(group: zarr.Group, max_depth: int = 0, parsed: ParsedNodes | None = None) -> list | None:
    """(name, node) for the group's members as `group.members(max_depth=max_depth)` lists them
    (names relative to the group, "kind/array" below a child), or None when zarr should list them.
    `parsed`: the memo to parse through (a fresh one: nothing shared)."""
    root = getattr(group.store, "root", None)
    if root is None or _BUILDERS is None:
        return None
    out: list = []
    try:
        _walk(group.store, os.path.join(os.fspath(root), group.path), group.path, "", max_depth, out,
              parsed if parsed is not None else ParsedNodes())
    except _Unexpected:
        return None
    return out


_BUILDERS = _builders()
