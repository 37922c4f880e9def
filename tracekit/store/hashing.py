"""The content hash of a recorded tensor (format v2): 128-bit xxh3 of its identity and bytes.

xxh3-128 was chosen over blake3 by bench/bench_hash.py (single thread, the recorder's case).
It is not cryptographic: it guards against damage (bit flips, misplaced or truncated files, a
stale index), not against someone forging a store. For n distinct tensors the chance that any
two share a hash is about n^2 / 2^129: 1e12 tensors -> ~1.5e-15.

The hash covers the tensor's name, logical dtype and shape as well as its bytes, so an index
entry that points at another tensor's bytes fails the check even when the sizes agree. Ranks and
steps are not hashed: the same tensor with the same bytes on two ranks or at two steps is one
object, stored once.
"""

from __future__ import annotations

import numpy as np
import xxhash

HASH_BYTES = 16
ALGORITHM = "xxh3-128"
# Bytes fed to the hasher at a time when hashing a file (bounded memory).
FILE_PIECE = 8 << 20


def _identity(name: str, dtype: str, shape) -> bytes:
    return f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\0".encode()


def hasher(name: str, dtype: str, shape):
    """A streaming hasher primed with the tensor's identity; update() it with the bytes in order."""
    h = xxhash.xxh3_128()
    h.update(_identity(name, dtype, shape))
    return h


def tensor_hash(name: str, dtype: str, shape, data: np.ndarray) -> bytes:
    """The 16-byte digest of a tensor whose bytes (storage dtype, C order) are `data`."""
    h = hasher(name, dtype, shape)
    h.update(memoryview(np.ascontiguousarray(data)).cast("B"))
    return h.digest()
