"""`tracekit verify`: check a whole store, and name every problem on its own line.

Format v2: every listed row's index (hash and finiteness arrays) is present and sized to the
tensor index, and every tensor's object exists, has the size its index entry implies and hashes
to the recorded value (each distinct object is read once), and each finiteness flag says what
its object's elements are. Format v1 stores carry no hashes, so
only their structure is checked: every chunk file of a listed row exists with its full size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tracekit.errors import StoreError
from tracekit.store import io
from tracekit.store.chunks import chunk_cols, chunk_key
from tracekit.store.consistency import check_metadata
from tracekit.store.hashing import FILE_PIECE
from tracekit.store.objects import scan_object
from tracekit.store.reader import RankView, RunStore, open_store
from tracekit.store.traces import LEVELS, full_keys, read_events, read_full, trace_steps


@dataclass(frozen=True)
class Problem:
    rank: int | None
    kind: str | None
    step: int | None
    tensor: str | None
    what: str

    def line(self) -> str:
        where = [f"rank {self.rank}" if self.rank is not None else None, self.kind,
                 f"step {self.step}" if self.step is not None else None,
                 f"tensor {self.tensor}" if self.tensor is not None else None]
        return "damaged: " + " ".join(w for w in where if w) + f": {self.what}"


@dataclass
class VerifyResult:
    path: str
    format_version: int
    problems: list[Problem] = field(default_factory=list)
    entries: int = 0  # (rank, kind, step, tensor) entries checked
    objects: int = 0  # distinct objects read (v2) or chunk files checked (v1)
    bytes_read: int = 0
    hashed: bool = True  # the format hashes tensors (store/formats/): objects are hashed, not only counted

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        what = (f"{self.entries} tensor entries, {self.objects} objects, {self.bytes_read} bytes hashed"
                if self.hashed else
                f"{self.entries} tensor entries, {self.objects} chunk files (format 1 has no hashes: structure only)")
        verdict = "OK" if self.ok else f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}"
        return f"verify: {verdict}: {self.path} ({what})"


def verify_store(path, on_problem: Callable[[Problem], None] | None = None) -> VerifyResult:
    """Check every rank, kind and listed step of a store; StoreError only if it cannot be opened at all."""
    store = path if isinstance(path, RunStore) else open_store(path)
    result = VerifyResult(store.path, store.format_version, hashed=store.format.hashed)

    def report(p: Problem) -> None:
        result.problems.append(p)
        if on_problem is not None:
            on_problem(p)

    try:
        ranks = store.ranks
    except StoreError as e:
        report(Problem(None, None, None, None, str(e)))
        return result
    check_metadata(store, lambda r, kind, step, what: report(Problem(r, kind, step, None, what)))
    known: dict = {}  # (hash, place) -> (its problem or None, finite), each read once; pack key -> its problem
    buf = np.empty(FILE_PIECE, dtype=np.uint8)
    for r in ranks:
        try:
            view = store.rank(r)
            view.coords, view.completed_steps
            kinds = view.kinds
        except StoreError as e:
            report(Problem(r, None, None, None, _strip(str(e), store.path)))
            continue
        for kind in kinds:
            try:
                tensors = view.tensors(kind)
                rows = view._step_rows(kind)
                view._check_index_arrays(kind)  # a step list naming rows an array lacks: once, for the kind
            except StoreError as e:
                report(Problem(r, kind, None, None, _strip(str(e), store.path).removeprefix(f"rank {r} {kind}: ")
                               .removeprefix(f"rank {r} {kind}/")))
                continue
            if not store.format.hashed:
                _verify_v1_kind(view, kind, tensors, rows, result, report)
            else:
                _verify_v2_kind(view, kind, tensors, rows, result, report, known, buf)
        _verify_traces(view, report)
    return result


def _verify_traces(view: RankView, report) -> None:
    """Each listed traced step's events and kept tensors read as diff reads them (bounded,
    store/bounded.py): damage is a problem under `traces/LEVEL`."""
    if not view.traced:
        return
    for level in LEVELS:
        kind = f"traces/{level}"
        try:
            steps = trace_steps(view.group, level)
        except StoreError as e:
            if str(e).startswith("traces: "):  # the traces group itself: once, not per level
                report(Problem(view.rank, "traces", None, None, str(e).removeprefix("traces: ")))
                return
            report(Problem(view.rank, kind, None, None, str(e)))
            continue
        for step in steps:
            try:
                read_events(view.group, level, step)
                for key in full_keys(view.group, level, step):
                    read_full(view.group, level, step, key)
            except StoreError as e:
                report(Problem(view.rank, kind, step, None, str(e).removeprefix(f"trace of {level} at step {step}: ")))


def _strip(message: str, path: str) -> str:
    return message.removeprefix("damaged store: ").removeprefix(f"{path}: ")


def _verify_v2_kind(view: RankView, kind, tensors, rows, result, report, known, buf) -> None:
    root = view.store.path
    io_root = view.store.io_root
    for step, row in rows.items():
        try:
            digests = view._row_digests(kind, row)
            flags = view.finite(kind, step)
            view.check_summaries(kind, step)
            locs = view._locations(kind, row)  # a packed row's: from its hashes and the previous row's
        except StoreError as e:
            message = _strip(str(e), root)
            here = f"rank {view.rank} {kind} step {step}: "
            # a packed row's bytes are found through the previous row: damage there is named as its own
            if message.startswith(f"rank {view.rank} {kind} step "):  # a packed row is found through the
                message = message.removeprefix(here) if message.startswith(here) else "through " + message  # previous one
            else:
                message = message.split(": ", 1)[-1]
            report(Problem(view.rank, kind, step, None, message))
            continue
        _check_pack_sizes(view, kind, step, locs, known, report)
        for info, digest, loc in zip(tensors, digests, locs):
            result.entries += 1
            if not info.keeps_bytes:
                continue  # summary and hash only (--full): no object to check the hash against
            if (digest, loc) not in known:
                known[digest, loc] = scan_object(io_root, digest, info, buf, loc)
                result.objects += 1
                if known[digest, loc][0] is None:  # the object's bytes: a shard's, not the whole tensor's
                    result.bytes_read += info.stored_nbytes
            problem, finite = known[digest, loc]
            if problem is None and flags[info.name] != finite:
                problem = (f"its finite index says {'all finite' if flags[info.name] else 'not all finite'}, "
                           "its bytes say otherwise")
            if problem is not None:
                report(Problem(view.rank, kind, step, info.name, problem))


def _check_pack_sizes(view: RankView, kind, step, locs, known, report) -> None:
    """A pack (store/packs.py) holds exactly its members' bytes: one longer than they are is damage
    its members' own checks cannot see. Each pack is looked at once."""
    ends: dict[str, int] = {}
    for loc in locs:
        if loc.length is not None:
            ends[loc.key] = max(ends.get(loc.key, 0), loc.base + loc.length)
    for key, end in ends.items():
        if key not in known:
            size = io.size(view.store.io_root, key)
            known[key] = (None if size is None or size <= end  # missing or short: each member says so
                          else f"pack {key} has {size} bytes, its members {end}")
        if known[key] is not None:
            report(Problem(view.rank, kind, step, None, known[key]))


def _verify_v1_kind(view: RankView, kind, tensors, rows, result, report) -> None:
    root = view.store.io_root  # a folder, or a URL's Location (one HEAD per chunk object)
    for key in sorted({t.array for t in tensors}):
        try:
            arr = view._storage_array(kind, key)
        except Exception as e:
            report(Problem(view.rank, kind, None, None, f"cannot open array {key!r} ({e.__class__.__name__})"))
            continue
        members = [t for t in tensors if t.array == key]
        for t in members:
            if t.offset + t.numel > arr.shape[1]:
                report(Problem(view.rank, kind, None, t.name,
                               f"index entry [{t.offset}, {t.offset + t.numel}) lies outside array {key} (width {arr.shape[1]})"))
        width, item = arr.chunks[1], arr.dtype.itemsize
        for step, row in rows.items():
            result.entries += len(members)
            if row >= arr.shape[0]:
                report(Problem(view.rank, kind, step, None, f"array {key} has no row {row}"))
                continue
            for c in chunk_cols(0, arr.shape[1], width):
                result.objects += 1
                ck = chunk_key(arr, row, c)
                size = io.size(root, ck)
                if size is None:
                    report(Problem(view.rank, kind, step, None, f"chunk file {ck} is missing"))
                elif size != width * item:
                    report(Problem(view.rank, kind, step, None, f"chunk file {ck} has {size} bytes, expected {width * item}"))
