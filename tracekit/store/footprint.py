"""Where a local store's bytes go: every file counted once, under the role it plays in the layout.

bench/bench_store_size.py prints this beside its store / unique-bytes ratio, so a change in the
metadata's size shows as the role that grew (docs/FORMAT.md, *Content addressing*). Only
tracekit/store knows the layout; this reads it from the file names alone (no zarr), so it also
accounts for a damaged or half-written store.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from tracekit.store.format import OBJECTS_DIR, RANK_PREFIX
from tracekit.store.ownership import LOCK_ENTRIES
from tracekit.store.format import TRACES_GROUP

ZARR_JSON = "zarr.json"
CONSOLIDATED = "consolidated_metadata"

# Roles, in the order they are printed.
OBJECTS = "objects"  # tensor bytes, one file per content hash
ROWS = "rows"  # index arrays' chunk files; per array name: rows/hash, rows/finite, rows/summary (v1: rows/<dtype>)
DOC_ROOT = "documents/root"  # the root zarr.json less its consolidated copy: the run's metadata
DOC_CONSOLIDATED = "documents/consolidated"  # the copy of every document zarr.consolidate_metadata adds to the root
DOC_RANKS = "documents/ranks"  # rank_R/zarr.json: coords, run, env, versions, steps, status
DOC_KINDS = "documents/kinds"  # rank_R/KIND/zarr.json: the tensor index and the step list
DOC_ARRAYS = "documents/arrays"  # rank_R/KIND/ARRAY/zarr.json and objects/zarr.json: zarr's array metadata
TRACES = "traces"  # rank_R/traces/...: the event streams of --trace
CLAIMS = "claims"  # the job's and the writers' lock groups
TEMPORARY = "temporary"  # names a write in progress (or a crash during one) leaves behind
OTHER = "other"


def _is_temporary(name: str) -> bool:
    # store/io.py: `.tmp-<tag>-<n>` beside an object, `zarr.<tag>.partial` beside a document (zarr's
    # own); `zarr.json.<pid>.tmp`: a root rewritten by an older tracekit's launcher
    return name.startswith(".tmp-") or name.endswith((".partial", ".tmp"))


@dataclass
class Footprint:
    """Bytes and files per role; `bytes['rows/summary']` etc. for each index array."""

    bytes: Counter = field(default_factory=Counter)
    files: Counter = field(default_factory=Counter)
    ranks: int = 0

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    @property
    def metadata(self) -> int:
        """Everything but the tensor bytes."""
        return self.total - self.bytes[OBJECTS]

    def add(self, role: str, n: int) -> None:
        self.bytes[role] += n
        self.files[role] += 1


def role_of(parts: list[str]) -> str:
    """The role of a file, given its path's components relative to the store root."""
    name = parts[-1]
    if _is_temporary(name):
        return TEMPORARY
    top = parts[0]
    if top == OBJECTS_DIR:
        return DOC_ARRAYS if parts[1:] == [ZARR_JSON] else OBJECTS
    if top in LOCK_ENTRIES:
        return CLAIMS
    if top.startswith(RANK_PREFIX) and len(parts) >= 2:
        if len(parts) >= 3 and parts[1] == TRACES_GROUP:
            return TRACES
        if parts[1:] == [ZARR_JSON]:
            return DOC_RANKS
        if len(parts) == 3 and name == ZARR_JSON:
            return DOC_KINDS
        if len(parts) == 4 and name == ZARR_JSON:
            return DOC_ARRAYS
        if (len(parts) >= 5 and parts[3] == "c") or (len(parts) == 4 and name.startswith("c.")):  # "/" or "." keys
            return f"{ROWS}/{parts[2]}"
    return OTHER


def _consolidated_bytes(raw: bytes) -> int:
    """How many bytes of the root document its consolidated copy takes: the document's size less
    that of the same document without it, both as zarr writes them (json.dumps, compact)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return 0
    if not isinstance(doc, dict) or CONSOLIDATED not in doc:
        return 0
    indent = 2 if raw[1:2] == b"\n" else None  # stores written before the metadata went unindented
    rest = {k: v for k, v in doc.items() if k != CONSOLIDATED}
    return max(0, len(raw) - len(json.dumps(rest, indent=indent, allow_nan=True).encode()))


def footprint(path: str) -> Footprint:
    """Account for every file of the local store at `path`."""
    out = Footprint()
    for folder, dirs, files in os.walk(path):
        rel = os.path.relpath(folder, path)
        base = [] if rel == "." else rel.split(os.sep)
        if not base:
            out.ranks = sum(1 for d in dirs if d.startswith(RANK_PREFIX) and d[len(RANK_PREFIX):].isdigit())
        for name in files:
            full = os.path.join(folder, name)
            size = os.stat(full).st_size
            if not base and name == ZARR_JSON:
                with open(full, "rb") as f:
                    cons = _consolidated_bytes(f.read())
                out.add(DOC_ROOT, size - cons)
                if cons:
                    out.add(DOC_CONSOLIDATED, cons)
                continue
            out.add(role_of(base + [name]), size)
    return out


def describe(fp: Footprint, unique: int | None = None, rows: int | None = None) -> list[str]:
    """Lines for a report: each role's bytes, files, share of the store and, with `unique` (the
    unique tensor bytes), its share of them; per rank and, with `rows` (recorded rows of a rank,
    all kinds), per rank and row."""
    lines = []
    order = [OBJECTS] + sorted(r for r in fp.bytes if r.startswith(ROWS + "/")) + [
        DOC_ROOT, DOC_CONSOLIDATED, DOC_RANKS, DOC_KINDS, DOC_ARRAYS, TRACES, CLAIMS, TEMPORARY, OTHER]
    for role in order:
        if not fp.files[role]:
            continue
        n = fp.bytes[role]
        line = f"  {role:24s} {n:12,d} B {fp.files[role]:7d} files {100 * n / max(fp.total, 1):6.2f}% of store"
        if unique:
            line += f" {n / unique:7.4f} of unique"
        if fp.ranks and role != OBJECTS:
            line += f" {n / fp.ranks:9.0f} B/rank"
        lines.append(line)
    per_rank = fp.metadata / fp.ranks if fp.ranks else float("nan")
    tail = f"  {'metadata (all but objects)':24s} {fp.metadata:12,d} B, {per_rank:.0f} B per rank"
    if rows:
        tail += f", {per_rank / rows:.0f} B per rank and recorded row"
    lines.append(tail)
    return lines
