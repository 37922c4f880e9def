"""A writer process that stops itself (SIGSTOP) as it starts, before it writes its pid or makes its
rank's group: a hung filesystem, a machine out of memory. A sitecustomize put first on PYTHONPATH,
so that the rank's Handoff starts its writer that way."""

from __future__ import annotations

import os

STOP_THE_WRITER = """
import os, signal, sys
if "tracekit.writer.spool_writer" in sys.orig_argv:
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def stopping_pythonpath(folder) -> str:
    """A PYTHONPATH (the caller's after it) on which every writer process started stops itself."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(STOP_THE_WRITER)
    return os.pathsep.join(p for p in [str(folder), os.environ.get("PYTHONPATH", "")] if p)
