"""Work buffers: each thread's own, reused (a fresh large numpy array costs page faults on every use),
and page-aligned ones for O_DIRECT writes."""

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


def page_aligned(n: int) -> np.ndarray:
    """A new page-aligned byte buffer of n bytes: a memory-mapped one, whose address O_DIRECT
    writes can take (tracekit/store/io.py, Direct)."""
    import mmap

    return np.frombuffer(mmap.mmap(-1, max(n, mmap.PAGESIZE)), dtype=np.uint8)[:n]


class Buffers:
    """Reusable read buffers of one worker thread, by slot ("ref", "cand", "oracle")."""

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, slot: str, dtype: np.dtype, n: int) -> np.ndarray:
        nbytes = n * dtype.itemsize
        buf = self._bufs.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = self._bufs[slot] = np.empty(max(nbytes, 1), dtype=np.uint8)
        return buf[:nbytes].view(dtype)
