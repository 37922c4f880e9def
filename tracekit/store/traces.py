"""Trace storage: the op- and module-level event streams of traced steps (docs/FORMAT.md, "Traces").

    rank_R/traces/<level>/             level: "modules" or "ops"; attributes: steps (listed = complete)
      step_<K>/events                  uint8 array: the step's events as UTF-8 JSON (zstd by zarr)
      step_<K>/full/<event>.<side><i>  full tensor bytes, for events matching --trace-full

An event is a JSON object (see `EVENT_FIELDS`); its tensors carry summaries and a hash, never data.
Crash safety follows the kinds' rule: a step's arrays are written first and the step is listed in
the level group's `steps` only after; readers ignore anything unlisted. Only rank R's writer
thread writes here, like the rest of rank_R/.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np
import zarr

from tracekit.store.io import compact_metadata
from tracekit.errors import StoreError
from tracekit.store.format import TRACES_GROUP
from tracekit.store.kinds import TRACE_LEVELS
from tracekit.store.writer import TensorData

LEVELS = TRACE_LEVELS  # the registry's trace kinds (store/kinds.py)
# Fields of one event, for readers and the schema (docs/FORMAT.md lists their meaning).
EVENT_FIELDS = ("index", "phase", "module", "op", "call", "args", "inputs", "outputs", "src", "group")
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
            g = self._levels[level] = root.create_group(level, attributes={"steps": []})
            self._steps[level] = []
        return g

    @compact_metadata
    def write_step(self, level: str, step: int, events: list[dict], full: Sequence[TensorData] = ()) -> None:
        payload = np.frombuffer(json.dumps(events, separators=(",", ":")).encode(), dtype=np.uint8)
        g = self._level(level)
        if step in self._steps[level]:
            raise StoreError(f"trace of {level} at step {step} written twice")
        sg = g.create_group(_step_name(step))
        arr = sg.create_array(EVENTS_NAME, shape=payload.shape, dtype=np.uint8,
                              chunks=(max(1, min(len(payload), 16 << 20)),), fill_value=0,
                              config={"write_empty_chunks": True})
        if len(payload):
            arr[:] = payload
        if full:
            fg = sg.create_group("full")
            for t in full:
                a = fg.create_array(t.name, shape=t.data.shape, dtype=t.data.dtype, fill_value=0,
                                    attributes={"dtype": t.dtype, "shape": list(t.shape)},
                                    config={"write_empty_chunks": True})
                if t.data.size:
                    a[...] = t.data
        # listed last: a crash before this line leaves an unlisted step that readers ignore
        self._steps[level].append(step)
        g.attrs["steps"] = self._steps[level]


def _traces(rank_group: zarr.Group) -> zarr.Group | None:
    try:
        node = rank_group[TRACES_GROUP]
    except KeyError:
        return None
    return node if isinstance(node, zarr.Group) else None


def trace_steps(rank_group: zarr.Group, level: str) -> list[int]:
    """The completely written traced steps of one rank at one level (empty: none)."""
    root = _traces(rank_group)
    if root is None or level not in root:
        return []
    steps = root[level].attrs.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise StoreError(f"trace of {level}: damaged step list {steps!r}")
    return sorted(steps)


def trace_levels(rank_group: zarr.Group) -> list[str]:
    return [lv for lv in LEVELS if trace_steps(rank_group, lv)]


def read_events(rank_group: zarr.Group, level: str, step: int) -> list[dict]:
    """The events of one traced step, in execution order."""
    if step not in trace_steps(rank_group, level):
        raise StoreError(f"no {level} trace of step {step}")
    try:
        raw = rank_group[TRACES_GROUP][level][_step_name(step)]["events"][:]
        events = json.loads(bytes(np.asarray(raw, dtype=np.uint8)).decode())
    except (KeyError, ValueError, UnicodeDecodeError) as e:
        raise StoreError(f"trace of {level} at step {step}: damaged events ({e.__class__.__name__})") from None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise StoreError(f"trace of {level} at step {step}: events are not a list of objects")
    return events


def read_full(rank_group: zarr.Group, level: str, step: int, key: str) -> tuple[np.ndarray, str, list[int]] | None:
    """A full tensor kept for --trace-full: (storage-dtype data, logical dtype, shape), or None."""
    try:
        a = rank_group[TRACES_GROUP][level][_step_name(step)]["full"][key]
    except KeyError:
        return None
    return np.asarray(a[...]), a.attrs["dtype"], list(a.attrs["shape"])


def trace_nbytes(rank_group: zarr.Group, level: str, step: int) -> int:
    """Bytes of one traced step on disk (its events and full tensors), for the benchmark."""
    import os

    store = rank_group.store
    root = getattr(store, "root", None)
    if root is None:
        return 0
    path = os.path.join(str(root), rank_group.path, TRACES_GROUP, level, _step_name(step))
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
