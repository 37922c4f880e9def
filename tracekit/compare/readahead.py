"""Read-ahead for the diff: the disk is kept reading the objects of the comparisons about to run.

A diff of stores that are not in the page cache is bound by the disk. The workers read an object
only when they start comparing it, and at the end of each step they wait for its last comparison:
the disk would idle in between. Here every comparison is registered, in the order it will run
(the next step's as soon as the current one is submitted), with its byte count and a hint (a
function asking the kernel to read its files in the background, io.prefetch); as each one
starts, the hints of those after it are given until BUDGET bytes are hinted ahead of the
running ones. Hints only: nothing waits on them, and the bytes are read and hash-checked as
ever; the budget bounds how much page cache the look-ahead claims.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

# Bytes hinted ahead of the running comparisons: several comparisons' worth, far below any
# machine's page cache.
BUDGET = 256 << 20


class Readahead:
    def __init__(self, budget: int = BUDGET):
        self.budget = budget
        self._waiting: OrderedDict[Hashable, tuple[int, Callable[[], None]]] = OrderedDict()  # not hinted
        self._hinted: dict[Hashable, int] = {}  # hinted, not started: their bytes
        self._ahead = 0
        self._lock = threading.Lock()

    def add(self, token: Hashable, nbytes: int, hint: Callable[[], None]) -> None:
        """A comparison that will run (after those added before it); `hint` starts its reads."""
        with self._lock:
            if token not in self._waiting and token not in self._hinted:
                self._waiting[token] = (int(nbytes), hint)

    def started(self, token: Hashable) -> None:
        """The comparison `token` starts now (its own reads need no hint any more): hint the next
        ones up to the budget."""
        due = []
        with self._lock:
            self._waiting.pop(token, None)
            self._ahead -= self._hinted.pop(token, 0)
            while self._waiting and self._ahead < self.budget:
                t, (n, hint) = self._waiting.popitem(last=False)
                self._hinted[t] = n
                self._ahead += n
                due.append(hint)
        for hint in due:  # outside the lock: a hint may take a moment to queue its reads
            try:
                hint()
            except Exception:  # a hint never fails a diff: the read itself reports any problem
                pass

    def run(self, token: Hashable, fn: Callable, *args):
        """fn(*args) as the comparison `token` (for a thread pool)."""
        self.started(token)
        return fn(*args)
