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

A nice value only ranks the writer against the processes of its own scheduling group. Linux's
autogroups (kernel.sched_autogroup_enabled, on on the machine measured) give each
session a group of its own, with an equal share of the cores between groups; torchrun starts
each rank in a new session, and the rank starts its writer in one (handoff.py). So at nice 19 a
writer still had a whole rank's share. A writer that leads its own session (the group is then
its own) sets its group's nice value too (/proc/self/autogroup, lower_group), at its start, with
its own. Measured on TorchTitan's bench (docs/RELIABILITY.md, "The recorded steps' time
attributed"), the group lowered at the writer's start: the ranks' main threads waited for a core
~28-30 ms a step instead of ~45-53, and the recorded steps were 1.17-1.23x instead of 1.26-1.35x;
lowered only once the rank's group was made, 1.24x against 1.26-1.29x; at its start again, six runs
each later on, 1.23-1.33x against 1.25-1.42x, the whole command unchanged. The target (1.1x) is not met.

Once the rank closes or dies, nothing is left to yield to: `restore` puts the writer back at the
priority it started with, so the last steps are written before `tracekit record`'s
--flush-timeout. Lowering a nice value takes a privilege (CAP_SYS_NICE or RLIMIT_NICE) that a
plain user may not have: then the writer finishes at its low priority, which only matters while
other processes keep the cores busy.
"""

from __future__ import annotations

import os

MAX_NICE = 19
AUTOGROUP = "/proc/self/autogroup"  # "/autogroup-N nice V": this session's scheduling group (Linux)

_group_before: int | None = None  # the autogroup's nice value before lower_group() raised it


def autogroup_nice(path: str = AUTOGROUP) -> int | None:
    """The nice value of this process's autogroup; None without autogroups (or off)."""
    try:
        with open(path) as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup_nice(value: int, path: str = AUTOGROUP) -> bool:
    try:
        with open(path, "w") as f:
            f.write(str(value))
        return True
    except OSError:  # no autogroups, or refused: below 0 takes a privilege, and without CAP_SYS_ADMIN
        return False  # the kernel takes one group change per 100 ms machine-wide (EAGAIN)


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


def lower_group(nice: int) -> None:
    """Raise this process's autogroup's nice value to `nice` when it leads its own session (the
    group is then its own: a process started with start_new_session); restore() puts it back.
    The writer calls it at its start, with lower(): its start-up (imports, its rank's group in the
    store) then takes the cores' idle moments too, and can take seconds while the ranks keep them busy."""
    global _group_before
    try:
        group = autogroup_nice() if os.getsid(0) == os.getpid() else None
    except (AttributeError, OSError):
        group = None
    if group is not None and nice > group and _set_autogroup_nice(min(nice, MAX_NICE)):
        _group_before = group if _group_before is None else _group_before


def restore(before: int | None) -> None:
    """Best effort: every thread of this process back to the nice value `before` (Linux gives each
    thread its own, so each is set), and the autogroup's back to where lower() found it."""
    global _group_before
    if _group_before is not None and _set_autogroup_nice(_group_before):
        _group_before = None
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
