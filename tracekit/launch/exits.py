"""How each worker ended, as the launcher learns it: torchrun's failure report on stderr.

A rank killed from outside (SIGKILL, the OOM killer, os._exit) cannot write its own status, and its
exit status is known only to its parent, torchrun, which reports every failed worker when the job
fails:

    rank      : 1 (local_rank: 1)
    exitcode  : -9 (pid: 7698)  (SIGKILL)

The launcher copies the command's stderr through (`StderrTail`, byte for byte, as it arrives) and
keeps its end, then `worker_exits` reads the exit codes from it; tracekit.store.status turns them
into each rank's final status at finalization.
"""

from __future__ import annotations

import os
import re
import threading

TAIL_BYTES = 1 << 18  # torchrun's report is at the end; a few KiB per failed rank
_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


class StderrTail:
    """Copy a pipe to our stderr as it arrives, keeping the last TAIL_BYTES."""

    def __init__(self, pipe_fd: int, out_fd: int = 2):
        self.tail = bytearray()
        self._fd, self._out = pipe_fd, out_fd
        self._thread = threading.Thread(target=self._pump, name="tracekit-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while True:
                data = os.read(self._fd, 65536)
                if not data:
                    break
                try:
                    os.write(self._out, data)
                except OSError:
                    pass  # our own stderr is gone: keep draining, or the workers would block on a full pipe
                self.tail += data
                del self.tail[:-TAIL_BYTES]
        finally:
            os.close(self._fd)

    def text(self, timeout: float = 5.0) -> str:
        """The tail once the pipe closed (or after `timeout`: a straggler may hold it open)."""
        self._thread.join(timeout)
        return bytes(self.tail).decode("utf-8", "replace")


def worker_exits(stderr_text: str) -> dict[int, int]:
    """{global rank: exit code} of the workers torchrun reported (negative: killed by that signal)."""
    return {int(rank): int(code) for rank, code in _EXIT.findall(stderr_text)}
