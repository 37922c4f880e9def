"""The spool: how a rank hands a step's tensors to its writer process through files.

One file per hand-off, in a folder owned by one rank and its writer:

    <seq>.part   being written by the rank (ignored by everyone else)
    <seq>.prov   a complete capture of an open step, which the rank may still replace
    <seq>.step   sealed: the writer process writes it to the store, then deletes it

A file only ever gets a .prov or .step name by a rename, after its last byte is written, so a name
that exists always holds a whole entry: the rename is the marker written last.

A rank may also fill an entry in place in a file of its own, `slab-<n>` (no entry name: ignored by
everyone else; tracekit/writer/handoff.py Slab), and hand it over by linking it as <seq>.part, then the
same rename. The writer process unlinks the entry's name before it says `done <seq>` and never
reads the entry again after that, so the rank then reuses the slab, its pages already allocated,
for a later entry (a reused slab's padding may hold old bytes; nothing reads padding). The bytes live in
the kernel's page cache (tmpfs under /dev/shm, or a temp folder), which outlives the rank however
it dies; a machine crash is not covered.

Layout of one entry: MAGIC, an 8-byte little-endian header length, a JSON header
{"step", "complete", "tensors": [{"kind", "name", "dtype", "shape", "offset", "nbytes"[, "shard"]}], "extra"}
(extra: {"trace": {"level", "events": "marshal"}} for a traced step, whose tensors are its --trace-full
ones, kind "trace", and its events as one marshal blob, kind TRACE_EVENTS; see Handoff.put_trace;
shard: the layout of a sharded tensor's piece, Shard.to_spool(); `shape` is the piece's), then
each tensor's bytes in storage dtype, each starting on a page boundary (entry_head()). A tensor whose
bytes are not kept and that the rank hashed and summarized itself carries "digest": true and, in
place of its bytes, a DIGEST_RECORD (its 16-byte hash, then its summary as float64), 8-byte
aligned. No torch here: the writer process never imports it.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tracekit.store.dtypes import storage_dtype
from tracekit.store import TensorData
from tracekit.store.hashing import HASH_BYTES
from tracekit.store.summaries import N_FIELDS
from tracekit.store.shards import Shard
from tracekit.writer.spool_names import PROV, STEP, entry_seq

MAGIC = b"TKSPOOL1"
# Tensors start at page boundaries in an entry (its mapping is page aligned): the writer can then
# hand a large one to the disk straight from the spool with O_DIRECT (tracekit/store/io.py).
ALIGN = 4096
TRACE_EVENTS, TRACE_EVENTS_MARSHAL = "trace_events", "marshal"  # a traced step's events: kind, codec


def _pad(n: int, align: int = ALIGN) -> int:
    return -n % align


# A tensor the rank hashed and summarized itself (its bytes are not kept, --full) travels as a
# record of its digest and its summary (float64, little-endian): {"digest": true} in the header.
DIGEST_RECORD = HASH_BYTES + 8 * N_FIELDS
_RECORD_ALIGN = 8  # records need no page of their own: only tensors' bytes go to the disk with O_DIRECT


def digest_record(digest: bytes, summary: np.ndarray) -> bytes:
    return digest + np.ascontiguousarray(summary, dtype="<f8").tobytes()


@dataclass(frozen=True)
class Layout:
    """Where the tensors of an entry sit, whatever its step: `tensors` is the header's JSON list,
    `offsets` each tensor's offset from the start of the data, `nbytes` the data's size."""

    tensors: str
    offsets: tuple[int, ...]
    nbytes: int


class EntrySpec(NamedTuple):
    """One tensor's place in an entry. A tuple (hashable, compared field by field) because a rank
    filling entries in place keys its caches on it and lays an entry out again only when the list
    of them changes (recorders/direct.py)."""

    kind: str
    name: str
    dtype: str  # its dtype's store name
    shape: tuple  # the piece's shape for a sharded tensor
    nbytes: int  # DIGEST_RECORD's size for a digested one
    shard: object  # its Shard, or None when the rank holds it whole
    digested: bool = False  # hashed and summarized by the rank: a digest record in place of its bytes


def layout(specs: "list[EntrySpec]") -> Layout:
    """The layout of the tensors `specs` describe; a digested one's nbytes are DIGEST_RECORD's."""
    entries, offset = [], 0
    for spec in specs:
        offset += _pad(offset, _RECORD_ALIGN if spec.digested else ALIGN)
        entry = {"kind": spec.kind, "name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape),
                 "offset": offset, "nbytes": spec.nbytes}
        if spec.shard is not None:
            entry["shard"] = spec.shard.to_spool()
        if spec.digested:
            entry["digest"] = True
        entries.append(entry)
        offset += spec.nbytes
    offset += _pad(offset)
    return Layout(json.dumps(entries), tuple(e["offset"] for e in entries), offset)


def entry_head(step: int, complete: bool, specs: "list[EntrySpec] | Layout", extra: dict | None = None) -> tuple[bytes, list[int], int]:
    """The head of an entry (MAGIC, header length, JSON header, padding) holding tensors laid out
    as `specs` say (a Layout, or the specs to lay out), each tensor's offset from the start of the
    file, and the entry's size. write_entry() and a rank filling an entry in place (Handoff.slab)
    lay entries out alike through it; a Layout is reused from step to step."""
    lay = specs if isinstance(specs, Layout) else layout(specs)
    # the JSON of {"step", "complete", "tensors", "extra"}, as json.dumps writes it, the tensors' part reused
    header = (f'{{"step": {json.dumps(step)}, "complete": {json.dumps(complete)}, "tensors": {lay.tensors}, '
              f'"extra": {json.dumps(extra or {})}}}').encode()
    head = MAGIC + struct.pack("<Q", len(header)) + header
    head += b"\0" * _pad(len(head))
    return head, [len(head) + o for o in lay.offsets], len(head) + lay.nbytes


def write_entry(path: str, step: int, complete: bool, tensors: list[tuple[str, TensorData]],
                extra: dict | None = None) -> int:
    """Write one entry to `path` (a .part name); returns its size. `tensors` are (kind, TensorData);
    `extra` (JSON) says what else the entry is, e.g. a step's trace."""
    specs = [EntrySpec(kind, t.name, t.dtype, t.shape, DIGEST_RECORD, t.shard, True) if t.digest is not None
             else EntrySpec(kind, t.name, t.dtype, t.shape, t.data.nbytes, t.shard) for kind, t in tensors]
    head, offsets, size = entry_head(step, complete, specs, extra)
    with open(path, "wb") as f:
        f.write(head)
        at = len(head)
        for (_, t), offset in zip(tensors, offsets):
            if offset > at:
                f.write(b"\0" * (offset - at))
            if t.digest is not None:
                data = np.frombuffer(digest_record(t.digest, t.summary), dtype=np.uint8)
            else:
                data = np.ascontiguousarray(t.data)
            if data.nbytes:
                f.write(memoryview(data.reshape(-1).view(np.uint8)))
            at = offset + data.nbytes
        if size > at:
            f.write(b"\0" * (size - at))
    return size


@dataclass
class Entry:
    step: int
    complete: bool
    kinds: dict[str, list[TensorData]]  # data are views of the mapped file: use before close()
    _map: mmap.mmap | None
    extra: dict

    def close(self) -> None:
        self.kinds = {}
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view; the map is freed with it
                pass


# Shard layouts read from entries, by value: a rank hands over the same layouts every step, and
# checking each anew (Shard.from_spool) was half of reading an entry of 600 pieces.
_SHARDS: dict[tuple, Shard] = {}
_SHARDS_MAX = 1 << 16


def _shard(doc) -> Shard:
    try:
        key = (tuple(doc["full_shape"]), tuple(doc["offset"]), tuple(doc["shape"]), tuple(doc["peers"]))
        known = _SHARDS.get(key)
    except (TypeError, KeyError):  # malformed: from_spool says what is wrong
        key, known = None, None
    if known is not None:
        return known
    shard = Shard.from_spool(doc)
    if key is not None:
        if len(_SHARDS) >= _SHARDS_MAX:
            _SHARDS.clear()
        _SHARDS[key] = shard
    return shard


def read_entry(path: str, populate: bool = True) -> Entry:
    """Map an entry; raises ValueError if it is not a whole spool entry.

    populate: map every page at once (MAP_POPULATE), for a caller that reads all the data; one
    page fault per page otherwise (about half the cost for a 60 MB entry, measured). False for
    a caller that wants the header only."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ) if size else None
    try:
        buf = memoryview(mapped) if mapped is not None else memoryview(b"")
        if bytes(buf[:len(MAGIC)]) != MAGIC:
            raise ValueError(f"{path} is not a spool entry")
        (hlen,) = struct.unpack("<Q", buf[len(MAGIC):len(MAGIC) + 8])
        start = len(MAGIC) + 8
        header = json.loads(bytes(buf[start:start + hlen]))
        base = start + hlen + _pad(start + hlen)
        kinds: dict[str, list[TensorData]] = {}
        dtypes: dict[str, np.dtype] = {}
        for e in header["tensors"]:
            logical = e["dtype"]
            sdt = dtypes.get(logical)
            if sdt is None:
                sdt = dtypes[logical] = storage_dtype(logical)
            lo = base + e["offset"]
            if lo + e["nbytes"] > size:
                raise ValueError(f"{path} is truncated")
            shard = _shard(e["shard"]) if "shard" in e else None
            if e.get("digest"):
                if e["nbytes"] != DIGEST_RECORD:
                    raise ValueError(f"{path}: a digest record of {e['nbytes']} bytes")
                record = bytes(buf[lo:lo + DIGEST_RECORD])
                t = TensorData(e["name"], logical, tuple(e["shape"]), np.empty(0, dtype=sdt), shard,
                               digest=record[:HASH_BYTES], summary=np.frombuffer(record[HASH_BYTES:], dtype="<f8").astype(np.float64))
            else:
                t = TensorData(e["name"], logical, tuple(e["shape"]), np.frombuffer(buf[lo:lo + e["nbytes"]], dtype=sdt), shard)
            kinds.setdefault(e["kind"], []).append(t)
        del buf
        return Entry(header["step"], header["complete"], kinds, mapped, header.get("extra") or {})
    except Exception:
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # views still alive; the map goes with them
                pass
        raise


def entries(folder: str, final: bool) -> list[tuple[int, str]]:
    """The entries to store now, in order: sealed ones; at the end (final), the open step's capture too."""
    suffixes = (STEP, PROV) if final else (STEP,)
    found = []
    for name in os.listdir(folder):
        seq = entry_seq(name)
        if seq is not None and name.endswith(suffixes):
            found.append((seq, name))
    return sorted(found)


def spooled_steps(folder: str) -> list[int]:
    """The steps of the entries still in a spool folder (a writer stopped before storing them),
    read from their headers; entries unreadable or gone meanwhile are skipped."""
    steps = []
    try:
        names = entries(folder, final=True)
    except OSError:
        return []
    for _, name in names:
        try:
            entry = read_entry(os.path.join(folder, name), populate=False)  # the step number only
        except (OSError, ValueError):
            continue
        steps.append(entry.step)
        entry.close()
    return sorted(set(steps))

