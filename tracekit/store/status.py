"""A rank's final status: what it wrote itself, corrected by how its process ended.

  running     still recording (a store not finalized yet)
  finished    the rank closed its recording at a clean end of its loop / script
  failed      an exception ended it, or its process exited non-zero; `cause` holds one line
  terminated  it flushed and closed on SIGTERM
  killed      it never closed its recording and a signal ended it (SIGKILL, the OOM killer)
  died        it never closed its recording and exited (os._exit, a native crash) or the
              launcher does not know how it ended
"""

from __future__ import annotations

import signal

# how a `failed` rank's cause starts when its writer process failed to store its steps (the disk
# full, a refused write): the rank itself may never have heard of it (spool_writer.py)
RECORDING_FAILED = "recording: "


def signal_name(code: int) -> str:
    """The signal of a negative exit code (-9 -> SIGKILL)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def final_rank_status(own: str, cause: str | None, exit_code: int | None) -> tuple[str, str | None]:
    """(status, one-line cause) of a rank at finalization, from the status it wrote itself and its
    exit code (None: unknown; negative: killed by that signal).

    A rank that closed its recording keeps its status; one still "running" could not close it, so
    it was stopped from outside: killed by a signal, or died.
    """
    if own == "finished" and exit_code is not None and exit_code > 0:
        return "failed", f"exit status {exit_code} after its recording closed"  # finished means a clean end
    if own != "running":
        if own != "finished" and exit_code is not None and exit_code < 0 and not cause:
            cause = f"killed by {signal_name(exit_code)}"
        return own, cause
    if exit_code is None:
        return "died", "ended without closing its recording; exit status unknown"
    if exit_code < 0:
        return "killed", f"killed by {signal_name(exit_code)}"
    return "died", f"exit status {exit_code} without closing its recording"
