"""The content hash of a recorded tensor (format v2): 128-bit xxh3 of its identity and bytes.

xxh3-128 was chosen over blake3 by bench/bench_hash.py (single thread, the recorder's case).
It is not cryptographic: it guards against damage (bit flips, misplaced or truncated files, a
stale index), not against someone forging a store. For n distinct tensors the chance that any
two share a hash is about n^2 / 2^129: 1e12 tensors -> ~1.5e-15.

The hash covers the tensor's name, logical dtype and shape as well as its bytes, so an index
entry that points at another tensor's bytes fails the check even when the sizes agree. Ranks and
steps are not hashed: the same tensor with the same bytes on two ranks or at two steps is one
object, stored once. Format 4 ties each index row (these hashes among it) to its rank, kind and
step by its seal instead (summaries.row_identity).
"""

from __future__ import annotations

import numpy as np
import xxhash

HASH_BYTES = 16
ALGORITHM = "xxh3-128"
# Bytes fed to the hasher at a time when hashing a file (bounded memory).
FILE_PIECE = 8 << 20


def identity(name: str, dtype: str, shape, shard=None) -> bytes:
    """What the hash covers besides the bytes: the tensor's name, logical dtype, (full) shape and,
    for a shard, its place. A writer appending the same tensors every step computes it once."""
    ident = f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\0"
    if shard is not None:  # a piece of the tensor: where it sits is part of what it is
        ident += shard.identity() + "\0"
    return ident.encode()


def hasher(name: str, dtype: str, shape, shard=None):
    """A streaming hasher primed with the tensor's identity (and, for a shard, its place in the
    full tensor); update() it with the bytes in order."""
    h = xxhash.xxh3_128()
    h.update(identity(name, dtype, shape, shard))
    return h


def combined(digests) -> bytes:
    """One digest for a tensor held as pieces: the hash of its pieces' digests in peer order. Equal
    when every piece is equal, so the diff can decide a sharded tensor by hash like a whole one."""
    h = xxhash.xxh3_128()
    for d in digests:
        h.update(d)
    return h.digest()


def tensor_hash(name: str, dtype: str, shape, data: np.ndarray, shard=None) -> bytes:
    """The 16-byte digest of a tensor (or of its shard) whose bytes (storage dtype, C order) are `data`."""
    return digest_of(identity(name, dtype, shape, shard), data)


def digest_of(ident: bytes, data: np.ndarray) -> bytes:
    """tensor_hash() of a tensor whose identity() is `ident`."""
    h = xxhash.xxh3_128(ident)
    h.update(memoryview(np.ascontiguousarray(data)).cast("B"))
    return h.digest()
