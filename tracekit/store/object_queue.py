"""A local store's object writes, from a thread of the process's, behind the kind writers.

A kind writer hashes and summarizes a row's tensors, and writes their objects (a large tensor's
own, or a pack of small ones). Written in line, each object's disk time adds to the CPU's. Here
the writes go to one thread, in order, while the writer goes on hashing: at most DEPTH of them
in flight. With a core to spare, a writer stored 10 held entries of 60 MB in 0.67 s this way,
against 0.94 s in line, at the same CPU (bench/bench_object_queue.py; docs/RELIABILITY.md,
"Object writes behind the writer").

The rules that keep a store whole:
- settle() before an index row is written: an index row never names an object that is not
  stored yet.
- A row is stored only when every write up to its `ticket` succeeded. A failed write is kept
  (`failed_at`, `error`), and every later put() raises it: the writer stops there, as it did
  when the write failed in line.
- A pack's bytes lie in a buffer of the queue (buffer()), never handed out again while a write
  in flight reads it. The caller keeps every other part's bytes readable until settle(); the
  writer process keeps its spool entries mapped until then.
"""

from __future__ import annotations

import collections
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tracekit.store.io import process_pool
from tracekit.store.scratch import page_aligned

# Writes in flight at most. Each pack in flight holds a buffer of up to packs.MAX (16 MB), so a
# writer keeps DEPTH + 1 of them. Storing held entries, 2 were about as fast as 4, and 1 gained little.
DEPTH = 2
_QUEUES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _executor() -> ThreadPoolExecutor:
    """The process's one write thread (one: the writes of a queue go in order)."""
    return process_pool("tracekit-objects", 1)


def queue_for(byte_store) -> "ObjectQueue":
    """The queue of a local ByteStore instance. A RankWriter's kind writers share its instance, so
    their writes share one queue: tickets then order all of the rank's writes."""
    queue = _QUEUES.get(byte_store)
    if queue is None:
        queue = _QUEUES[byte_store] = ObjectQueue(byte_store)
    return queue


class ObjectQueue:
    def __init__(self, byte_store):
        self.store = byte_store  # its write_objects(items, direct) does each write
        self.puts = 0  # writes handed over so far: a write's number is this count just after its put
        # the writes in flight, oldest first: (future, whom to tell its count, the buffer it reads or None)
        self._pending: collections.deque = collections.deque()
        self._handed: int | None = None  # the buffer that buffer() gave last
        self._buffers: list[np.ndarray | None] = [None] * (DEPTH + 1)
        self.failed_at: int | None = None  # the number of the first write that failed
        self.error: BaseException | None = None

    @property
    def ticket(self) -> int:
        """What a row prepared now depends on: every write handed over so far."""
        return self.puts

    def buffer(self, n: int) -> np.ndarray:
        """A page-aligned buffer of n bytes (O_DIRECT takes its address), to fill and put() with
        in_buffer: never one that a write in flight reads."""
        busy = {b for _, _, b in self._pending}
        i = self._handed = next(i for i in range(len(self._buffers)) if i not in busy)
        buf = self._buffers[i]
        if buf is None or len(buf) < n:  # (then kept: fresh pages cost a fault each)
            buf = self._buffers[i] = page_aligned(n)
        return buf[:n]

    def put(self, key: str, parts: list, direct=None, in_buffer: bool = False, count=None) -> None:
        """Write object `key` from `parts` (with the store's io.Direct), after the writes before it.
        `in_buffer`: the parts lie in the last buffer(). `count(new)`: called on this thread, at
        a later put() or settle(), with 1 for a new object and 0 for one already stored.
        Raises the error of a write that failed before."""
        while len(self._pending) >= DEPTH:
            self._wait()
        if self.error is not None:
            raise self.error
        self.puts += 1
        future = _executor().submit(self._write, self.puts, key, parts, direct)
        self._pending.append((future, count, self._handed if in_buffer else None))

    def _write(self, number: int, key: str, parts: list, direct) -> int:
        try:
            return self.store.write_objects([(key, parts)], direct)
        except BaseException as e:
            if self.failed_at is None:
                self.failed_at, self.error = number, e
            raise

    def _wait(self) -> None:
        """Wait for the oldest write in flight."""
        future, count, _ = self._pending.popleft()
        try:
            new = future.result()
        except BaseException:
            return  # kept in failed_at and error
        if count is not None:
            count(new)

    def settle(self) -> int | None:
        """Wait for every write in flight; the number of the first write that failed, or None."""
        while self._pending:
            self._wait()
        return self.failed_at

    def stored(self, ticket: int) -> bool:
        """Whether every write up to `ticket` is stored (asked after settle())."""
        return self.failed_at is None or ticket < self.failed_at
