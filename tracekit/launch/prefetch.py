"""What the launcher needs once its command has ended, imported while the command runs.

Finalizing reads and writes the store through zarr and numpy (tracekit/store/finalize.py), ~0.2 s of
CPU to import. Imported before the command, that delayed the command's start; imported after it,
the launcher's end. A thread of the launcher imports them meanwhile, when the launcher itself only
waits. The main thread's own import of the same modules later waits for the thread's, so it
always finds them whole; a module whose import fails here fails again there, with its error.
"""

from __future__ import annotations

import importlib
import threading

# finalize (zarr, numpy, the store's reader and writer) and spooled_steps' module (numpy)
FINALIZING = ("tracekit.store.finalize", "tracekit.writer.spool")


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the main thread's import raises it where it is needed
            return


def start(names: tuple[str, ...] = FINALIZING) -> threading.Thread:
    """Import `names` in a daemon thread (never keeps the launcher alive); returns it."""
    thread = threading.Thread(target=_import_all, args=(names,), name="tracekit-prefetch", daemon=True)
    thread.start()
    return thread
