"""The rank's side of the hand-off: spool each step, so a writer process that outlives us stores it.

A step's tensors are written into a spool file (tracekit/writer/spool.py) on the training thread when
the step ends; once that returns, the step survives any death of this process. The writer process
(tracekit/writer/spool_writer.py) writes the spool into the store in the background.

Memory stays bounded by `max_bytes` (--queue-mb): at most that many bytes of sealed entries wait in
the spool (one entry larger than the cap is still admitted alone), plus the open step's capture.
When the disk is slower than training, the training thread waits in `put`/`seal` for the writer:
nothing is dropped.

While the rank trains, the writer leaves up to `hold_bytes` (--hold-mb) of sealed entries in the
spool and stores only what is beyond that; the rest it stores once the rank is done, when it no
longer takes cores from training (spool_writer.py says why). A rank that needs room the held entries take, or a
flush, says `drain`: the writer then stores every entry sealed so far. So does a rank whose spool's
filesystem is running short (SPOOL_ROOM_ENTRIES): the ranks of a machine share its /dev/shm, and
each one checked for room for its queue alone when it started.
"""

from __future__ import annotations

import json
import marshal
import mmap
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

import tracekit
from tracekit.errors import TracekitError
from tracekit.writer import spool_gc
from tracekit.writer.spool import TRACE_EVENTS, TRACE_EVENTS_MARSHAL, write_entry
from tracekit.writer.spool_names import (ATTRS, ENV_SPOOL, LOCK, PART, PROV, STEP, entry_name, note_ended, spool_room,
                                         spool_root)
from tracekit.store import TensorData
from tracekit.store.location import canonical, child_env


class WriterFailed(TracekitError):
    """The writer process hit an error; the store holds the steps completed before it."""


def _writer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TRACEKIT_BOOTSTRAP"] = "0"  # the writer never trains; keep zero-code out of it
    # One thread of BLAS/OpenMP: the writer's numpy reductions are small, and a BLAS's threads
    # spinning on the cores the training ranks use cost them CPU (measured: summarizing took 17x
    # the CPU seconds with OpenBLAS's default threads on a busy 2-core machine).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    env.update(child_env())  # storage options in force here (a URL store's endpoint, credentials)
    root = os.path.dirname(os.path.dirname(os.path.abspath(tracekit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [root])
    return env


# Finished slabs kept for reuse: at least one (the writer runs about a step behind), more while
# they hold at most this share of the queue cap: a writer that fell behind for a while left that many
# in flight, and reused pages cost about half as much to fill as fresh tmpfs pages.
KEEP_FREE_SLABS = 1
KEEP_FREE_SHARE = 4
# Held entries are stored at once when the spool's filesystem has room for fewer than this many more
# entries of the size just sealed: a full spool would end the rank's recording (ENOSPC), where
# storing them frees their room.
SPOOL_ROOM_ENTRIES = 4
SLAB_PREFIX = "slab-"  # a slab's own name in the spool: no entry name (spool.entry_seq), so the writer ignores it


class Slab:
    """A spool file that the rank fills in place, then hands over by linking it under an entry's
    name (Handoff.provisional_slab). Once the writer process has written the entry and unlinked
    that name, the file and its pages are reused for a later entry.

    A fresh slab (`fresh`: its pages not yet allocated) is filled with pwrite() (write_at): the
    kernel allocates tmpfs pages without zeroing them first, which a first write through a mapping
    would (measured: ~11 against ~19 ms for 20 MB). A reused one is filled through a shared mapping
    kept from use to use (`array`, writable uint8: no page faults, ~4.5 ms for 20 MB)."""

    def __init__(self, path: str, size: int):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.size = -1
        self.fresh = True
        self._map: mmap.mmap | None = None
        self._array: np.ndarray | None = None
        self.cache: dict = {}  # its user's things derived from the mapping (views), dropped with it
        self.resize(size)

    def resize(self, size: int) -> None:
        if size == self.size:
            return
        self._unmap()
        os.ftruncate(self.fd, size)
        self.size = size
        # filled with pwrite() again: pages the file gained are not allocated yet, and a write
        # through a mapping into a full tmpfs would be a SIGBUS where pwrite() raises ENOSPC
        self.fresh = True

    @property
    def array(self) -> np.ndarray:
        """The whole file, mapped shared and writable (mapped at the first use, then kept)."""
        if self._array is None:
            # A slab filled before (not fresh) has its pages: MAP_POPULATE maps them all in one call
            # instead of a page fault per 4 KiB at the first fill through the mapping (600 MB here:
            # 66 ms against ~160 ms of faults). A fresh one is not populated: that would allocate its pages.
            flags = mmap.MAP_SHARED | (0 if self.fresh else getattr(mmap, "MAP_POPULATE", 0))
            self._map = mmap.mmap(self.fd, self.size, flags=flags) if self.size else None
            self._array = np.frombuffer(self._map, dtype=np.uint8) if self.size else np.zeros(0, dtype=np.uint8)
        return self._array

    def write_at(self, offset: int, data) -> None:
        """Write bytes (a buffer) at `offset` with pwrite()."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def _unmap(self) -> None:
        self._array = None
        self.cache = {}
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view of it is still alive: the mapping goes with the last one
                pass
            self._map = None

    def discard(self) -> None:
        self._unmap()
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass


# Pages of a tmpfs file cost the rank about as much to allocate as to fill: pwrite() into a fresh
# 37 MB slab took 14.3-14.9 ms here, into the same file with its pages allocated 6.8-8.7 ms
# (posix_fallocate: 8.2-8.6 ms; docs/RELIABILITY.md, "... and a spare slab"). While the writer
# holds the rank's steps (--hold-mb), no slab comes back to be reused and every step fills a fresh
# one; so once a step had to make a fresh slab, a thread of the rank's at nice 19 (SpareMaker)
# allocates the next one's pages (SpareSlab) while the rank trains (the training threads come
# first). A spare exists only while it fits in the queue cap beside what is spooled, and the
# spool's filesystem refusing one (full, or no fallocate) ends spares for the rank.
SPARE_NICE = 19


class SpareMaker:
    """The rank's one thread that makes spare slabs, at SPARE_NICE, started with the first spare.

    A thread per spare cost the training thread a wait at each one: Thread.start() returns only once
    the new thread runs, which with both cores training came to ~1.5 ms a step per rank (py-spy,
    TorchTitan's debug model, 2 ranks on 2 cores; docs/RELIABILITY.md, "Memory the host backs at
    first touch"). A request to this thread is a queue put, which waits for nothing.

    stop() (from the close word, which a signal handler may send while the training thread is in
    submit()) ends the thread only after every spare submitted: one queued behind the end would
    never be made, and whoever discards it would wait for it forever."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe from a signal handler
        self._thread: threading.Thread | None = None
        self._submitting = False
        self._stop_asked = False

    def submit(self, spare: "SpareSlab") -> None:
        self._submitting = True
        try:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tracekit-spare-slab", daemon=True)
                self._thread.start()
            self._jobs.put(spare)
        finally:
            self._submitting = False
            if self._stop_asked:  # a handler asked while we were here: end behind this spare
                self._end()

    def stop(self) -> None:
        """End the thread once the spares submitted are made."""
        self._stop_asked = True
        if not self._submitting:
            self._end()

    def _end(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SPARE_NICE)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass
        while (spare := self._jobs.get()) is not None:
            spare.make()


class SpareSlab:
    """A Slab whose pages the rank's SpareMaker thread allocates (posix_fallocate), for the next fresh slab."""

    def __init__(self, path: str, size: int, maker: "SpareMaker"):
        self.path, self.size = path, size
        self.slab: Slab | None = None
        self.failed = False
        self._done = threading.Event()
        maker.submit(self)

    def make(self) -> None:
        """Allocate the slab's pages (on the maker's thread)."""
        slab = None
        try:
            slab = Slab(self.path, self.size)
            os.posix_fallocate(slab.fd, 0, self.size)
            self.slab = slab
        except Exception:  # ENOSPC, a file system without fallocate; anything else ends spares too
            if slab is not None:
                slab.discard()
            self.failed = True
        finally:
            self._done.set()

    def ready(self, wait: bool = False) -> bool:
        if wait:
            self._done.wait()
        return self._done.is_set()

    def take(self, size: int) -> Slab | None:
        """A ready spare's slab cut to `size`; None (and the spare removed) when it failed or is smaller."""
        slab, self.slab = self.slab, None
        if slab is not None and slab.size < size:
            slab.discard()
            return None
        if slab is not None:
            slab.resize(size)  # fresh either way: filled with pwrite(), into pages already allocated
        return slab

    def discard(self) -> None:
        self._done.wait()  # a file the maker made after this would be left behind
        if self.slab is not None:
            self.slab.discard()
            self.slab = None


class Handoff:
    """One rank's spool and its writer process."""

    def __init__(self, store: str, rank: int, attrs: dict, max_bytes: int, nice: int = 0, hold_bytes: int = 0):
        self.max_bytes = max_bytes
        self.hold_bytes = hold_bytes
        if not os.environ.get(ENV_SPOOL):  # no launcher (it sets ENV_SPOOL and clears what dead recordings left)
            spool_gc.collect()
        # The writer's lock is taken with the folder and inherited, so neither `tracekit record` nor a
        # cleaner (spool_gc) ever sees an unlocked spool whose writer has yet to start.
        self.spool, lock = spool_gc.new_folder(spool_gc.rank_prefix(rank), spool_root(2 * max_bytes), LOCK)
        self._seq = 0
        self._pending: dict[int, int] = {}  # sealed entries not yet written: seq -> bytes
        self._prov: tuple[int, int] | None = None  # the open step's capture: (seq, bytes)
        self._error: str | None = None
        self._drain_asked = False  # `drain` sent, and no entry written since
        self._eof = False
        self._close_sent = False
        self._ended_at = 0.0  # when the rank's training ended (send_close), monotonic
        self._buf = b""
        self.peak_pending = 0  # most bytes of sealed entries waiting at once
        self.peak_spooled = 0  # most bytes in the spool at once, the open step's capture included
        self._slab_of: dict[int, Slab] = {}  # entries handed over as slabs: seq -> slab, until written
        self._free_slabs: list[Slab] = []  # slabs whose entries the writer has written and unlinked
        self._slabs_made = 0
        self._spare: SpareSlab | None = None  # the next fresh slab, its pages being allocated
        self._spares = True  # off once the spool's filesystem refused one
        self._spare_maker = SpareMaker()
        self._pid = os.getpid()  # a forked child leaves the spare to its parent
        try:
            with open(os.path.join(self.spool, ATTRS), "w") as f:
                json.dump(attrs, f)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tracekit.writer.spool_writer", "--spool", self.spool,
                 "--store", canonical(store), "--rank", str(rank), "--rank-pid", str(os.getpid()),
                 "--lock-fd", str(lock), "--nice", str(nice), "--hold-bytes", str(hold_bytes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_writer_env(), start_new_session=True,
                pass_fds=(lock,))
        except OSError as e:
            shutil.rmtree(self.spool, ignore_errors=True)
            raise WriterFailed(f"cannot start the writer process: {e}") from None
        else:
            # The writer's pid, in its lock file from its start (the writer writes it too, once it
            # runs): `tracekit record` stops or kills a writer at --flush-timeout by this pid, and
            # one stopped or stuck before writing it was left running, holding its spool. At offset
            # 0 without moving the shared file offset the writer writes at.
            try:
                os.pwrite(lock, str(self._proc.pid).encode(), 0)
            except OSError:
                pass  # the writer writes it when it starts
        finally:
            os.close(lock)  # the writer's copy holds the lock from here on
        self._in, self._out = self._proc.stdin, self._proc.stdout.fileno()
        # set when the writer says it is ready; never waited for before the end (close): the rank
        # trains on meanwhile, its hand-offs spooled (a zero-code rank starts its writer in its
        # first step, whose first hand-off used to wait out the writer's start-up: ~0.3 s of imports,
        # 7% of TorchTitan's 10 bench steps). A writer that failed or died at start is heard of at
        # the next hand-off after it did.
        self._ready = False

    def _wait_ready(self, until: float | None = None, timeout: float | None = None) -> None:
        if self._ready:
            return
        if not self._read_until(lambda line: line == "ready", until) and not self._eof:
            raise WriterFailed(self._gave_up(timeout))  # `until` passed: a stopped or hung writer
        if self._error is not None or self._eof:
            self._proc.wait()
            shutil.rmtree(self.spool, ignore_errors=True)
            raise WriterFailed(self._error or "the writer process exited at start")
        self._ready = True

    # ---- the writer's messages ---------------------------------------------------------------
    def _handle(self, line: str) -> None:
        cmd, _, rest = line.partition(" ")
        if cmd == "ready":
            self._ready = True
        elif cmd == "done":
            seq = int(rest)
            self._pending.pop(seq, None)
            self._drain_asked = False
            # the writer unlinks an entry before it says done and never reads it again: its slab is free
            self._free_slab(self._slab_of.pop(seq, None))
        elif cmd == "error" and self._error is None:
            self._error = rest

    def _read(self, block: bool, until: float | None = None) -> list[str]:
        """The writer's lines read now; with block, wait for one (until the monotonic time `until`, if given)."""
        if self._eof:
            return []
        if not block:
            wait = 0.0
        elif until is not None:
            wait = max(0.0, until - time.monotonic())
        else:
            wait = None  # no bound: os.read blocks below
        if wait is not None and not select.select([self._out], [], [], wait)[0]:
            return []
        data = os.read(self._out, 1 << 16)
        if not data:
            self._eof = True
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        lines = [x.decode() for x in lines]
        for line in lines:
            self._handle(line)
        return lines

    def _read_until(self, done, until: float | None = None) -> bool:
        """Read until a line satisfies done(): True; False at EOF or at the monotonic time `until`."""
        while not self._eof:
            if any(done(line) for line in self._read(block=True, until=until)):
                return True
            if until is not None and time.monotonic() >= until:
                return False
        return False

    def _poll(self) -> None:
        while self._read(block=False):
            pass
        if not self._ready and (self._eof or self._error is not None):
            self._wait_ready()  # it failed or died before it was ready: says so as it always has
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterFailed(f"recording failed in the writer process: {self._error}")
        if self._eof and not self._close_sent:
            raise WriterFailed("the writer process died")

    # ---- hand-offs -------------------------------------------------------------------------------
    def _path(self, seq: int, suffix: str) -> str:
        return os.path.join(self.spool, entry_name(seq, suffix))

    def _make_room(self, nbytes: int, budget: int | None = None) -> None:
        """Wait until the sealed entries waiting and `nbytes` more fit in `budget` (the queue cap); one
        entry larger than that is admitted alone."""
        self._poll()
        budget = self.max_bytes if budget is None else budget
        while self._pending and sum(self._pending.values()) + nbytes > budget:
            self._drain()  # the writer may be holding them back (hold_bytes): they are needed now
            self._read(block=True)
            self._raise_if_failed()

    def _write(self, seq: int, suffix: str, step: int, complete: bool, tensors: list[tuple[str, TensorData]],
               extra: dict | None = None) -> int:
        part = self._path(seq, PART)
        try:
            size = write_entry(part, step, complete, tensors, extra)
            os.rename(part, self._path(seq, suffix))  # the marker, written last
        except OSError as e:
            if self._proc.poll() is not None:
                self._read_until(lambda line: False)  # its last words name the cause
            self._raise_if_failed()
            raise WriterFailed(f"cannot spool step {step}: {e}") from None
        return size

    def _notify(self, word: bytes = b"sealed\n") -> None:
        try:
            self._send(word)
        except (BrokenPipeError, ValueError):
            self._poll()
            raise WriterFailed("the writer process died") from None

    def _drain(self) -> None:
        """Ask the writer to store every entry sealed so far, held ones included (once per wait)."""
        if not self._drain_asked:
            self._notify(b"drain\n")
            self._drain_asked = True

    def _send(self, data: bytes) -> None:
        # os.write, not the buffered file: a signal handler that sends the close command while the
        # training thread is sending must not meet a half-used buffer (a short line is atomic)
        fd = self._in.fileno()
        while data:
            data = data[os.write(fd, data):]

    def _sealed(self, seq: int, size: int) -> None:
        self._pending[seq] = size
        self.peak_pending = max(self.peak_pending, sum(self._pending.values()))
        self._note_spooled()
        self._notify()
        if self.hold_bytes and spool_room(self.spool) < SPOOL_ROOM_ENTRIES * size:
            self._drain()

    def put(self, step: int, tensors: list[tuple[str, TensorData]], complete: bool, extra: dict | None = None) -> None:
        """Hand over a finished entry; durable when this returns."""
        self._make_room(sum(t.data.nbytes for _, t in tensors))
        self._seq += 1
        self._sealed(self._seq, self._write(self._seq, STEP, step, complete, tensors, extra))

    def put_trace(self, step: int, level: str, events: list[dict], full: list[TensorData]) -> None:
        """Hand over a traced step's events and its --trace-full tensors. The events travel as one
        marshal blob (an entry of kind TRACE_EVENTS): ~12x cheaper than JSON on the training thread
        (2.8 against 34 ms for the 10M bench model's 1,800 events); the writer process turns them
        into the store's JSON. marshal, not pickle: loading it runs no code, and the blob is this
        process's own (a private spool folder), read by the writer it started with the same
        interpreter (marshal's format is per Python version)."""
        blob = np.frombuffer(marshal.dumps(events), dtype=np.uint8)
        tensors = [("trace", t) for t in full] + [(TRACE_EVENTS, TensorData("events", "uint8", blob.shape, blob))]
        self.put(step, tensors, complete=False, extra={"trace": {"level": level, "events": TRACE_EVENTS_MARSHAL}})

    def provisional(self, step: int, tensors: list[tuple[str, TensorData]]) -> None:
        """Hand over the open step's capture; a later call replaces it until seal(). Durable on return:
        if this process dies before seal(), the writer stores it as the step."""
        if self._prov is None:
            self._make_room(sum(t.data.nbytes for _, t in tensors))
            self._seq += 1
            seq = self._seq
        else:
            self._poll()
            seq = self._prov[0]
        self._prov = (seq, self._write(seq, PROV, step, True, tensors))
        self._free_slab(self._slab_of.pop(seq, None))  # a capture it replaced, if one was a slab
        self._note_spooled()

    # ---- slabs: entries filled in place ---------------------------------------------------------
    def slab(self, size: int, budget: int | None = None) -> Slab:
        """A mapped spool file of `size` bytes to fill with an entry (spool.entry_head's layout), then
        hand over with provisional_slab() or give back with release(). A finished one is reused when
        there is one: its old bytes are still there, to be overwritten. It is taken once the sealed
        entries waiting leave room for it in `budget` (default: the queue cap), not only at the
        hand-off: the slabs in flight, each in the rank's RSS once reused, then never hold more."""
        if self._pending:  # (none before the writer is ready: nothing is sealed until then)
            self._make_room(size, budget)
        elif self._ready:
            while self._read(block=False):  # hear of entries written since, to reuse their slabs
                pass
        if self._free_slabs:
            if self._spare is not None and self._spare.ready():  # slabs come back now: a spare only holds memory
                self._drop_spare()
            free = self._free_slabs
            i = next((k for k, sl in enumerate(free) if sl.size == size), len(free) - 1)
            slab = free.pop(i)
            slab.fresh = False  # its pages are there: overwritten through the mapping (unless resized)
            slab.resize(size)
            return slab
        slab, spare = None, self._spare
        if spare is not None and spare.ready():  # one still in the making is left for the next slab
            self._spare = None
            slab = spare.take(size)
            self._spares = not spare.failed
        if slab is None:
            self._slabs_made += 1
            slab = Slab(os.path.join(self.spool, f"{SLAB_PREFIX}{self._slabs_made}"), size)
        self._prepare_spare(size, budget)
        return slab

    def _prepare_spare(self, size: int, budget: int | None) -> None:
        """Start allocating the next fresh slab (see SpareSlab), unless one is on its way, the queue
        cap has no room for it beside what is spooled, this slab, and kept slabs, or spares are off."""
        if not self._spares or self._spare is not None or self._close_sent or os.getpid() != self._pid:
            return
        spooled = self._spooled_bytes() + sum(sl.size for sl in self._free_slabs)
        if spooled + 2 * size > (self.max_bytes if budget is None else budget):
            return
        self._slabs_made += 1
        self._spare = SpareSlab(os.path.join(self.spool, f"{SLAB_PREFIX}{self._slabs_made}"), size, self._spare_maker)

    def release(self, slab: Slab) -> None:
        """Give back a slab that was not handed over."""
        self._free_slab(slab)

    def _free_slab(self, slab: Slab | None) -> None:
        if slab is None:
            return
        kept = sum(sl.size for sl in self._free_slabs)
        if len(self._free_slabs) < KEEP_FREE_SLABS or kept + slab.size <= self.max_bytes // KEEP_FREE_SHARE:
            self._free_slabs.append(slab)
        else:
            slab.discard()

    def provisional_slab(self, step: int, slab: Slab) -> None:
        """provisional() for an entry filled in place in `slab`: the slab gets the entry's name by a
        link, then a rename, once every byte is in it (durable on return, as provisional())."""
        if self._prov is None:
            self._make_room(slab.size)
            self._seq += 1
            seq = self._seq
        else:
            self._poll()
            seq = self._prov[0]
        part = self._path(seq, PART)
        try:
            os.link(slab.path, part)
            os.rename(part, self._path(seq, PROV))  # the marker, as in _write
        except OSError as e:
            if self._proc.poll() is not None:
                self._read_until(lambda line: False)
            self._raise_if_failed()
            raise WriterFailed(f"cannot spool step {step}: {e}") from None
        self._free_slab(self._slab_of.pop(seq, None))  # the capture it replaced, never read by the writer
        self._slab_of[seq] = slab
        self._prov = (seq, slab.size)
        self._note_spooled()

    def _spooled_bytes(self) -> int:
        """Bytes of entries in the spool: the sealed ones waiting and the open step's capture."""
        return sum(self._pending.values()) + (self._prov[1] if self._prov else 0)

    def _note_spooled(self) -> None:
        self.peak_spooled = max(self.peak_spooled, self._spooled_bytes())

    def seal(self) -> None:
        """The open step is over: its last capture is final."""
        if self._prov is None:
            return
        (seq, size), self._prov = self._prov, None
        os.rename(self._path(seq, PROV), self._path(seq, STEP))
        self._sealed(seq, size)

    def flush(self) -> None:
        """Block until the writer is up and every sealed entry is in the store."""
        self._wait_ready()
        self._poll()
        if self._pending:
            self._drain()
        while self._pending and not self._eof:
            self._read(block=True)
            self._raise_if_failed()
        self._raise_if_failed()

    def send_close(self, status: str, attrs: dict | None = None) -> None:
        """Tell the writer how the rank ends; it writes what is spooled, then the status. Idempotent."""
        if self._close_sent:
            return
        self._ended_at = time.monotonic()
        # before the writer hears of the end: it removes the spool folder once done, and a spare
        # still being made could land in it meanwhile and keep the folder from going
        self._drop_spare()
        if os.getpid() == self._pid:  # (a forked child has no maker thread of its own)
            self._spare_maker.stop()
        note_ended(self.spool, status, (attrs or {}).get("cause"))  # for the launcher, should the writer not answer
        # Marked sent only once written: a signal handler that runs before the write (its abandon()
        # calls here too) sends its own word instead of finding it done; one that runs after finds
        # it done. Handlers run between bytecodes, and a line shorter than the pipe's buffer is
        # written whole by one os.write, so a handler never splits a line.
        try:
            self._send(f"close {status} {json.dumps(attrs or {})}\n".encode())
        except (BrokenPipeError, ValueError):
            pass
        self._close_sent = True

    def close(self, status: str, attrs: dict | None = None, wait: bool = True, timeout: float | None = None) -> None:
        """End the hand-off. wait=False (a signal is killing us): the writer finishes on its own.
        timeout: wait at most this many seconds for the writer to store everything (--flush-timeout,
        counted from here, the end of the rank's training); past it, leave the writer to finish on
        its own or be stopped by `tracekit record` (a stopped or hung writer must not hang the rank)."""
        self.send_close(status, attrs)
        until = None if timeout is None else self._ended_at + timeout
        if not wait:
            return
        self._wait_ready(until, timeout)
        if not self._read_until(lambda line: line == "closed", until) and not self._eof:
            raise WriterFailed(self._gave_up(timeout))
        try:
            self._in.close()
        except OSError:
            pass
        self._proc.wait()
        self._drop_slabs()
        if self._error is not None:
            raise WriterFailed(f"recording failed in the writer process: {self._error}")
        if self._proc.returncode != 0:
            raise WriterFailed(f"the writer process exited with status {self._proc.returncode}")

    def _gave_up(self, timeout: float) -> str:
        return (f"the writer process (pid {self._proc.pid}) did not store this rank's spooled steps within "
                f"--flush-timeout {timeout:g} s of the end of training; the rank ends without waiting for it "
                "(tracekit record stops it and lists the steps it did not store)")

    def _drop_slabs(self) -> None:
        """Unmap every slab (the writer process removed the spool folder, and their files with it)."""
        for slab in [*self._free_slabs, *self._slab_of.values()]:
            slab.discard()
        self._free_slabs.clear()
        self._slab_of.clear()
        self._drop_spare()

    def _drop_spare(self) -> None:
        """Remove the spare slab (waiting for the maker to finish it: a file it makes later would outlive us)."""
        spare, self._spare = self._spare, None
        if spare is not None and os.getpid() == self._pid:
            spare.discard()

    def forget_in_child(self) -> None:
        """In a forked child: let go of the pipes, so the writer still sees the rank's death. The fds are
        pointed at /dev/null rather than closed, so no later close can hit a reused fd number."""
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for f in (self._in, self._proc.stdout):
                try:
                    os.dup2(null, f.fileno())
                except (OSError, ValueError):
                    pass
        finally:
            os.close(null)
        self._close_sent = True  # never speak for the parent
