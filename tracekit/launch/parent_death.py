"""Workers die with their launcher: Linux's parent-death signal (prctl PR_SET_PDEATHSIG).

When the torchrun agent (or `tracekit record`, for a world of one) is SIGKILLed, its workers would
otherwise train on as orphans, writing a store that the launcher is about to finalize. With this,
the kernel sends them SIGTERM as their parent dies: the recorder flushes what it has and the rank
ends 'terminated', and the launcher finalizes only once every writer has let go of the store.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask for `sig` when our parent dies; True if set (Linux only). Idempotent."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True
