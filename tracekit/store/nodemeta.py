"""The zarr.json of a node (group or array) that one writer alone owns, kept in memory and written by it.

A rank's writer updates its group's metadata every step: per kind the three index arrays grow by
a row and the kind's `steps` list grows; then the rank's `completed_steps`. Through zarr each of
these is a round trip through zarr's event-loop thread (measured: 21 updates per step cost the
writer process ~67 ms of wall time per step, 10M-parameter FSDP rank), although the document
changes by one number. The writer is the only one that writes its rank's group (docs/FORMAT.md:
one writer per node), so on a local store it keeps each node's document, as zarr wrote it at
creation, and writes it itself after each change: the same JSON zarr writes (compact,
`allow_nan`), atomically (a temporary file renamed over zarr.json, zarr's own temporary name), so
a crash leaves the old document or the new one, never a torn one.

The zarr object of the node is stale once this writes its document: everything that changes the
node's metadata must go through its NodeMeta. Any other store (a URL) takes zarr's own path. A
node the writer made itself (tracekit/store/nodes.py: a local store's LocalGroup or LocalArray)
brings the document it was written with, which is not read back.
"""

from __future__ import annotations

import json
import sys

from tracekit.store import io
from tracekit.store.local_root import ZARR_JSON
from tracekit.store.nodes import LocalArray, LocalGroup


class NodeMeta:
    """The metadata document of one zarr group or array (zarr 3) that only this process writes."""

    def __init__(self, node):
        """node: the zarr Group or Array, created by this process (its zarr.json is on disk), or
        the LocalGroup or LocalArray it made (nodes.py), whose document this takes over."""
        self.node = node
        self.file = None
        self.doc: dict | None = None
        # each attribute's JSON ('"NAME": VALUE'), kept until it changes: a kind's tensor index (600
        # entries at 10M parameters FSDP, ~1 ms to encode) is the same every step, only its `steps` grow
        self._encoded: dict[str, str] = {}
        # the same for the document's other keys (an array's codecs, chunk grid...): every step
        # changes only its shape (resize) or its attributes, and re-encoding all of them cost an
        # entry of a TorchTitan rank ~3 ms of its writer's CPU (18 documents an entry)
        self._top: dict[str, str] = {}
        if isinstance(node, (LocalGroup, LocalArray)):
            self.file, self.doc = node.file, node.doc
            return
        where = io.array_key(node)  # (root folder, node path) on a local store, else None
        if where is not None and sys.platform != "win32":
            root, path = where
            self.file = io.local_path(root, f"{path}/{ZARR_JSON}" if path else ZARR_JSON)
            with open(self.file, "rb") as f:
                self.doc = json.load(f)

    def update_attrs(self, fields: dict) -> None:
        """Merge `fields` into the node's attributes (zarr's attrs.update)."""
        if self.file is None:
            self.node.attrs.update(fields)
            return
        self.doc.setdefault("attributes", {}).update(fields)
        for key in fields:
            self._encoded.pop(key, None)
        self._top.pop("attributes", None)
        self._write()

    def resize(self, shape: tuple[int, ...]) -> None:
        """Grow an array to `shape` (zarr's resize for a growing array: only the metadata changes)."""
        if self.file is None:
            self.node.resize(shape)
            return
        if len(shape) != len(self.doc["shape"]) or any(n < o for n, o in zip(shape, self.doc["shape"])):
            raise ValueError(f"NodeMeta only grows arrays: {self.doc['shape']} -> {list(shape)}")
        self.doc["shape"] = [int(n) for n in shape]
        self._top.pop("shape", None)
        self._write()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.doc["shape"]) if self.doc is not None else tuple(self.node.shape)

    def _write(self) -> None:
        io.replace_file(self.file, self.encoded().encode())

    def encoded(self) -> str:
        """The document as zarr writes it with json_indent None (io.compact_metadata):
        json.dumps(doc, allow_nan=True), assembled from each attribute's kept encoding (json.dumps
        writes a dict as '{' + ', '.join('KEY: VALUE') + '}', in insertion order)."""
        parts = []
        for key, value in self.doc.items():
            enc = self._top.get(key)
            if enc is None and key == "attributes" and isinstance(value, dict):
                inner = []
                for name, attr in value.items():
                    item = self._encoded.get(name)
                    if item is None:
                        item = self._encoded[name] = f"{json.dumps(name)}: {json.dumps(attr, allow_nan=True)}"
                    inner.append(item)
                enc = self._top[key] = f"{json.dumps(key)}: {{{', '.join(inner)}}}"
            elif enc is None:
                enc = self._top[key] = f"{json.dumps(key)}: {json.dumps(value, allow_nan=True)}"
            parts.append(enc)
        return "{" + ", ".join(parts) + "}"
