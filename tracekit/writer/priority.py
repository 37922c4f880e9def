"""The writer process's CPU priority: below the training ranks', while they train.

On a machine whose cores the ranks keep busy (CPU training; a host feeding its accelerators),
every CPU second the writer takes at the ranks' priority is a second a rank waits for. At a nice
value of 19 the kernel gives the writer the cores' idle moments first (a rank waiting on a
collective or its device) and little else, and the queue cap (RecordConfig.queue_mb) bounds what
can pile up meanwhile: a full queue makes the rank wait, and the writer then has the cores.
Measured side by side with bench/bench_record.py --variants pieces,beside (10M parameters, FSDP2,
2 ranks on 2 cores, every step recorded, 20 steps), two runs: step time at nice 19 was 0.99x and
0.95x of that at nice 0 (1.27x vs 1.28x, and 1.20x vs 1.27x, of unrecorded steps); a small gain,
within this VM's run-to-run noise.

Once the rank closes or dies, nothing is left to yield to: `restore` puts the writer back at the
priority it started with, so the last steps are written before `tracekit record`'s
--flush-timeout. Lowering a nice value takes a privilege (CAP_SYS_NICE or RLIMIT_NICE) that a
plain user may not have: then the writer finishes at its low priority, which only matters while
other processes keep the cores busy.
"""

from __future__ import annotations

import os

MAX_NICE = 19


def lower(nice: int) -> int | None:
    """Raise this process's nice value to `nice` (never lower it: a job already niced stays as it
    is). Call it before starting threads, which inherit it. Returns the value it had, for restore()."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        if nice > before:
            os.setpriority(os.PRIO_PROCESS, 0, min(nice, MAX_NICE))
        return before
    except (AttributeError, OSError):  # no such call here, or refused: the writer runs as it is
        return None


def restore(before: int | None) -> None:
    """Best effort: every thread of this process back to the nice value `before` (Linux gives each
    thread its own, so each is set)."""
    if before is None:
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, before)
        except OSError:  # not privileged to lower it (or the thread ended): stays low
            pass
