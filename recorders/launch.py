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
from typing import Sequence

from tracekit.environment import run_environment
from tracekit.errors import UsageError
from tracekit.store import create_store, finalize_store
from tracekit.recorders.config import RecordConfig, format_step_range

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


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
                              "every": config.every,
                              **({"trace": config.trace, "trace_steps": format_step_range(config.trace_steps),
                                  "trace_full": list(config.trace_full)} if config.trace else {})},
            **(extra_meta or {})}
    if config.replay_from:
        from tracekit.recorders.replay import check_reference  # imports torch: only when replaying

        meta.update(check_reference(config.replay_from, store), replay_steps=format_step_range(config.replay_steps))
    create_store(store, meta, force=force)
    env = worker_env(config.with_store(store))
    env.update(env_updates or {})
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
    finalize_store(store, status)
    return status
