"""What opening a store reads first and refuses: its root metadata, a group's members and a
step list, each checked where parsed (a damaged or hostile value is one StoreError line, not an
AttributeError or a zarr traceback wherever it is first used)."""

from __future__ import annotations

import json
import os

import zarr

from tracekit.errors import StoreError
from tracekit.store.chunks import irregular_metadata
from tracekit.store.coverage import KEY as COVERAGE_KEY
from tracekit.store.format import MAX_STEP, ROOT_KEY
from tracekit.store.localmeta import ParsedNodes, local_members
from tracekit.store.location import Location


def read_root_attrs(path: str, location: Location) -> dict:
    if location.is_local:
        if not os.path.exists(path):
            raise StoreError(f"{path}: no such store")
        if not os.path.isdir(path):
            raise StoreError(f"{path} is not a directory, so not a tracekit store")
        meta_file = os.path.join(location.path, "zarr.json")
        if os.path.lexists(meta_file) and not os.path.isfile(meta_file):  # a FIFO would block the read forever
            raise StoreError(f"{path}: its zarr.json is not a regular file (damaged store?)")
    raw = location.read_bytes("zarr.json")
    if raw is None:
        if not location.is_local and location.is_empty():
            raise StoreError(f"{path}: no such store")
        raise StoreError(f"{path} is not a tracekit store (no zarr.json at its root)")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreError(f"{path}: unreadable root metadata ({e.__class__.__name__})") from None
    attrs = doc.get("attributes", {}) if isinstance(doc, dict) else {}
    if not isinstance(attrs, dict) or ROOT_KEY not in attrs:
        raise StoreError(f"{path} is a zarr store but not a tracekit store (no '{ROOT_KEY}' metadata)")
    meta = attrs[ROOT_KEY]
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: the '{ROOT_KEY}' metadata is not an object (damaged store?)")
    check_types(meta, ROOT_TYPES, f"{path}: root")
    return meta


# Metadata fields readers use as containers: a damaged or hostile value of another type is one
# StoreError here, not an AttributeError wherever it is first used.
ROOT_TYPES = {"run": dict, "ranks": dict, "record_config": dict, "command": list, "world_size": (int, type(None))}
RANK_TYPES = {"run": dict, "coords": dict, "completed_steps": list, "status": str, "fallback_ops": list,
               "env": dict, "versions": dict, "config": dict, COVERAGE_KEY: dict, "precision": dict}


def check_types(attrs: dict, types: dict, where: str) -> None:
    for key, kind in types.items():
        if key in attrs and not isinstance(attrs[key], kind):
            raise StoreError(f"{where} metadata: {key!r} is a {type(attrs[key]).__name__} (damaged store?)")


def members(group: zarr.Group, where: str, parsed: ParsedNodes | None = None) -> list:
    """A group's children; damaged child metadata is a StoreError naming the place, not a zarr traceback."""
    fast = local_members(group, parsed=parsed)
    if fast is not None:
        return fast
    odd = irregular_metadata(group)
    if odd is not None:
        raise StoreError(f"{where}: {odd} is not a regular file (damaged store?)")
    try:
        return list(group.members())
    except Exception as e:
        raise StoreError(f"{where}: unreadable metadata below it ({e.__class__.__name__}: {e})") from None


def step_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise StoreError(f"{where}: malformed step list in its metadata (damaged store?)")
    bad = next((v for v in value if not 0 <= v <= MAX_STEP), None)
    if bad is not None:
        raise StoreError(f"{where}: impossible step {bad} in its metadata (damaged store?)")
    return value
