"""`tracekit record`'s engine: create the store, point the workers at it, run, finalize.

Like ddtrace-run: settings travel in environment variables and the command is run as a child whose
exit status becomes ours. Signals sent to the launcher are forwarded to the child. Each recording
rank hands its steps to a writer process that outlives it (tracekit/writer/handoff.py); their spools live
in one folder we create, and the store is finalized only once every writer has finished.

--flush-timeout bounds how long that takes after a forwarded signal (or after the command ends):
when it runs out, the command is SIGKILLed, and writers still writing are stopped after the step
in hand; the steps they did not write are listed in their rank's `unwritten_steps`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

from tracekit.environment import run_environment
from tracekit.errors import UsageError
from tracekit.store.local_root import create_local_store
from tracekit.store.ownership import ENV_RUN_ID, JobClaim, ObjectClaim, new_run_id
from tracekit.store.target import check_target
from tracekit.store.location import canonical, child_env, resolve
from tracekit.launch.bootstrap_env import bootstrap_env
from tracekit.launch.config import DEFAULT_FLUSH_TIMEOUT, RecordConfig, format_step_range, parse_seconds
from tracekit.writer.spool_names import ATTRS, ENV_SPOOL, LOCK, read_ended, spool_root
from tracekit.launch.exits import StderrTail, worker_exits
from tracekit.launch.parent_death import die_with_parent
from tracekit.launch.replay_check import check_reference
from tracekit.launch import prefetch, progress
from tracekit.writer import spool_gc

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # start the flush clock


def _claim(store: str, force: bool) -> JobClaim:
    """Exclusive ownership of `store` for this job (refused while another job holds it, --force or not)."""
    check_target(store, force=True)  # a foreign folder is refused before we put a lock file in it
    try:
        os.makedirs(store, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {store}: cannot create it ({e.strerror or e})") from None
    claim = JobClaim.acquire(store, new_run_id())  # a live job is named first, --force or not
    try:
        check_target(store, force)
    except BaseException:
        claim.release()
        raise
    return claim


def worker_env(config: RecordConfig, base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    return env


def record_job(command: Sequence[str], config: RecordConfig, force: bool = False, zero_code: bool = True,
               strict: bool = False, optimizer: str | None = None, model: str | None = None,
               loss_reduction: str | None = None, flush_timeout: float = DEFAULT_FLUSH_TIMEOUT) -> int:
    """`tracekit record`'s entry point: run `command` recorded into config.store, with the zero-code
    bootstrap on its PYTHONPATH unless `zero_code` is off; returns the command's exit status."""
    env = bootstrap_env(strict=strict, optimizer=optimizer, model=model, loss_reduction=loss_reduction) if zero_code else None
    return launch(command, config, force=force, env_updates=env, extra_meta={"zero_code": zero_code},
                  flush_timeout=flush_timeout)


def launch(command: Sequence[str], config: RecordConfig, force: bool = False, extra_meta: dict | None = None,
           env_updates: dict | None = None, flush_timeout: float = DEFAULT_FLUSH_TIMEOUT) -> int:
    """Run `command` recorded into config.store; returns the command's exit status."""
    if not command:
        raise UsageError("no command to record; put it after --, e.g. tracekit record -o runs/ref -- torchrun ... train.py")
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]}")
    flush_timeout = parse_seconds(flush_timeout)
    config = dataclasses.replace(config, flush_timeout=flush_timeout)  # the ranks bound their exit wait by it too
    store = canonical(config.store)
    meta = {"launcher": "tracekit record", **run_environment(list(command)),
            "record_config": {"kinds": list(config.kinds), "params": list(config.params),
                              "ranks": config.ranks.spec() if config.ranks is not None else None,
                              "every": config.every,
                              **({"full": list(config.full)} if config.full else {}),
                              **({"trace": config.trace, "trace_steps": format_step_range(config.trace_steps) if config.trace_steps else "first",
                                  "trace_full": list(config.trace_full)} if config.trace else {})},
            **(extra_meta or {})}
    if config.replay_from:
        meta.update(check_reference(config.replay_from, store, config.replay_steps), replay_steps=format_step_range(config.replay_steps))
    location = resolve(store)
    # Object stores have no file locks: there a conditional create of a claim object stands in
    claim = _claim(store, force) if location.is_local else ObjectClaim.acquire(location)
    try:
        if location.is_local:  # no zarr (nor numpy) imported before the command starts: store/local_root.py
            create_local_store(store, {**meta, "run_id": claim.run_id}, force=force)
        else:
            from tracekit.store import create_store

            create_store(store, {**meta, "run_id": claim.run_id}, force=force)
        return _launch(command, config, store, claim, env_updates, flush_timeout)
    finally:
        claim.release()


def _launch(command, config: RecordConfig, store: str, claim: JobClaim, env_updates, flush_timeout: float) -> int:
    # what recordings killed before their cleanup left (SIGKILLed launchers and writer processes)
    spool_gc.collect(spool_gc.roots() + ([os.environ[ENV_SPOOL]] if os.environ.get(ENV_SPOOL) else []))
    # locked for our life: the mark of a live launcher that spool_gc.collect() goes by
    spools, spools_lock = spool_gc.new_folder(spool_gc.LAUNCHER_PREFIX, spool_root(config.queue_mb * 1024 * 1024),
                                              spool_gc.LAUNCHER_LOCK)
    env = worker_env(config.with_store(store))
    env[ENV_SPOOL] = spools
    env[ENV_RUN_ID] = claim.run_id
    env.update(child_env())  # --storage-option reaches the ranks this way, never through the store
    env.update(env_updates or {})
    read_fd, write_fd = os.pipe()  # the workers' exit codes are in torchrun's report on stderr
    try:
        try:
            # The command (a torchrun agent, or a world of one's rank) gets SIGTERM if we die, even by
            # SIGKILL: an agent then stops its workers, instead of training on with no launcher
            proc = subprocess.Popen(list(command), env=env, stderr=write_fd, preexec_fn=die_with_parent)
        except OSError as e:  # on PATH and executable, yet not runnable (bad format, permissions)
            os.close(read_fd)
            os.close(write_fd)
            from tracekit.store.finalize import finalize_store

            finalize_store(store, 127)
            raise UsageError(f"cannot run {command[0]}: {e.strerror or e}") from None
        os.close(write_fd)
        tail = StderrTail(read_fd)
        deadline: list[float] = []  # set by the first ending signal
        ended_by: list[int] = []  # that signal

        def forward(signum, frame):
            if signum in ENDING_SIGNALS and not deadline:
                deadline.append(time.monotonic() + flush_timeout)
                ended_by.append(signum)
            if proc.poll() is None:
                proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
        prefetch.start()  # what finalizing imports, while the command runs
        try:
            rc = _wait(proc, deadline, progress.StoredWhileRunning(spools))
            if not deadline:
                deadline.append(time.monotonic() + flush_timeout)
            progress.command_ended(spools, rc if rc >= 0 else 128 - rc, max(0.0, deadline[0] - time.monotonic()))
            losses = wait_for_writers(spools, deadline[0], flush_timeout)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        status = rc if rc >= 0 else 128 - rc  # killed by signal N: report 128+N, as shells do
        # zarr: never imported before the command starts (prefetch.py imported it meanwhile)
        from tracekit.store.finalize import finalize_store, mark_writers_outlived

        # before the wait below, which holds the writers lock alone: making a group takes a share of it
        group_lost_ranks(spools, losses, store, claim.run_id)
        # Any process still holding the store's writers lock (an orphan of a killed agent, a writer
        # outside our spools) would change metadata that finalizing consolidates: wait for it too.
        if not claim.wait_for_writers(max(0.0, deadline[0] - time.monotonic())):
            mark_writers_outlived(store, status)
            print(f"tracekit: ranks still write to {store} at --flush-timeout; left it unfinalized "
                  "(readers report it as 'launcher died')", file=sys.stderr, flush=True)
            return status
        progress.finalizing(store)
        try:
            summary = finalize_store(store, status, worker_exits(tail.text()) if rc != 0 else {}, losses)
            for line in unlisted_losses(losses, summary["ranks"], store):
                print(line, file=sys.stderr, flush=True)
        except OSError as e:  # a full or failing disk: the ranks' completed steps stay readable
            print(f"tracekit: cannot finalize {store}: {e.strerror or e}; the steps the ranks wrote stay "
                  "readable (readers report the store as 'launcher died')", file=sys.stderr, flush=True)
            return status or 1
        # A signal that reached us after the command's last step still ends us as signals do (128+N),
        # so a caller that sent it sees it took effect; the store keeps the truth (the ranks finished).
        return 128 + ended_by[0] if ended_by and status == 0 else status
    finally:
        shutil.rmtree(spools, ignore_errors=True)
        os.close(spools_lock)


def _wait(proc: subprocess.Popen, deadline: list[float], on_poll=lambda: None) -> int:
    """The command's exit status; past the flush deadline, SIGKILL it first. on_poll() runs at each
    poll (every 0.2 s) while the command runs. The exit is seen as it happens, through a pidfd:
    Popen.wait(timeout) looks every 50 ms at most, 25 ms late on average after a long command."""
    pidfd = _pidfd(proc.pid)
    try:
        while True:
            on_poll()
            # a short timeout, so a deadline set by a signal handler meanwhile is seen
            timeout = 0.2 if not deadline else max(0.0, min(0.2, deadline[0] - time.monotonic()))
            if pidfd is not None:
                select.select([pidfd], [], [], timeout)  # readable once the command has exited
                if proc.poll() is not None:
                    return proc.returncode
            else:
                try:
                    return proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            if deadline and time.monotonic() >= deadline[0]:
                print("tracekit: the command did not end within --flush-timeout after the signal; killing it",
                      file=sys.stderr, flush=True)
                proc.kill()
                return proc.wait()
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: Popen.wait's polling
        return None


# A writer stopped at --flush-timeout finishes the step in hand, then exits; one that has not within
# its grace (the flush timeout, at least MIN_GRACE_S and at most STOP_GRACE_S: stopped, stuck on a hung
# filesystem, a bug) is killed, and one that outlives SIGKILL by KILL_WAIT_S (asleep in the kernel) is
# left behind: `tracekit record` never waits without end.
STOP_GRACE_S = 30.0
MIN_GRACE_S = 5.0
KILL_WAIT_S = 5.0
# How often a writer's lock is tried while the launcher waits for it: the job's end waits on this
# (a 50 ms poll was 25 ms late on average there); a try is one flock call.
LOCK_POLL_S = 0.005
KILLED_CAUSE = "its writer process did not stop within {grace:g} s of --flush-timeout and was killed"
LEFT_CAUSE = "its writer process outlived SIGKILL at --flush-timeout (stuck in the kernel?)"
# A writer that ends in any way of its own removes its spool folder (spool_writer.main's `finally`; one
# that stored everything frees its lock first, so its folder may still be there, without entries); one
# whose folder is still there with entries in it ended without that: killed, or crashed in its start-up
ENDED_CAUSE = "its writer process ended without storing them (killed, or crashed as it started)"


def wait_for_writers(spools: str, deadline: float, flush_timeout: float | None = None) -> dict[int, dict]:
    """Wait until every rank's writer process has finished (each holds a lock for its life); stop
    the ones still writing at their deadline (SIGTERM: they finish the step in hand, list the rest),
    and kill those that do not stop. A writer's deadline is `deadline`, or sooner, flush_timeout
    after its rank's training ended (the rank's note in its spool), whether or not the writer answers.

    Returns, per rank whose writer had to be killed or ended leaving entries in its spool (killed
    by someone else, or crashed as it started), what finalize_store records for it: the steps
    left in its spool (`unwritten_steps`), why (`unwritten_cause`), and the rank's own word on how
    it ended (`status`, `cause`), which such a writer never stored."""
    from tracekit.writer.spool import spooled_steps  # numpy: not before the command starts (prefetch.py)

    folders = _spool_folders(spools)
    grace = min(STOP_GRACE_S, max(MIN_GRACE_S, flush_timeout if flush_timeout is not None else STOP_GRACE_S))
    losses: dict[int, dict] = {}
    for folder in folders:
        cause = _stop_writer(folder, _deadline_of(folder, deadline, flush_timeout), grace)
        if cause is None and not spooled_steps(folder):
            continue  # it stored what was spooled and removed its folder (or nothing was spooled)
        loss = _loss(folder, cause or ENDED_CAUSE)
        if loss is not None:
            losses[loss[0]] = loss[1]
    return losses


def _stop_writer(folder: str, deadline: float, grace: float) -> str | None:
    """Wait for the writer of `folder` until `deadline`, then stop it (SIGTERM), then kill it after
    `grace`. None once it ended of itself or when stopped; else why it was not waited for to the end."""
    lock = os.path.join(folder, LOCK)
    if _wait_lock(lock, deadline):
        return None
    pid = _writer_pid(lock)
    print("tracekit: a writer process is still writing at --flush-timeout; stopping it "
          "(its unwritten steps are listed in the store)", file=sys.stderr, flush=True)
    if pid is None or not _signal(pid, signal.SIGTERM) or _wait_lock(lock, time.monotonic() + grace):
        return None
    print(f"tracekit: writer process {pid} did not stop within {grace:g} s; killing it (the steps it had "
          "not stored are listed in the store as unwritten)", file=sys.stderr, flush=True)
    if _signal(pid, signal.SIGKILL) and not _wait_lock(lock, time.monotonic() + KILL_WAIT_S):
        print(f"tracekit: writer process {pid} outlived SIGKILL (stuck in the kernel?); going on without it",
              file=sys.stderr, flush=True)
        return LEFT_CAUSE
    return KILLED_CAUSE.format(grace=grace)


def group_lost_ranks(spools: str, losses: dict[int, dict], store: str, run_id: str | None) -> list[int]:
    """Make the rank group of each rank in `losses` whose writer ended before it made one, from the
    attributes the rank left in its spool folder, so that finalize lists the rank and its unwritten
    steps in the store. Returns the ranks given a group; one the store does not take is left to
    unlisted_losses' line on stderr."""
    from tracekit.store.lost_ranks import make_lost_rank_group

    made: list[int] = []
    if not losses:
        return made
    for folder in _spool_folders(spools):
        attrs = _rank_attrs(folder)
        rank = attrs["coords"]["rank"] if attrs is not None else None
        if rank not in losses:
            continue
        try:
            if make_lost_rank_group(store, rank, attrs, run_id):
                made.append(rank)
        except Exception:  # best effort before finalizing, which must still run: a store that does not
            pass  # take it (StoreError, a full disk, a damaged root) gets none; unlisted_losses names the rank
    return sorted(made)


def unlisted_losses(losses: dict[int, dict], finalized: dict, store: str) -> list[str]:
    """A line for each rank in `losses` that finalize could not list its unwritten steps in: the store
    has no group for it (`finalized`: the summary's ranks), not even one group_lost_ranks made."""
    lines = []
    for rank in sorted(set(losses) - {int(r) for r in finalized}):
        steps = " ".join(map(str, losses[rank]["unwritten_steps"])) or "(none)"
        lines.append(f"tracekit: rank {rank} stored nothing ({losses[rank]['unwritten_cause']}); its spooled "
                     f"steps {steps} are not in {store}")
    return lines


def _deadline_of(folder: str, deadline: float, flush_timeout: float | None) -> float:
    """`deadline`, or flush_timeout after the rank's training ended if that is sooner (monotonic)."""
    ended = read_ended(folder)
    if ended is None or flush_timeout is None:
        return deadline
    return min(deadline, time.monotonic() + (ended["time"] + flush_timeout - time.time()))


def _spool_folders(spools: str) -> list[str]:
    """The ranks' spool folders under `spools` ([] when it is gone)."""
    try:
        return [os.path.join(spools, d) for d in os.listdir(spools) if d != spool_gc.LAUNCHER_LOCK]
    except OSError:
        return []


def _rank_attrs(folder: str) -> dict | None:
    """The attributes the rank wrote in its spool folder for its writer; None unless readable and
    naming an int rank."""
    try:
        with open(os.path.join(folder, ATTRS)) as f:
            attrs = json.load(f)
        rank = attrs["coords"]["rank"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return attrs if isinstance(rank, int) and not isinstance(rank, bool) else None


def _loss(folder: str, cause: str) -> tuple[int, dict] | None:
    """(rank, what its killed writer left unstored) from its spool folder; None if the folder says
    nothing readable (no rank number)."""
    from tracekit.writer.spool import spooled_steps

    attrs = _rank_attrs(folder)
    if attrs is None:
        return None
    rank = attrs["coords"]["rank"]
    ended = read_ended(folder) or {}
    return rank, {"unwritten_steps": spooled_steps(folder), "unwritten_cause": cause,
                  "status": ended.get("status"), "cause": ended.get("cause")}


def _signal(pid: int, sig: int) -> bool:
    """Send `sig`; False when there is no such process (it ended meanwhile)."""
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True


def _writer_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _wait_lock(path: str, deadline: float | None) -> bool:
    """True once nobody holds the lock at `path` (or it is gone); False at the deadline."""
    try:
        f = open(path)
    except OSError:
        return True  # the writer finished and removed its spool
    with f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(LOCK_POLL_S)  # flock has no timeout; a short poll bounds the wait
