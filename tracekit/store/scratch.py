"""Work buffers each thread reuses: a fresh large numpy array costs page faults on every use."""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()


def thread_buffer(name: str, n: int, dtype) -> np.ndarray:
    """This thread's buffer `name` of n elements of dtype (made once, then reused)."""
    bufs = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(name)
    if buf is None:
        buf = bufs[name] = np.empty(n, dtype=dtype)
    return buf
