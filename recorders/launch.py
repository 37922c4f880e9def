"""`tracekit record`'s engine: create the store, point the workers at it, run, finalize.

Like ddtrace-run: settings travel in environment variables and the command is run as a child whose
exit status becomes ours. Signals sent to the launcher are forwarded to the child, so torchrun can
shut its workers down cleanly (they flush their recorders on SIGTERM) before the store is closed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Sequence

from tracekit.environment import run_environment
from tracekit.errors import UsageError
from tracekit.store import create_store, finalize_store
from tracekit.store.finalize import mark_writers_outlived
from tracekit.store.ownership import ENV_RUN_ID, JobClaim, new_run_id
from tracekit.store.writer import check_target
from tracekit.recorders.config import RecordConfig, format_step_range

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# After the command exits, how long to wait for ranks that still write (orphans of a killed agent
# flushing on their parent-death SIGTERM) before giving up on finalizing. Env: TRACEKIT_WRITERS_WAIT_S.
WRITERS_WAIT_S = 120.0


def _writers_wait_s() -> float:
    try:
        value = float(os.environ.get("TRACEKIT_WRITERS_WAIT_S", WRITERS_WAIT_S))
    except ValueError:
        raise UsageError("TRACEKIT_WRITERS_WAIT_S must be a number of seconds") from None
    if not value >= 0:
        raise UsageError("TRACEKIT_WRITERS_WAIT_S must be a number of seconds, at least 0")
    return value


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


def launch(command: Sequence[str], config: RecordConfig, force: bool = False, extra_meta: dict | None = None,
           env_updates: dict | None = None) -> int:
    """Run `command` recorded into config.store; returns the command's exit status."""
    if not command:
        raise UsageError("no command to record; put it after --, e.g. tracekit record -o runs/ref -- torchrun ... train.py")
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]}")
    store = os.path.abspath(config.store)
    meta = {"launcher": "tracekit record", **run_environment(list(command)),
            "record_config": {"kinds": list(config.kinds), "params": list(config.params),
                              "ranks": sorted(config.ranks) if config.ranks is not None else None,
                              "every": config.every},
            **(extra_meta or {})}
    if config.replay_from:
        from tracekit.recorders.replay import check_reference  # imports torch: only when replaying

        meta.update(check_reference(config.replay_from, store), replay_steps=format_step_range(config.replay_steps))
    wait_s = _writers_wait_s()
    claim = _claim(store, force)
    try:
        create_store(store, {**meta, "run_id": claim.run_id}, force=force)
        env = worker_env(config.with_store(store))
        env.update(env_updates or {})
        env[ENV_RUN_ID] = claim.run_id
        return _run(command, store, env, claim, wait_s, config.ranks)
    finally:
        claim.release()


def _run(command: Sequence[str], store: str, env: dict, claim: JobClaim, wait_s: float,
         config_ranks: frozenset[int] | None) -> int:
    try:
        proc = subprocess.Popen(list(command), env=env)
    except OSError as e:  # on PATH and executable, yet not runnable (bad format, permissions)
        finalize_store(store, 127)
        raise UsageError(f"cannot run {command[0]}: {e.strerror or e}") from None
    previous = {}

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        previous[sig] = signal.signal(sig, forward)
    try:
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = rc if rc >= 0 else 128 - rc  # killed by signal N: report 128+N, as shells do
    # Workers of a killed agent outlive it (they get SIGTERM as their parent dies and flush):
    # finalizing now would consolidate metadata they are about to change.
    if not claim.wait_for_writers(wait_s):
        mark_writers_outlived(store, status)
        print(f"tracekit: ranks still write to {store} {wait_s:g} s after the command ended; "
              "left it unfinalized (readers report it as 'launcher died')", file=sys.stderr, flush=True)
        return status
    summary = finalize_store(store, status)
    if config_ranks is not None and not summary["ranks"]:
        print(f"Error: --ranks {','.join(map(str, sorted(config_ranks)))} matched no rank of the job "
              f"(world size {summary.get('world_size') or 'unknown'}); nothing was recorded", file=sys.stderr, flush=True)
        return status or 2
    return status
