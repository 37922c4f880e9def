"""What `tracekit record` says while the user waits after training: short lines on stderr.

After the last step, the ranks' writer processes may still be storing spooled steps, the
training command may still be tearing down (destroying process groups, torchrun collecting its
workers), and the store must be finalized. Each of these can take seconds; a line says which
one is under way, so a silent terminal never looks like a hang.
"""

from __future__ import annotations

import fcntl
import os
import sys

from tracekit.writer.spool_gc import LAUNCHER_LOCK
from tracekit.writer.spool_names import LOCK, PROV, STEP, entry_seq

PREFIX = "tracekit record: "


def say(message: str) -> None:
    print(PREFIX + message, file=sys.stderr, flush=True)


def _writer_busy(folder: str) -> bool:
    """True while the rank's writer process holds its lock (it holds it for its whole life)."""
    try:
        f = open(os.path.join(folder, LOCK))
    except OSError:
        return False  # finished: it removes its folder
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True


def pending(spools: str) -> dict[str, int]:
    """The rank spool folders whose writer is still at work -> the entries still waiting there
    (one per handed-off step or traced step, the open step's capture included)."""
    try:
        folders = sorted(os.path.join(spools, d) for d in os.listdir(spools))
    except OSError:
        return {}
    busy = {}
    for folder in folders:
        if not _writer_busy(folder):
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        busy[folder] = sum(1 for n in names if entry_seq(n) is not None and n.endswith((STEP, PROV)))
    return busy


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def command_ended(spools: str, status: int, seconds_left: float) -> None:
    """Said when the command has ended and writers are still storing (nothing when none is)."""
    busy = pending(spools)
    if busy:
        entries = _plural(sum(busy.values()), "spooled entry", "spooled entries")
        say(f"the command ended (exit status {status}); storing {entries} of {_plural(len(busy), 'rank')} "
            f"(at most {seconds_left:.0f} s more: --flush-timeout) ...")


def finalizing(store: str) -> None:
    say(f"finalizing {store} ...")


class StoredWhileRunning:
    """Called while the command runs: says once that every rank writer has finished (so the rest
    of the wait is the command's own teardown), after at least one had started."""

    def __init__(self, spools: str):
        self.spools = spools
        self.started = False
        self.said = False

    def __call__(self) -> None:
        if self.said:
            return
        try:
            # a rank's folder lives as long as its writer; beside them, the launcher's own lock file
            left = len(set(os.listdir(self.spools)) - {LAUNCHER_LOCK})
        except OSError:
            return
        if left:
            self.started = True
        elif self.started:
            self.said = True
            say("every rank's writer has stored its steps; waiting for the command to exit ...")
