"""A clean interpreter exit after obstore's async requests.

obstore completes an async request on one of its tokio threads, which hands the result to zarr's
event loop with `loop.call_soon_threadsafe`. That call wakes the loop by writing to its self-pipe,
and it lets go of the GIL around the write. The loop can run the callback and the caller's `sync()`
can return before the tokio thread takes the GIL back; a command that ends right there (a refused
claim: read one object, print one line, exit) reaches interpreter finalization first, and a thread
that asks for the GIL during finalization is ended with pthread_exit, which abort()s on a Rust
thread: exit status -6 after a correct message (seen in CI, and reproduced here under CPU load with
gdb: `take_gil -> PyThread_exit_thread -> abort` under `pyo3_async_runtimes::generic::set_result`).

`guard_exit()` counts the `call_soon_threadsafe` calls in progress on zarr's loop and, at exit
(before zarr's own atexit handler closes that loop), waits until the tasks on the loop are done and
no such call is in progress. The wait releases the GIL, so the tokio thread finishes its call.
"""

from __future__ import annotations

import atexit
import threading

# Bound on the exit wait: obstore's requests end within the S3 timeout anyway (location.s3_timeout).
EXIT_WAIT_S = 30.0

_installed: set[int] = set()
_lock = threading.Lock()


class _InFlight:
    """The number of call_soon_threadsafe calls in progress on one loop, and a way to wait for none."""

    def __init__(self):
        self.count = 0
        self.idle = threading.Condition()

    def wrap(self, call):
        def counted(*args, **kwargs):
            with self.idle:
                self.count += 1
            try:
                return call(*args, **kwargs)
            finally:
                with self.idle:
                    self.count -= 1
                    self.idle.notify_all()

        return counted

    def wait_idle(self, timeout: float) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.count == 0, timeout)


def guard_exit() -> None:
    """Once per process: count the thread-safe wake-ups of zarr's event loop, and wait for them at exit."""
    from zarr.core.sync import _get_loop

    loop = _get_loop()
    with _lock:
        if id(loop) in _installed:
            return
        _installed.add(id(loop))
        in_flight = _InFlight()
        # an instance attribute: the Rust side looks the method up by name on the loop object
        loop.call_soon_threadsafe = in_flight.wrap(loop.call_soon_threadsafe)
    # registered after zarr's import registered its cleanup: atexit runs this one first
    atexit.register(_drain, loop, in_flight)


def _drain(loop, in_flight: _InFlight) -> None:
    import asyncio
    import concurrent.futures

    if loop.is_closed() or not loop.is_running():
        in_flight.wait_idle(EXIT_WAIT_S)
        return

    async def pending_tasks_done():
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_WAIT_S)

    try:
        asyncio.run_coroutine_threadsafe(pending_tasks_done(), loop).result(EXIT_WAIT_S)
    except (concurrent.futures.TimeoutError, RuntimeError):
        pass  # a loop that will not finish its tasks: exit anyway, as before
    in_flight.wait_idle(EXIT_WAIT_S)
