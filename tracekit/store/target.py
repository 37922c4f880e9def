"""Where a new store may go: whether a location holds a tracekit store, and which local folders a
store may be created in. No numpy or zarr here: `tracekit record` runs these checks before its
command starts (tracekit/store/local_root.py)."""

from __future__ import annotations

import json
import os

from tracekit.errors import StoreError
from tracekit.store.format import ROOT_KEY
from tracekit.store.location import resolve
from tracekit.store.ownership import LOCK_ENTRIES


def is_store(path, storage_options=None) -> bool:
    return root_doc(resolve(path, storage_options)) is not None


def root_doc(location) -> dict | None:
    """The store's root document, parsed, if it is a tracekit store's (its attributes name tracekit)."""
    raw = location.read_bytes("zarr.json")
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return doc if ROOT_KEY in doc.get("attributes", {}) else None
    except (ValueError, AttributeError, TypeError):
        return None


def check_target(path: str, force: bool = False) -> None:
    """Refuse, before anything is touched, a local target that create_store would refuse."""
    outer = enclosing_store(path)
    if outer is not None:  # e.g. -o LIVE/rank_0: the job would write into another job's rank group
        raise StoreError(f"{path} is inside the tracekit store {outer}; record into a folder of its own")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise StoreError(f"{path} exists and is not a directory")
        try:
            names = os.listdir(path)
        except OSError as e:
            raise StoreError(f"{path}: cannot list it ({e.strerror or e})") from None
        if [n for n in names if n not in LOCK_ENTRIES]:
            if not is_store(path):
                raise StoreError(f"{path} is a non-empty directory that is not a tracekit store; refusing to touch it")
            if not force:
                raise StoreError(f"{path} already holds a tracekit store{_left_by(path)}; pass --force to overwrite it")


def enclosing_store(path: str) -> str | None:
    """The tracekit store that a local `path` lies inside (a folder above it), or None."""
    here = os.path.abspath(path)
    parent = os.path.dirname(here)
    while parent != here:
        if os.path.isfile(os.path.join(parent, "zarr.json")) and is_store(parent):
            return parent
        here, parent = parent, os.path.dirname(parent)
    return None


def _left_by(path: str) -> str:
    """' left unfinished by run X, whose launcher died' for a store no launcher finalized (refusal message)."""
    doc = root_doc(resolve(path))
    meta = doc["attributes"][ROOT_KEY] if doc is not None else None
    if isinstance(meta, dict) and meta.get("launcher") == "tracekit record" and "end_time" not in meta:
        return f" left unfinished by run {meta.get('run_id', '?')}, whose launcher died"
    return ""
