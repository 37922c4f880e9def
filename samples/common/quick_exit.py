"""Ending a rank without Python's teardown once its training has returned (samples/plain,
samples/tutorial, samples/replay and samples/torchtitan's runner call it, and the tests' own
training scripts through tests/cli/scripts/quick_end.py; it never imports torch or tracekit).

After the exit handlers, Python tears the interpreter down: it clears every module and runs its
garbage collector over what the rank imported. That is CPU spent after training is over, while
torchrun waits for the rank: measured on a 2-core CPU host, ~0.9 CPU-s for torch with dynamo (what
a torch optimizer imports) and ~1.7 CPU-s for TorchTitan's imports, a quarter of their start-up.

`arm()` registers an exit handler before anything else can (each runner calls it before torch is
imported), so it runs last, after every other one: threading's (the zero-code recorder closes its
store there), a recorder's and torch's `atexit` ones. If the runner said `ending(code)` (its
training returned that status), the handler flushes stdout and stderr and ends the process there
with that status; otherwise (an exception, sys.exit elsewhere) Python exits as usual, teardown
and status its own.
"""

from __future__ import annotations

import atexit
import os
import sys

_code: int | None = None


def arm() -> None:
    atexit.register(_end)


def ending(code: int = 0) -> int:
    """The status the process ends with once the exit handlers ran (returned, for sys.exit)."""
    global _code
    _code = code
    return code


def _end() -> None:
    if _code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(_code)
