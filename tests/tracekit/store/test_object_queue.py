"""The object queue (tracekit/store/object_queue.py): a local store's object writes from a thread,
behind the kind writers, without ever reading a buffer being refilled or storing a row past a
failed write."""

import errno
import threading

import numpy as np
import pytest

from tracekit.store.object_queue import DEPTH, ObjectQueue


class GatedStore:
    """A byte store whose writes wait until the test opens their gate; records what each wrote."""

    def __init__(self, fail: str | None = None):
        self.gates: dict[str, threading.Event] = {}
        self.wrote: dict[str, bytes] = {}
        self.fail = fail

    def gate(self, key: str) -> threading.Event:
        return self.gates.setdefault(key, threading.Event())

    def write_objects(self, items, direct=None) -> int:
        (key, parts), = items
        assert self.gate(key).wait(timeout=60)
        if key == self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.wrote[key] = b"".join(bytes(p) for p in parts)
        return 1


def _fill(queue: ObjectQueue, value: int, n: int = 4096) -> np.ndarray:
    buf = queue.buffer(n)
    buf[:] = value
    return buf


def test_a_buffer_is_never_handed_out_while_a_write_reads_it():
    store = GatedStore()
    queue = ObjectQueue(store)
    assert DEPTH == 2  # what this test fills: two writes held in flight, a third buffer asked for
    a = _fill(queue, 1)
    queue.put("a", [memoryview(a)], in_buffer=True)
    b = _fill(queue, 2)
    queue.put("b", [memoryview(b)], in_buffer=True)
    c = _fill(queue, 3)  # both writes before it still wait at their gates
    assert not np.shares_memory(c, a) and not np.shares_memory(c, b) and not np.shares_memory(a, b)
    for key in "abc":
        store.gate(key).set()
    queue.put("c", [memoryview(c)], in_buffer=True)
    assert queue.settle() is None
    assert store.wrote == {"a": b"\1" * 4096, "b": b"\2" * 4096, "c": b"\3" * 4096}
    assert np.shares_memory(_fill(queue, 4), a)  # once written, a buffer is used again


def test_counts_come_back_and_settle_waits_for_every_write():
    store = GatedStore()
    queue = ObjectQueue(store)
    counted = []
    for key in "ab":
        store.gate(key).set()
        queue.put(key, [b"x"], count=counted.append)
    assert queue.settle() is None
    assert counted == [1, 1] and set(store.wrote) == {"a", "b"}
    assert queue.stored(queue.ticket)


def test_a_failed_write_is_kept_stops_later_puts_and_marks_the_rows_after_it():
    store = GatedStore(fail="b")
    queue = ObjectQueue(store)
    for key in "abc":
        store.gate(key).set()
    queue.put("a", [b"1"])
    after_a = queue.ticket
    queue.put("b", [b"2"])
    after_b = queue.ticket
    assert queue.settle() == 2  # the second write failed
    assert isinstance(queue.error, OSError) and queue.error.errno == errno.ENOSPC
    assert queue.stored(after_a) and not queue.stored(after_b)
    with pytest.raises(OSError, match="No space left"):
        queue.put("c", [b"3"])
    assert "c" not in store.wrote
