"""Shard-local tensors (format 2): each rank writes only the piece of a sharded tensor it holds.

A DTensor / FSDP2 parameter sharded over a device mesh is recorded without a collective: every
rank writes its local piece as its own content-addressed object, and the index entry says where
that piece sits in the full tensor (`Shard`: the full shape, the piece's offset and shape, and the
ranks whose pieces together tile the tensor). Readers assemble the full tensor of a rank from the
pieces of those ranks at the same step (tracekit/store/objects.py), so every reader still sees a
full tensor per rank and step.

A rank hands its tensors to its writer process through spool files whose format this module does
not own (recorders/spool.py); a piece travels there as a TensorData whose name carries the layout
after a NUL marker (`pack` / `unpack`). Only the store writer unpacks it, so no other module knows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# Cannot occur in a tensor name that Python code gives a module attribute (names are identifiers
# joined by dots); an entry whose name holds it carries a shard layout, not a name.
_MARK = "\0tracekit-shard\0"


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
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
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


def pack(name: str, shard: Shard) -> str:
    """A tensor name carrying its shard layout through the spool hand-off (see the module doc)."""
    return name + _MARK + json.dumps({"full_shape": list(shard.full_shape), **shard.to_attrs()})


def unpack(name: str) -> tuple[str, Shard | None]:
    """(the tensor's name, its shard layout or None): the inverse of pack()."""
    base, mark, rest = name.partition(_MARK)
    if not mark:
        return name, None
    doc = json.loads(rest)
    return base, Shard.from_attrs(doc, tuple(doc["full_shape"]))
