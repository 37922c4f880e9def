"""A background thread that writes to the store, so training never waits on the disk.

The queue is bounded by bytes, not items: at most `max_bytes` of copied tensors wait in memory
(one job larger than the cap is still admitted alone). When the disk is slower than training, the
training thread blocks in `submit` until the writer catches up: memory stays capped, nothing is
dropped.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from tracekit.errors import TracekitError


class WriterFailed(TracekitError):
    """The background writer hit an error; the store holds the steps completed before it."""


class BackgroundWriter:
    def __init__(self, max_bytes: int, name: str = "tracekit-writer"):
        self.max_bytes = max_bytes
        self._jobs: deque[tuple[Callable[[], None], int]] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self.peak_pending = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], nbytes: int) -> None:
        """Queue a job holding nbytes of copied data; blocks while the queue is full."""
        with self._cond:
            self._raise_if_failed()
            if self._closed:
                raise WriterFailed("the recorder is closed")
            while self._pending and self._pending + nbytes > self.max_bytes and self._error is None:
                self._cond.wait()
            self._raise_if_failed()
            self._jobs.append((job, nbytes))
            self._pending += nbytes
            self.peak_pending = max(self.peak_pending, self._pending)
            self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterFailed(f"recording failed in the background writer: {self._error}") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, nbytes = self._jobs[0]
            try:
                if self._error is None:
                    job()
            except BaseException as e:  # kept and re-raised on the training thread
                with self._cond:
                    self._error = e
            with self._cond:
                self._jobs.popleft()
                self._pending -= nbytes
                self._cond.notify_all()

    def flush(self) -> None:
        with self._cond:
            while self._jobs and self._error is None:
                self._cond.wait()
            self._raise_if_failed()

    def close(self) -> None:
        """Write everything queued, then stop the thread. Raises if any write failed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._raise_if_failed()

    @property
    def error(self) -> BaseException | None:
        return self._error
