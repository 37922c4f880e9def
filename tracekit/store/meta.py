"""Typed metadata of a store's kind groups: the tensor index and the kind's attributes.

`from_attrs` checks what it reads (a malformed entry is a ValueError/TypeError/KeyError the
reader turns into one StoreError line); `to_attrs` is exactly what the writer stores, and the
JSON Schema (schemas/store-metadata.schema.json, `$defs` `tensor` and `kind`) describes it.
"""

from __future__ import annotations

import json
import math
import threading

from dataclasses import dataclass, field

from tracekit.store.dtypes import storage_dtype
from tracekit.store.packs import PACKS, PackSpec
from tracekit.store.shards import Shard

# Attribute keys of a kind group.
TENSORS = "tensors"
STEPS = "steps"
HASH = "hash"
SHARD = "shard"  # an index entry's field (v2): the rank's piece of a sharded tensor
BYTES = "bytes"  # an index entry's field (v2), present only as false: summary and hash only (--full)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a kind: its identity and where its elements sit in its storage array's row."""

    name: str
    dtype: str  # logical dtype: float32, bfloat16, ...
    shape: tuple[int, ...]
    array: str  # storage array (v1: the packed array; v2: the virtual row of that dtype)
    offset: int
    numel: int
    # v2 only: the piece of the tensor this rank wrote, when it holds a shard (tracekit/store/shards.py)
    shard: Shard | None = None
    # v2 only: False when the recording kept only this tensor's summary and hash (--full), no object
    keeps_bytes: bool = True

    @property
    def nbytes(self) -> int:
        return self.numel * storage_dtype(self.dtype).itemsize

    @property
    def stored_numel(self) -> int:
        """Elements in this rank's object of the tensor: the whole tensor, or its shard."""
        return self.shard.numel if self.shard is not None else self.numel

    @property
    def stored_nbytes(self) -> int:
        """Bytes of this rank's object of the tensor (its shard's, for a piece)."""
        return self.stored_numel * storage_dtype(self.dtype).itemsize

    @classmethod
    def from_attrs(cls, entry: dict) -> "TensorInfo":
        """One index entry, checked (a dtype tracekit cannot store is damage too)."""
        def integer(v):  # strict: 1.5, "3" or true in an index entry is damage, not a number
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{v!r} is not an integer")
            return v

        if not isinstance(entry["name"], str) or not isinstance(entry["array"], str) or not isinstance(entry["shape"], list):
            raise ValueError("name, array and shape must be two strings and a list")
        shape = tuple(integer(d) for d in entry["shape"])
        if BYTES in entry and entry[BYTES] is not False:
            raise ValueError(f"tensor {entry['name']!r}: {BYTES} is {entry[BYTES]!r}; only false may be written")
        # one construction per entry (a frozen dataclass's is slow, and an index holds thousands)
        info = cls(entry["name"], str(entry["dtype"]), shape, entry["array"], integer(entry["offset"]),
                   integer(entry["numel"]), Shard.from_attrs(entry[SHARD], shape) if SHARD in entry else None,
                   BYTES not in entry)
        storage_dtype(info.dtype)  # raises ValueError for an unknown dtype
        # math.prod: exact for any size (np.prod would wrap a hostile shape around int64)
        if any(d < 0 for d in info.shape) or info.offset < 0 or info.numel != math.prod(info.shape):
            raise ValueError(f"tensor {info.name!r}: offset/numel do not match its shape")
        return info

    def to_attrs(self) -> dict:
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "array": self.array,
               "offset": self.offset, "numel": self.numel}
        if self.shard is not None:
            out[SHARD] = self.shard.to_attrs()
        if not self.keeps_bytes:
            out[BYTES] = False
        return out


def index_of(tensors) -> tuple[list[TensorInfo], dict[str, int]]:
    """The index of tensors given as (name, dtype, shape) in order: each packed after the previous
    one of its dtype; and each storage array's width."""
    widths: dict[str, int] = {}
    out = []
    for name, dtype, shape in tensors:
        shape = tuple(int(d) for d in shape)
        numel = math.prod(shape)  # exact, and ~100x cheaper than np.prod on a short tuple (per tensor on open)
        out.append(TensorInfo(name, dtype, shape, dtype, widths.get(dtype, 0), numel))
        widths[dtype] = widths.get(dtype, 0) + numel
    return out, widths


def misplaced(infos) -> TensorInfo | None:
    """The first parsed entry whose address is not the one index_of() gives its place (format 2
    addresses are virtual: they follow from the names, dtypes and shapes), else None. Compared
    without building the expected entries: a diff opens thousands."""
    widths: dict[str, int] = {}
    for info in infos:  # (numel == prod(shape) was checked by from_attrs)
        offset = widths.get(info.dtype, 0)
        if info.array != info.dtype or info.offset != offset:
            return info
        widths[info.dtype] = offset + info.numel
    return None


def encode_index(entries: list) -> str:
    """The tensor index as one JSON text (format 5's `tensors` attribute): compact, in C."""
    return json.dumps(entries, separators=(",", ":"), allow_nan=False)


def decode_index(value) -> list:
    """The entries of a format-5 `tensors` attribute: TypeError/ValueError when it is not the JSON
    text of a list (the reader's `malformed tensor index`)."""
    if not isinstance(value, str):
        raise TypeError("the tensor index is not a JSON text")
    try:
        entries = json.loads(value)
    except RecursionError:  # a hostile text nested deeper than json parses: damage, one line
        raise ValueError("the tensor index is nested too deeply") from None
    if not isinstance(entries, list):
        raise TypeError("the tensor index is not a list")
    return entries


def edit_index(attrs: dict, edit) -> None:
    """edit(entries) on a kind's `tensors` attribute, kept in the form it had (a list of entries,
    or format 5's JSON text): for tests and tools that change an index on purpose."""
    text = isinstance(attrs.get(TENSORS), str)
    entries = decode_index(attrs[TENSORS]) if text else attrs[TENSORS]
    edit(entries)
    attrs[TENSORS] = encode_index(entries) if text else entries


@dataclass
class KindMeta:
    """A kind group's attributes: the tensor index, the step of each row, the hash (format 2),
    how its small tensors are packed (format 3: store/packs.py; None: every tensor its own object)."""

    tensors: list[TensorInfo]
    steps: list[int] = field(default_factory=list)
    hash: str | None = None
    packs: PackSpec | None = None

    @classmethod
    def from_attrs(cls, attrs: dict, index_text: bool = False) -> "KindMeta":
        """index_text: the index is one JSON text (format 5), not a list of entries."""
        entries = decode_index(attrs[TENSORS]) if index_text else attrs[TENSORS]
        if not isinstance(entries, list):
            raise TypeError("the tensor index is not a list")
        steps = attrs.get(STEPS, [])
        if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise TypeError("the step list is not a list of integers")
        return cls([TensorInfo.from_attrs(e) for e in entries], list(steps), attrs.get(HASH),
                   PackSpec.from_attrs(attrs.get(PACKS)))

    def to_attrs(self, index_text: bool = False) -> dict:
        entries = [t.to_attrs() for t in self.tensors]
        out = {TENSORS: encode_index(entries) if index_text else entries, STEPS: list(self.steps)}
        if self.hash is not None:
            out[HASH] = self.hash
        if self.packs is not None:
            out[PACKS] = self.packs.to_attrs()
        return out


class SharedIndexes:
    """Parsed tensor indexes, shared by the ranks of a store and by the stores of one comparison.

    DDP ranks hold equal index entries, and two recordings of one model and layout hold equal
    entries rank by rank: an index equal to one parsed before is found by comparing the entries
    (C speed, and a differing index usually differs in its first entry) instead of parsed and
    checked again (~5-8 us an entry). What is kept is the caller's result, immutable
    (TensorInfo and Shard are frozen); an index that failed to parse is never kept."""

    def __init__(self):
        self._by_key: dict[tuple, list[tuple[list, object]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(entries, version: int) -> tuple | None:
        """entries: the `tensors` attribute as stored: a list of entries, or (format 5) its JSON text,
        compared as a string (in C)."""
        if isinstance(entries, str):  # a text that is not bracketed as a JSON list: malformed, parsed (and refused) the usual way
            return (version, len(entries), entries[:200], entries[-200:]) if entries[:1] + entries[-1:] == "[]" else None
        if not isinstance(entries, list):
            return None
        try:
            key = (version, len(entries), entries[0]["name"], entries[-1]["name"]) if entries else (version, 0)
            hash(key)
        except Exception:  # malformed: parsed (and refused) the usual way
            return None
        return key

    def get(self, entries, version: int):
        """The result kept for entries equal to these in a store of this format, or None."""
        key = self._key(entries, version)
        if key is None:
            return None
        with self._lock:
            candidates = list(self._by_key.get(key, ()))
        for kept, result in candidates:
            if kept is entries or kept == entries:
                return result
        return None

    def put(self, entries, version: int, result) -> None:
        key = self._key(entries, version)
        if key is not None:
            with self._lock:
                self._by_key.setdefault(key, []).append((entries, result))
