"""Store entries <-> torch tensors, bit for bit (bfloat16 and float8 travel as their raw bits)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tracekit.store.dtypes import storage_dtype
from tracekit.errors import StoreError
from tracekit.store import TensorData
from tracekit.store.hashing import identity
from tracekit.store.shards import full_shape
from tracekit.store.summaries import DigestCache

# numpy lacks these dtypes; the store keeps their bits in an unsigned integer array of equal width
_BITS_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def to_torch(bits: np.ndarray, dtype: str, shape: tuple[int, ...]):
    """Stored data (storage dtype, flat) -> a torch tensor of the logical dtype and shape."""
    import torch

    try:
        storage_dtype(dtype)
    except ValueError:  # a damaged or foreign tensor index: refuse rather than export wrong bits
        raise StoreError(f"dtype {dtype!r} is not one a tracekit store holds") from None
    data = np.array(bits, copy=True)  # owned and writable: torch.from_numpy shares memory
    if dtype in _BITS_VIEW:
        data = data.view(np.dtype(_BITS_VIEW[dtype]))
        return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
    return torch.from_numpy(data).reshape(shape)


def from_torch(name: str, t) -> TensorData:
    """A CPU torch tensor -> a store entry; raises ValueError for dtypes a store cannot hold."""
    import torch

    dtype = str(t.dtype).removeprefix("torch.")
    storage_dtype(dtype)  # ValueError: unsupported
    t = t.detach().to("cpu").contiguous()
    if dtype in _BITS_VIEW:
        data = t.view(getattr(torch, _BITS_VIEW[dtype])).numpy().view(storage_dtype(dtype))
    else:
        data = t.numpy()
    return TensorData(name, dtype, tuple(t.shape), data)


def from_torch_piece(name: str, local, shard) -> TensorData:
    """This rank's piece of a sharded tensor (a tracekit.store.shards.Shard says where it sits) -> a
    store entry that carries its layout to the store writer, through the spool hand-off too."""
    return replace(from_torch(name, local), shard=shard)


def digested(t: TensorData, cache: DigestCache, slot) -> TensorData:
    """The entry with its hash and summary in place of its bytes: a tensor whose bytes are not kept
    (--full), hashed and summarized where it is recorded, so that its bytes need not travel. The
    hash and summary are the ones the store writer computes from the bytes (same code). `cache`
    and `slot`: a frozen tensor is hashed first and its summary reused (DigestCache)."""
    data = np.ascontiguousarray(t.data).reshape(-1)
    digest, summary = cache.get(slot, identity(t.name, t.dtype, full_shape(t.shape, t.shard), t.shard), data, t.dtype)
    return replace(t, data=data[:0], digest=digest, summary=summary)
