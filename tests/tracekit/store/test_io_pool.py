"""io.concurrently: one thread pool per process, kept from call to call (a writer process calls it
for each kind of each batch of steps), and a new one in a forked child, whose parent's threads
are not there."""

import os
import select
import signal
import threading

import pytest

from tracekit.store import io


@pytest.fixture
def on_disk(monkeypatch):
    monkeypatch.setattr(io, "fs_type", lambda folder: "ext4")  # never the serial path of a memory fs


def _threads_used(tmp_path, calls: int) -> set[str]:
    """The names of the threads that ran the items of `calls` calls."""
    seen: set[str] = set()
    for _ in range(calls):
        io.concurrently(lambda item: seen.add(threading.current_thread().name), list(range(40)), str(tmp_path))
    return seen


def test_calls_share_one_pool_of_bounded_threads(tmp_path, on_disk):
    seen = _threads_used(tmp_path, 10)
    assert threading.current_thread().name not in seen  # the items ran in the pool
    # one pool for all ten calls (a pool per call names its threads anew: up to 160 names here),
    # whose threads outlive the calls, waiting for the next
    assert len(seen) <= io.POOL_WORKERS
    assert seen <= {t.name for t in threading.enumerate()}


def test_items_run_once_each_and_the_first_error_is_raised(tmp_path, on_disk):
    done = []

    def fn(item):
        if item == 7:
            raise OSError(28, "No space left on device")
        done.append(item)

    with pytest.raises(OSError, match="No space left"):
        io.concurrently(fn, list(range(20)), str(tmp_path))
    assert sorted(done) == [i for i in range(20) if i != 7]  # the others all ran


def test_a_forked_child_gets_a_pool_of_its_own(tmp_path, on_disk):
    _threads_used(tmp_path, 1)  # the parent's pool exists, its threads started
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads are not here; work queued to them would never run
        try:
            ran = []
            io.concurrently(ran.append, list(range(40)), str(tmp_path))
            os.write(write_fd, b"ok" if sorted(ran) == list(range(40)) else b"wrong")
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 60)
        if not ready:
            os.kill(pid, signal.SIGKILL)  # a child stuck on its parent's pool: end it, then fail
        assert ready, "the forked child's concurrently() did not finish within 60 s (queued to its parent's threads)"
        assert os.read(read_fd, 16) == b"ok"
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
