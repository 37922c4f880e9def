"""Trace storage: the op- and module-level event streams of traced steps (docs/FORMAT.md, "Traces").

    rank_R/traces/<level>/             level: "modules" or "ops"; attributes: steps (listed = complete)
      step_<K>/events                  uint8 array: the step's events as UTF-8 JSON (zstd by zarr)
      step_<K>/full/<event>.<side><i>  full tensor bytes, for events matching --trace-full

An event is a JSON object, read back as a TraceEvent (tracekit/store/trace_events.py, which owns its
keys); its tensors carry summaries and a hash, never data.
Crash safety follows the kinds' rule: a step's arrays are written first and the step is listed in
the level group's `steps` only after; readers ignore anything unlisted. Only rank R's writer
thread writes here, like the rest of rank_R/.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING, Sequence

import numpy as np

from tracekit.store.io import child_array, child_group, compact_metadata
from tracekit.errors import StoreError
from tracekit.store.bounded import read_bounded
from tracekit.store.format import TRACES_GROUP
from tracekit.store.kinds import TRACE_LEVELS
from tracekit.store.trace_events import TraceEvent, parse_events
from tracekit.store.writer import TensorData

if TYPE_CHECKING:  # every function here is handed zarr nodes; a rank importing the writer's modules is not
    import zarr

LEVELS = TRACE_LEVELS  # the registry's trace kinds (store/kinds.py)
_STEP = re.compile(r"^step_(\d+)$")
EVENTS_NAME = "events"


def _step_name(step: int) -> str:
    return f"step_{int(step)}"


class TraceWriter:
    """Writes one rank's traces into its rank group. Not thread-safe: the rank's writer thread only."""

    def __init__(self, rank_group: zarr.Group):
        self.rank_group = rank_group
        self._levels: dict[str, zarr.Group] = {}
        self._steps: dict[str, list[int]] = {}

    def _level(self, level: str) -> zarr.Group:
        if level not in LEVELS:
            raise StoreError(f"unknown trace level {level!r}; known: {', '.join(LEVELS)}")
        g = self._levels.get(level)
        if g is None:
            root = self.rank_group.require_group(TRACES_GROUP)
            g = self._levels[level] = child_group(root, level, attributes={"steps": []})
            self._steps[level] = []
        return g

    @compact_metadata
    def write_step(self, level: str, step: int, events: list[dict], full: Sequence[TensorData] = ()) -> None:
        payload = np.frombuffer(json.dumps(events, separators=(",", ":")).encode(), dtype=np.uint8)
        g = self._level(level)
        if step in self._steps[level]:
            raise StoreError(f"trace of {level} at step {step} written twice")
        sg = child_group(g, _step_name(step))
        arr = child_array(sg, EVENTS_NAME, shape=payload.shape, dtype=np.uint8,
                          chunks=(max(1, min(len(payload), 16 << 20)),), fill_value=0,
                          config={"write_empty_chunks": True})
        if len(payload):
            arr[:] = payload
        if full:
            fg = child_group(sg, "full")
            for t in full:
                a = child_array(fg, t.name, shape=t.data.shape, dtype=t.data.dtype, fill_value=0,
                                attributes={"dtype": t.dtype, "shape": list(t.shape)},
                                config={"write_empty_chunks": True})
                if t.data.size:
                    a[...] = t.data
        # listed last: a crash before this line leaves an unlisted step that readers ignore
        self._steps[level].append(step)
        g.attrs["steps"] = self._steps[level]


def _irregular(rank_group: zarr.Group) -> str | None:
    """The first entry below a local traces group that is neither a folder nor a regular file (a
    FIFO, a device): zarr would block forever opening it, or read it without end."""
    root = getattr(rank_group.store, "root", None)
    if root is None:
        return None
    base = os.path.join(os.fspath(root), rank_group.path, TRACES_GROUP)
    for folder, dirs, files in os.walk(base):
        for name in dirs + files:
            here = os.path.join(folder, name)
            if not (os.path.isdir(here) if name in dirs else os.path.isfile(here)):
                return os.path.relpath(here, os.fspath(root))
    return None


def _traces(rank_group: zarr.Group) -> zarr.Group | None:
    odd = _irregular(rank_group)
    if odd is not None:
        raise StoreError(f"traces: {odd} is not a regular file")
    try:
        node = rank_group[TRACES_GROUP]
    except KeyError:
        return None
    except Exception as e:  # unparsable metadata
        raise StoreError(f"traces: unreadable metadata ({e.__class__.__name__})") from None
    import zarr  # already loaded by whoever opened the group

    return node if isinstance(node, zarr.Group) else None


def trace_steps(rank_group: zarr.Group, level: str) -> list[int]:
    """The completely written traced steps of one rank at one level (empty: none)."""
    root = _traces(rank_group)
    return [] if root is None else _level_steps(root, level)


def _level_steps(root: zarr.Group, level: str) -> list[int]:
    """The step list of one level of a traces group, checked (empty: the level is absent)."""
    try:
        if level not in root:
            return []
        steps = root[level].attrs.get("steps", [])
    except Exception as e:  # unparsable metadata, or a level that is an array
        raise StoreError(f"trace of {level}: unreadable metadata ({e.__class__.__name__})") from None
    if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise StoreError(f"trace of {level}: damaged step list {steps!r}")
    return sorted(steps)


def _irregular_metadata(rank_group: zarr.Group, level: str) -> str | None:
    """The first of the metadata files a step list is read from (the traces group's and the
    level's zarr.json) that exists but is not a regular file; the folders below are not looked at."""
    root = getattr(rank_group.store, "root", None)
    if root is None:
        return None
    base = os.path.join(os.fspath(root), rank_group.path, TRACES_GROUP)
    for here in (base, os.path.join(base, "zarr.json"), os.path.join(base, level), os.path.join(base, level, "zarr.json")):
        if not os.path.lexists(here):
            return None
        if not (os.path.isdir(here) if not here.endswith("zarr.json") else os.path.isfile(here)):
            return os.path.relpath(here, os.fspath(root))
    return None


def listed_trace_steps(rank_group: zarr.Group, level: str) -> list[int]:
    """Like `trace_steps`, reading only the metadata the step list lives in: damage further down
    (a step's arrays, its chunks) is not looked for, so a summary of a store whose trace arrays
    are damaged still lists its traced steps (tracekit verify finds that damage). Damaged
    metadata on the way is a StoreError, never a read that blocks."""
    odd = _irregular_metadata(rank_group, level)
    if odd is not None:
        raise StoreError(f"traces: {odd} is not a regular file")
    try:
        root = rank_group[TRACES_GROUP]
    except KeyError:
        return []
    except Exception as e:  # unparsable metadata
        raise StoreError(f"traces: unreadable metadata ({e.__class__.__name__})") from None
    import zarr  # already loaded by whoever opened the group

    if not isinstance(root, zarr.Group):
        return []
    return _level_steps(root, level)


def trace_levels(rank_group: zarr.Group) -> list[str]:
    return [lv for lv in LEVELS if trace_steps(rank_group, lv)]


def _array(rank_group: zarr.Group, level: str, step: int, *path: str):
    """A trace array, or KeyError; damaged metadata on the way is a StoreError."""
    try:
        node = rank_group[TRACES_GROUP][level][_step_name(step)]
        for p in path:
            node = node[p]
    except KeyError:
        raise
    except Exception as e:  # unparsable zarr.json below the traces group
        raise StoreError(f"trace of {level} at step {step}: unreadable metadata ({e.__class__.__name__})") from None
    import zarr  # already loaded by whoever opened the group

    if not isinstance(node, zarr.Array):
        raise StoreError(f"trace of {level} at step {step}: {'/'.join(path)} is not an array")
    return node


def read_events(rank_group: zarr.Group, level: str, step: int) -> list[TraceEvent]:
    """The events of one traced step, in execution order, typed. Its array is read bounded
    (store/bounded.py): a declared size its stored bytes cannot hold, or a chunk that expands
    beyond it, is damage; so is an event that does not parse (trace_events.py)."""
    if step not in trace_steps(rank_group, level):
        raise StoreError(f"no {level} trace of step {step}")
    where = f"trace of {level} at step {step}: events"
    try:
        raw = read_bounded(_array(rank_group, level, step, EVENTS_NAME), where)
        events = json.loads(raw.tobytes().decode())
    except KeyError:
        raise StoreError(f"{where}: missing") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise StoreError(f"trace of {level} at step {step}: damaged events ({e.__class__.__name__})") from None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise StoreError(f"trace of {level} at step {step}: events are not a list of objects")
    try:
        return parse_events(events)
    except (TypeError, ValueError) as e:
        raise StoreError(f"trace of {level} at step {step}: malformed events ({e})") from None


def full_keys(rank_group: zarr.Group, level: str, step: int) -> list[str]:
    """The keys of the tensors a traced step kept whole (--trace-full)."""
    try:
        g = rank_group[TRACES_GROUP][level][_step_name(step)]["full"]
        return sorted(name for name, _ in g.arrays())
    except KeyError:
        return []
    except Exception as e:
        raise StoreError(f"trace of {level} at step {step}: unreadable full tensors ({e.__class__.__name__})") from None


def read_full(rank_group: zarr.Group, level: str, step: int, key: str) -> tuple[np.ndarray, str, list[int]] | None:
    """A full tensor kept for --trace-full: (storage-dtype data, logical dtype, shape), or None."""
    where = f"trace of {level} at step {step}: full tensor {key}"
    try:
        a = _array(rank_group, level, step, "full", key)
    except KeyError:
        return None
    dtype, shape = a.attrs.get("dtype"), a.attrs.get("shape")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise StoreError(f"{where}: malformed dtype or shape attributes")
    data = read_bounded(a, where)
    if math.prod(shape) != data.size:
        raise StoreError(f"{where}: its shape {shape} does not match its array's {list(data.shape)}")
    return data, dtype, shape


def trace_nbytes(rank_group: zarr.Group, level: str, step: int) -> int:
    """Bytes of one traced step on disk (its events and full tensors), for the benchmark."""
    import os

    store = rank_group.store
    root = getattr(store, "root", None)
    if root is None:
        return 0
    path = os.path.join(str(root), rank_group.path, TRACES_GROUP, level, _step_name(step))
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
