"""Ending a rank without Python's teardown once TorchTitan's main has returned.

After the exit handlers ran, Python tears the interpreter down: it clears every module and runs
its garbage collector over what TorchTitan imported (torch, dynamo, inductor, triton, datasets).
That costs ~1.7 CPU-s per rank on a CPU host (measured: 6.4 CPU-s for the runner's imports and
exit, 4.8 without the teardown), after training is over and while torchrun waits for the rank.

`arm()` registers an exit handler before anything else can (train.py calls it before torch is
imported), so it runs last, after every other one: threading's (the zero-code recorder closes its
store there), torch's, a recorder's `atexit` ones. If `succeeded()` was called (TorchTitan's main
returned), it flushes stdout and stderr and ends the process with status 0 there; otherwise (an
exception, sys.exit) Python exits as usual, with its own status.
"""

from __future__ import annotations

import atexit
import os
import sys

_succeeded = False


def arm() -> None:
    atexit.register(_end)


def succeeded() -> None:
    global _succeeded
    _succeeded = True


def _end() -> None:
    if not _succeeded:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
