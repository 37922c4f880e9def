"""How this process is ending, for the status a recorder closes with at exit.

Exit hooks cannot see why the interpreter is exiting. So, once per process, sys.excepthook is
wrapped to note an uncaught exception (Python calls it before the exit hooks run); `exit_status()`
then says `finished` only when none happened. A non-zero sys.exit is not seen here (a program, a
test runner, may catch SystemExit and go on): the launcher learns the worker's exit code and
finalization turns `finished` with a non-zero exit into `failed` (tracekit/store/status.py).
"""

from __future__ import annotations

import sys

_state: dict = {"cause": None}
_installed = False
MAX_CAUSE = 300


def one_line(exc: BaseException) -> str:
    """'RuntimeError: first line of the message', at most MAX_CAUSE characters."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= MAX_CAUSE else line[: MAX_CAUSE - 3] + "..."


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    previous_hook = sys.excepthook

    def excepthook(exc_type, exc, tb):
        _state["cause"] = one_line(exc) if exc is not None else exc_type.__name__
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook


def exit_status() -> tuple[str, str | None]:
    """("finished", None) for a clean end so far, else ("failed", one-line cause)."""
    cause = _state["cause"]
    return ("failed", cause) if cause else ("finished", None)
