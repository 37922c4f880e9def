"""Shard-local tensors (format 2): each rank writes only the piece of a sharded tensor it holds.

A DTensor / FSDP2 parameter sharded over a device mesh is recorded without a collective: every
rank writes its local piece as its own content-addressed object, and the index entry says where
that piece sits in the full tensor (`Shard`: the full shape, the piece's offset and shape, and the
ranks whose pieces together tile the tensor). Readers assemble the full tensor of a rank from the
pieces of those ranks at the same step (tracekit/store/objects.py), so every reader still sees a
full tensor per rank and step.

A piece travels to the store writer as a TensorData whose `shard` field is its Shard (through the
rank's spool hand-off too: tracekit/writer/spool.py keeps it in the entry's header, as to_spool()).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_INT = frozenset({int})


def full_shape(shape, shard: "Shard | None") -> tuple[int, ...]:
    """The shape of the whole tensor that a recorded tensor of local `shape` is (a replica) or is a
    piece of (`shard`): what its hash identity and its index entry name."""
    return tuple(int(d) for d in shape) if shard is None else shard.full_shape


@dataclass(frozen=True)
class Shard:
    """Where one rank's piece sits in the full tensor."""

    full_shape: tuple[int, ...]
    offset: tuple[int, ...]  # the piece's global offset per dimension
    shape: tuple[int, ...]  # the piece's shape
    peers: tuple[int, ...]  # the ranks whose pieces tile the full tensor (this rank among them), mesh order

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_attrs(self) -> dict:
        return {"offset": list(self.offset), "shape": list(self.shape), "peers": list(self.peers)}

    @classmethod
    def from_attrs(cls, attrs: dict, full_shape: tuple[int, ...]) -> "Shard":
        """An index entry's `shard` field, checked: ValueError/TypeError/KeyError when malformed."""
        if not isinstance(attrs, dict):
            raise TypeError("a shard layout is not an object")

        def ints(key: str) -> tuple[int, ...]:
            v = attrs[key]
            # types compared exactly (a bool is no integer here), in C: every sharded entry of an
            # index is parsed at open, tens of thousands in a many-rank store
            if not isinstance(v, list) or not set(map(type, v)) <= _INT or (v and min(v) < 0):
                raise ValueError(f"shard {key} must be a list of non-negative integers")
            return tuple(v)

        offset, shape, peers = ints("offset"), ints("shape"), ints("peers")
        if len(offset) != len(full_shape) or len(shape) != len(full_shape):
            raise ValueError("shard offset/shape do not match the tensor's dimensions")
        if any(o + n > d for o, n, d in zip(offset, shape, full_shape)):
            raise ValueError("the shard lies outside the tensor")
        if not peers or len(set(peers)) != len(peers):
            raise ValueError("shard peers must be distinct ranks")
        return cls(tuple(full_shape), offset, shape, peers)

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offset, self.shape))

    def identity(self) -> str:
        """What the piece's content hash covers besides its bytes (not the peers: equal pieces of
        two replica groups are one object)."""
        return f"shard {','.join(map(str, self.offset))} {','.join(map(str, self.shape))}"

    def to_spool(self) -> dict:
        """The layout as a JSON object (the spool entry header's `shard`); from_spool() reads it back."""
        return {"full_shape": list(self.full_shape), **self.to_attrs()}

    @classmethod
    def from_spool(cls, doc: dict) -> "Shard":
        return cls.from_attrs(doc, tuple(doc["full_shape"]))
