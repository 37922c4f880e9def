"""Packs (format 3): a row's small tensors stored together as one object, not one file each.

A 10M-parameter FSDP rank records ~600 tensors a step, most of them under 1 MiB; one file each
made file creation the writer's largest cost (0.05-0.5 ms a file on ext4, the larger after
recent deletions; on an object store one PUT each). In a kind written with packs, the tensors
of a row whose bytes are kept and that are smaller than `below` bytes are laid back to back, in
index order, into packs of at most `max` bytes: one pack for the row's whole tensors, one for its
pieces of sharded tensors (so whole tensors, which DDP and TP replicas share, never share a pack
with a rank's own pieces). A pack is named by the hash of its members' hashes, so ranks and steps
that hold the same members write it once, like any object; every other tensor is its own object.

A tensor whose hash is the one it had at the kind's previous row (a frozen parameter, its zero
delta) is not packed again: it is its own object, written once, the first time it comes back
unchanged. So a frozen tensor's bytes are stored at most twice (in its first row's pack and as its
object), however many steps it stays frozen, and a pack changes only with the tensors in it.

Readers find a tensor's bytes from the row's hashes, the previous row's and the kind's index alone:
the grouping is a function of them and of (`below`, `max`), which the kind's attributes record
(`packs`). Each member's bytes are checked against its own hash on read, as an object's are. As the
pack's name is computed from its members' hashes, a damaged hash entry of one member leaves the
pack unfound for every member: each is then reported damaged ("its object ... is missing").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import xxhash

from tracekit.store.format import object_key

PACKS = "packs"  # the kind group's attribute: {"below": bytes, "max": bytes}; absent: no packs
BELOW = 1 << 20  # tensors under this many bytes are packed (larger ones: own objects, O_DIRECT writes)
MAX = 16 << 20  # bytes per pack at most: the writer stages a pack in memory before writing it
_DOMAIN = b"tracekit pack\0"  # a pack's name never equals a tensor's (whose hash starts with its name)


@dataclass(frozen=True)
class Located:
    """Where a tensor's bytes lie: the object `key`, from byte `base`, `length` bytes (None: the
    whole object, a tensor's own). `label` names them in messages."""

    key: str
    base: int = 0
    length: int | None = None

    @property
    def label(self) -> str:
        if self.length is None:
            return self.key
        return f"{self.key} (pack bytes {self.base}-{self.base + self.length})"


@dataclass(frozen=True)
class PackSpec:
    below: int = BELOW
    max: int = MAX

    def to_attrs(self) -> dict:
        return {"below": self.below, "max": self.max}

    @classmethod
    def from_attrs(cls, value) -> "PackSpec | None":
        """The kind attribute's value (None: a kind without packs); ValueError when malformed."""
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {"below", "max"}:
            raise ValueError(f"{PACKS} is {value!r}, not {{below, max}}")
        below, most = value["below"], value["max"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (below, most)):
            raise ValueError(f"{PACKS} is {value!r}: below and max must be non-negative integers")
        return cls(below, most)


def pack_key(member_digests: Sequence[bytes]) -> str:
    """The object key of a pack holding tensors with these hashes, in this order."""
    return object_key(xxhash.xxh3_128_digest(_DOMAIN + b"".join(member_digests)))


def groups(spec: PackSpec, sizes: Sequence[int | None], sharded: Sequence[bool]) -> list[list[int]]:
    """The packs of a row: positions of their members, in order. `sizes`: each tensor's stored
    bytes, None when its bytes are not kept; `sharded`: whether it is a rank's piece."""
    out = []
    for want in (False, True):
        current, used = [], 0
        for i, (n, sh) in enumerate(zip(sizes, sharded)):
            if n is None or sh != want or n >= spec.below:
                continue
            if current and used + n > spec.max:
                out.append(current)
                current, used = [], 0
            current.append(i)
            used += n
        if current:
            out.append(current)
    return out


def locations(spec: PackSpec | None, digests: Sequence[bytes], sizes: Sequence[int | None],
              sharded: Sequence[bool], previous: Sequence[bytes] | None = None) -> list[Located]:
    """Where each tensor of a row lies (one Located per position; a tensor whose bytes are not
    kept gets its would-be own object, which no reader opens). `previous`: the hashes of the
    kind's previous row (None at its first): a tensor unchanged since then is its own object."""
    out = [Located(object_key(d)) for d in digests]
    if spec is None:
        return out
    if previous is not None:
        sizes = [None if p == d else n for n, d, p in zip(sizes, digests, previous)]
    for members in groups(spec, sizes, sharded):
        key = pack_key([digests[i] for i in members])
        base = 0
        for i in members:
            out[i] = Located(key, base, sizes[i])
            base += sizes[i]
    return out
