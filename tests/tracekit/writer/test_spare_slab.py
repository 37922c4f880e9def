"""The next fresh slab's pages are allocated ahead by a thread of the rank's (tracekit/writer/
handoff.py, SpareSlab): while the writer holds the steps, no slab comes back to be reused, and
pwrite() into pages already there costs the rank about half of what a fresh file costs."""

import errno
import os

from tracekit.store import create_store
from tracekit.writer import handoff as handoff_module
from tracekit.writer.handoff import SLAB_PREFIX, Handoff

MB = 1 << 20
ATTRS = {"coords": {"rank": 0}}


def _handoff(tmp_path, max_bytes: int = 8 * MB) -> Handoff:
    store = str(tmp_path / "s")
    create_store(store, {})
    return Handoff(store, 0, ATTRS, max_bytes, hold_bytes=max_bytes)


def _slab_files(handoff: Handoff) -> list[str]:
    return sorted(f for f in os.listdir(handoff.spool) if f.startswith(SLAB_PREFIX))


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def test_a_fresh_slab_starts_the_next_ones_pages_and_the_next_fresh_slab_takes_them(tmp_path):
    handoff = _handoff(tmp_path)
    try:
        first = handoff.slab(MB)
        assert first.fresh and _allocated(first.path) == 0  # made as before: its pages come with its pwrite()s
        handoff._spare.ready(wait=True)
        spare_files = [f for f in _slab_files(handoff) if os.path.join(handoff.spool, f) != first.path]
        assert len(spare_files) == 1
        second = handoff.slab(MB)  # no slab came back: the spare is taken, its pages already there
        assert second.path == os.path.join(handoff.spool, spare_files[0])
        assert second.fresh and second.size == MB and _allocated(second.path) >= MB
        payload = bytes(range(256)) * (MB // 256)
        second.write_at(0, payload)
        with open(second.path, "rb") as f:
            assert f.read() == payload
        handoff._spare.ready(wait=True)  # and the one after it is on its way
        assert len(_slab_files(handoff)) == 3
    finally:
        handoff.close("finished")


def test_no_spare_is_made_without_room_for_it_in_the_queue_cap(tmp_path):
    handoff = _handoff(tmp_path, max_bytes=int(1.5 * MB))  # one slab fits, not two
    try:
        handoff.slab(MB)
        assert handoff._spare is None
        assert len(_slab_files(handoff)) == 1
    finally:
        handoff.close("finished")


def test_a_spool_that_refuses_the_pages_ends_spares_and_slabs_go_on(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(handoff_module.os, "posix_fallocate", full)
    handoff = _handoff(tmp_path)
    try:
        first = handoff.slab(MB)
        handoff._spare.ready(wait=True)
        assert _slab_files(handoff) == [os.path.basename(first.path)]  # the refused spare left no file
        second = handoff.slab(MB)  # made as before
        assert second.fresh and second.path != first.path
        assert handoff._spare is None  # and no more are tried
        assert len(_slab_files(handoff)) == 2
    finally:
        handoff.close("finished")


def test_the_spare_is_removed_before_the_writer_hears_of_the_end(tmp_path):
    """A zero-code rank does not wait for its writer: it sends its close word and goes. The spare
    goes first, so the writer's removal of the spool folder never races a spare landing in it."""
    handoff = _handoff(tmp_path)
    handoff.slab(MB)
    spare = handoff._spare
    handoff.send_close("finished")
    assert handoff._spare is None and spare.ready() and spare.slab is None
    assert len(_slab_files(handoff)) <= 1  # the slab in use, never the spare
    handoff.close("finished")
    assert not os.path.exists(handoff.spool)


def test_a_spare_goes_once_slabs_come_back_for_reuse(tmp_path):
    """Once the writer stores as the rank trains (past the hold, or no hold), slabs come back and are
    reused: a spare made before would only hold memory."""
    handoff = _handoff(tmp_path)
    try:
        first = handoff.slab(MB)
        handoff._spare.ready(wait=True)
        spare_path = handoff._spare.slab.path
        handoff.release(first)  # back for reuse, as a stored entry's slab comes back
        again = handoff.slab(MB)
        assert again is first and not again.fresh  # reused through its mapping
        assert handoff._spare is None and not os.path.exists(spare_path)
    finally:
        handoff.close("finished")


def test_one_thread_makes_every_spare_and_ends_with_the_rank(tmp_path, monkeypatch):
    """Thread.start() waits until the new thread runs: a thread per spare cost the training thread
    that wait at every step. One maker thread, started with the first spare, makes them all."""
    started = []

    class CountedThread(handoff_module.threading.Thread):
        def start(self):
            started.append(self)
            super().start()

    monkeypatch.setattr(handoff_module.threading, "Thread", CountedThread)
    handoff = _handoff(tmp_path, max_bytes=16 * MB)
    handoff.slab(MB)
    for _ in range(4):  # each fresh slab takes the spare and asks for the next one
        handoff._spare.ready(wait=True)
        assert handoff._spare.slab is not None
        handoff.slab(MB)
    assert len(started) == 1 and started[0].is_alive()
    handoff.send_close("finished")
    started[0].join(timeout=60)
    assert not started[0].is_alive()  # told to end with the rank's close word
    handoff.close("finished")


def test_a_close_word_sent_while_a_spare_is_asked_for_still_gets_that_spare_made(tmp_path):
    """A signal handler sends the close word (SpareMaker.stop) wherever it lands, even inside
    submit(), before the spare is queued. The maker must end behind that spare: queued after the
    end, it would never be made, and discarding it would wait forever."""
    maker = handoff_module.SpareMaker()
    jobs, fired = maker._jobs, []

    class HandlerLandsBeforeThePut:
        def put(self, item):
            if item is not None and not fired:
                fired.append(True)
                maker.stop()
            jobs.put(item)

        def get(self):
            return jobs.get()

    maker._jobs = HandlerLandsBeforeThePut()
    spare = handoff_module.SpareSlab(str(tmp_path / "spare"), MB, maker)
    assert spare._done.wait(timeout=10), "the spare was never made"
    assert spare.slab is not None and not spare.failed
    spare.discard()
    assert not os.path.exists(str(tmp_path / "spare"))
    assert maker._thread is None  # and the maker was told to end, behind it
