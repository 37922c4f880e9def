"""The writer process: writes one rank's spooled steps to the store, and outlives the rank.

Started by the rank's Recorder (subprocess, never fork; in a session of its own, so signals sent
to the job's process group or terminal do not reach it). It owns the rank's group in the store
(the store writer API: RankWriter). It writes sealed entries in order (a run of plain steps in one
batch: RankWriter.write_steps); when the rank closes, or dies in any way (exception, signal,
SIGKILL, os._exit, the OOM killer), it writes what is left, the open step's capture included, and
exits; the status is the one the rank closed with, or, if it never closed, `running` until the
launcher's finalization says killed or died. At most the step
the rank was capturing when it died (its .part file) is lost.

While the rank trains, it leaves up to --hold-bytes of sealed entries in the spool; once more wait,
it stores the oldest of them in one batch, down to half the hold (_past_hold), and stores the rest
once the rank is done: storing competes with training for
the cores even at nice 19 (a waking rank waits for the writer's slice; on TorchTitan's debug model
with 2 ranks on 2 cores, the steps took 1.2-1.4x), while the job's teardown leaves a third to a
half of them idle (docs/RELIABILITY.md, "The writer holds steps while the rank trains").

Talks to the rank over two pipes. Rank -> writer (our stdin): "sealed" after each hand-off,
"drain" when the rank needs the room held entries take (or flushes): store every entry sealed so
far, "close STATUS ATTRS-JSON" at the end. Writer -> rank (our stdout): "ready", "done SEQ" per entry
written, "error MESSAGE", "closed". The rank's death shows as EOF on stdin or, sooner, as its
pidfd turning readable.

SIGTERM sent to this process itself (the launcher's --flush-timeout ran out) stops it after the
entry in hand: the steps not written are listed in the rank's `unwritten_steps` attribute.
Never imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys

from tracekit.writer import priority


def _nice_arg(argv: list[str]) -> int | None:
    """The value of --nice in the command line, read before main()'s parser (which checks it and the
    rest later); None if absent or not a number."""
    early = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    early.add_argument("--nice", type=int, default=None)
    try:
        return early.parse_known_args(argv)[0].nice
    except argparse.ArgumentError:
        return None


# Started as a program (python -m, by the rank's Handoff), the writer takes its low priority, its
# scheduling group's included, before it imports anything more: numpy, zarr and the store's modules
# below cost ~0.35 s of CPU, which it spent at the rank's own priority (then at a whole rank's share
# of the cores) while the ranks trained their first step (TorchTitan's debug model:
# docs/RELIABILITY.md, "Cost on TorchTitan"). Imported as a module, nothing changes here.
_EARLY_NICE = _nice_arg(sys.argv[1:]) if __name__ == "__main__" else None
_NICE_BEFORE = priority.lower(_EARLY_NICE) if _EARLY_NICE is not None else None
if _EARLY_NICE is not None:
    priority.lower_group(_EARLY_NICE)

import signal  # noqa: E402

# SIGTERM (the launcher's --flush-timeout) is caught from here on, not only once the writer is up: at
# nice 19 on cores the ranks keep busy, the start-up below can take seconds, and a SIGTERM then used to
# kill the writer outright, before it made its rank's group, leaving no trace of the rank's steps in the
# store. Caught, it stops the writer as soon as it is up, at its old priority (the rank is done: nobody
# is left to yield to), and the store lists every spooled step as unwritten. It is the writer's one
# SIGTERM handler: once the writer is up, a SIGTERM stops it after the entry in hand (_Writer.stopped).
_STOP_REQUESTED: list[bool] = []


def _request_stop(signum, frame) -> None:
    if not _STOP_REQUESTED:
        _STOP_REQUESTED.append(True)
        priority.restore(_NICE_BEFORE)
        if __name__ == "__main__":
            # Later SIGTERMs change nothing, and one that lands while the interpreter finalizes (it
            # puts back the default action) killed the stopping writer: exit -15 where it exits 0
            # (seen once, in test_a_writer_told_to_stop_while_it_waits_on_a_live_rank_stops[2] under load).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _request_stop)

import fcntl  # noqa: E402  (after the priority, on purpose)
import json  # noqa: E402
import marshal  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

from tracekit.errors import TracekitError  # noqa: E402
from tracekit.writer.spool import TRACE_EVENTS, TRACE_EVENTS_MARSHAL, entries, read_entry, spooled_steps  # noqa: E402
from tracekit.writer.spool_names import ATTRS, LOCK  # noqa: E402
from tracekit.store import RankWriter  # noqa: E402
from tracekit.store.ownership import ENV_RUN_ID  # noqa: E402
from tracekit.store.status import RECORDING_FAILED  # noqa: E402
from tracekit.store.traces import TraceWriter  # noqa: E402

ENV_WRITE_MBPS = "TRACEKIT_WRITE_MBPS"  # cap the write rate (a shared filesystem; slow-disk tests)
STOPPED_CAUSE = "its writer process was stopped at --flush-timeout"
# Plain steps stored together at most: their metadata documents are written once for all of them,
# and their spool entries stay mapped until then (at the end of training, the held steps).
BATCH_ENTRIES = 16


class _Writer:
    def __init__(self, spool: str, store: str, rank: int, rank_pid: int, nice_before: int | None = None,
                 hold_bytes: int = 0):
        self.spool = spool
        self.hold_bytes = hold_bytes
        self.drain = False  # the rank asked for every entry sealed so far (its word `drain`)
        self.nice_before = nice_before  # the priority to go back to once the rank is done (priority.py)
        self.rank_pid = rank_pid
        self.out = sys.stdout
        self.closing: tuple[str, dict] | None = None
        self.rank_gone = False
        # readable once a signal came (signal.set_wakeup_fd), so that a SIGTERM while we wait for a
        # rank that lives on ends the wait: select() resumes after a handler that does not raise,
        # and a signal just before select() would not interrupt it at all
        self.wake_fd: int | None = None
        self.buf = b""
        mbps = float(os.environ.get(ENV_WRITE_MBPS, "0") or 0)
        self.bytes_per_s = mbps * 1e6 if mbps > 0 else None
        with open(os.path.join(spool, ATTRS)) as f:
            attrs = json.load(f)
        # writes only while the store's root names the job this rank was started in
        # --full travels in the rank's attributes (explicit Recorder and zero-code alike): this
        # process hashes and summarizes every tensor that came with its bytes (the rank digests some
        # of the others itself: recorders/direct.py), and keeps the bytes of those it names
        full = (attrs.get("config") or {}).get("full") or ()
        self.writer = RankWriter(store, rank, attrs, run_id=os.environ.get(ENV_RUN_ID) or None, full=full)
        self.traces: TraceWriter | None = None  # created at the first traced step
        try:
            self.pidfd = os.pidfd_open(rank_pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: stdin's EOF is the death signal
            self.pidfd = None

    @property
    def stopped(self) -> bool:
        """SIGTERM came (_request_stop), at any time since the writer program started."""
        return bool(_STOP_REQUESTED)

    def say(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):  # the rank is gone; the store is what counts
            pass

    # ---- the rank's messages ---------------------------------------------------------------
    @property
    def _rank_done(self) -> bool:
        """The rank has closed or died: nobody is left to yield the cores to."""
        return self.closing is not None or self.rank_gone

    def _wait_for_rank(self, block: bool = True) -> bool:
        """Wait until the rank says something, or dies, or a SIGTERM comes (without block: only
        look). True if the rank spoke."""
        fds = [0] + [fd for fd in (self.pidfd, self.wake_fd) if fd is not None]
        try:
            ready, _, _ = select.select(fds, [], [], None if block else 0)
        except InterruptedError:
            return False
        if self.wake_fd is not None and self.wake_fd in ready:
            _drain(self.wake_fd)  # a signal: the caller looks at self.stopped
            if len(ready) == 1:
                return False
        if not ready:
            return False
        if self.pidfd is not None and self.pidfd in ready:
            self.rank_gone = True
        if 0 in ready:
            data = os.read(0, 1 << 16)
            if not data:
                self.rank_gone = True
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                cmd, _, rest = line.decode().partition(" ")
                if cmd == "close":
                    status, _, attrs = rest.partition(" ")
                    self.closing = (status, json.loads(attrs) if attrs else {})
                elif cmd == "drain":
                    self.drain = True
        return not self.rank_gone and 0 in ready

    # ---- the spool -----------------------------------------------------------------------------
    def _entries(self, final: bool) -> list[tuple[int, str]]:
        """The entries to store now, oldest first: all of them once the rank is done or asked for them
        (drain); while it trains, only the oldest once more than the hold waits (_past_hold)."""
        found = entries(self.spool, final)
        if final or self.drain or not self.hold_bytes:
            self.drain = False
            return found
        return found[:_past_hold(self.spool, found, self.hold_bytes)]

    def _store_next(self, listed: list[tuple[int, str]]) -> int:
        """Store the first entries of `listed` (in order) and say how many: a run of plain steps at once
        (up to BATCH_ENTRIES: the held ones, at the end; RankWriter.write_steps writes each kind's
        metadata once for all of them), or one entry of attributes or of a trace alone."""
        batch_max = 1 if self.bytes_per_s else BATCH_ENTRIES  # a capped rate paces entry by entry
        batch: list = []  # (seq, name, entry)
        try:
            for seq, name in listed[:batch_max]:
                entry = read_entry(os.path.join(self.spool, name))
                if entry.extra.get("attrs") or entry.extra.get("trace") is not None:
                    if batch:  # after the plain steps before it
                        entry.close()
                        break
                    batch.append((seq, name, entry))
                    break
                batch.append((seq, name, entry))
        except BaseException:
            for _, _, entry in batch:
                entry.close()
            raise
        self._store(batch)
        return len(batch)

    def _store(self, batch: list) -> None:
        """Store the entries of `batch` (closing them), unlink their names, say `done` for each."""
        t0 = time.monotonic()
        size = 0
        try:
            for _, name, _ in batch:
                size += os.path.getsize(os.path.join(self.spool, name))
            entry = batch[0][2]
            trace = entry.extra.get("trace")
            if not entry.extra.get("attrs") and trace is None:  # plain steps
                self.writer.write_steps([(e.step, e.kinds, e.complete) for _, _, e in batch])
            else:  # an entry of attributes or of a trace: a batch of its own
                if entry.extra.get("attrs"):  # rank metadata learnt while training (the precision context)
                    self.writer.update_attrs(**entry.extra["attrs"])
                else:
                    if self.traces is None:
                        self.traces = TraceWriter(self.writer.zarr_group())
                    events = trace["events"]
                    if events == TRACE_EVENTS_MARSHAL:  # decoded here, off the training thread (Handoff.put_trace)
                        events = marshal.loads(entry.kinds[TRACE_EVENTS][0].data.tobytes())
                    self.traces.write_step(trace["level"], entry.step, events, entry.kinds.get("trace", []))
                if entry.complete:
                    self.writer.complete_step(entry.step)
        finally:
            for _, _, e in batch:
                e.close()
        for _, name, _ in batch:
            os.unlink(os.path.join(self.spool, name))
        if self.bytes_per_s:  # a capped rate: wait out the rest of this entry's time (a SIGTERM cuts it short)
            until = t0 + size / self.bytes_per_s
            while not self.stopped and time.monotonic() < until:
                time.sleep(max(0.0, min(0.05, until - time.monotonic())))  # the clock moved on since the test
        for seq, _, _ in batch:
            self.say(f"done {seq}")

    def run(self) -> int:
        self.say("ready")
        while True:
            final = self._rank_done
            if final:  # nobody left to yield the cores to
                priority.restore(self.nice_before)
            heard = False
            listed = self._entries(final)
            while listed and not self.stopped:
                listed = listed[self._store_next(listed):]
                if not self._rank_done:  # a rank that closed or died mid-batch: drain the rest at full priority
                    heard |= self._wait_for_rank(block=False)
                    if self._rank_done:
                        priority.restore(self.nice_before)
            if self.stopped or final:
                break
            if not heard and not self._rank_done:
                self._wait_for_rank()  # else a word heard above may announce an entry listed after the batch
        return self._finish(final)

    def _finish(self, final: bool) -> int:
        while self.closing is None and self._wait_for_rank(block=False):
            pass  # stopped mid-drain: the rank's last words may still be unread
        if self.stopped:
            priority.restore(self.nice_before)  # the launcher waits for this within a grace; the rank is done
            self.writer.update_attrs(unwritten_steps=spooled_steps(self.spool), unwritten_cause=STOPPED_CAUSE)
        if self.closing is not None:
            status, attrs = self.closing
            cause = attrs.pop("cause", None)
            if attrs:
                self.writer.update_attrs(**attrs)
            self.writer.close(status=status, cause=cause)
        # else the rank died without closing: its status stays `running`, and the launcher's
        # finalization says how it ended (killed or died, tracekit/store/status.py)
        self.say("closed")
        return 0


# Past the hold, the oldest entries are stored until the others hold at most this share of it.
# Storing a step at a time past the hold rewrote each kind's metadata documents for every step (~14
# new files and as many freed, a rank-step of TorchTitan's debug model), where a batch writes them
# once for all of its steps (RankWriter.write_steps); a hold of 512 MB and ~37 MB steps make batches
# of ~7. On an ext4 without a journal each freed inode slows every file created near it for a
# minute (docs/RELIABILITY.md, "Store format 5 on TorchTitan"), and a file on an object store is a request.
LOW_WATER = 0.5


def _past_hold(spool: str, found: list[tuple[int, str]], hold_bytes: int) -> int:
    """How many of the oldest entries in `found` to store now: none while they hold at most
    `hold_bytes`; once they hold more, enough of the oldest that the others hold at most
    LOW_WATER of it."""
    sizes = []
    for _, name in found:
        try:
            sizes.append(os.stat(os.path.join(spool, name)).st_size)
        except OSError:  # gone meanwhile: it holds nothing
            sizes.append(0)
    held, n = sum(sizes), 0
    if held <= hold_bytes:
        return 0
    while n < len(sizes) and held > hold_bytes * LOW_WATER:
        held -= sizes[n]
        n += 1
    return n


def _wakeup_fd() -> int:
    """The read end of a pipe that Python's C-level signal handler writes a byte to, at once, for
    every signal with a Python handler."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    return r


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tracekit-spool-writer")
    p.add_argument("--spool", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--rank-pid", type=int, required=True)
    p.add_argument("--lock-fd", type=int, default=None, help="the spool's lock, already held (inherited)")
    p.add_argument("--nice", type=int, default=0, help="run at this nice value while the rank trains (priority.py)")
    p.add_argument("--hold-bytes", type=int, default=0,
                   help="while the rank trains, leave up to this many bytes of sealed entries for its end")
    args = p.parse_args(argv)
    if _EARLY_NICE == args.nice:  # lowered at import, before any thread started
        nice_before = _NICE_BEFORE
    else:
        nice_before = priority.lower(args.nice)  # before any thread starts: they inherit it
        priority.lower_group(args.nice)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the job's signals are the rank's business, not ours
    signal.signal(signal.SIGTERM, _request_stop)  # (again: imported as a module, main() is the start)
    if args.lock_fd is not None:
        lock = os.fdopen(args.lock_fd, "w")
    else:
        lock = open(os.path.join(args.spool, LOCK), "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write(str(os.getpid()))
    lock.flush()
    writer = None
    try:
        writer = _Writer(args.spool, args.store, args.rank, args.rank_pid, nice_before, args.hold_bytes)
        # a SIGTERM that came while the writer started stops it before it stores anything; one that
        # comes later wakes it from its wait for the rank through this pipe
        writer.wake_fd = _wakeup_fd()
        return writer.run()
    except Exception as e:  # one line to the rank; the store keeps the steps written so far
        message = str(e) if isinstance(e, TracekitError) else f"{type(e).__name__}: {e}"
        # the status first: a rank that hears of the failure may read the store at once
        if writer is not None:
            try:
                writer.writer.close(status="failed", cause=RECORDING_FAILED + message)
            except Exception:
                pass
        try:
            print("error " + " ".join(message.split()), flush=True)
        except OSError:  # the rank is gone: the store's status says it
            pass
        return 1
    finally:
        # The entries are written, or can never be. With none left, the lock goes first: the launcher
        # waits on it to finalize, and freeing the rank's spool files (its slabs: ~370 MB a rank on
        # the TorchTitan bench, 50-80 ms here) need not delay that. With some left, they go first:
        # the launcher lists what a free lock leaves in the spool as this rank's unwritten steps.
        if not spooled_steps(args.spool):
            lock.close()
        shutil.rmtree(args.spool, ignore_errors=True)
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
