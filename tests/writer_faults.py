"""A writer process that stops itself (SIGSTOP: a hung filesystem, a machine out of memory) or exits
(a failed start) as it starts, before it writes its pid or makes its rank's group. A sitecustomize
put first on PYTHONPATH, so that the rank's Handoff starts its writer that way."""

from __future__ import annotations

import os

FAULTS = {
    "stop": "os.kill(os.getpid(), signal.SIGSTOP)",
    "exit": "os._exit(7)",
}
SITECUSTOMIZE = """
import os, signal, sys
if "tracekit.writer.spool_writer" in sys.orig_argv:
    {fault}
"""


def faulty_writer_pythonpath(folder, fault: str = "stop") -> str:
    """A PYTHONPATH (the caller's after it) on which every writer process started does `fault`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(fault=FAULTS[fault]))
    return os.pathsep.join(p for p in [str(folder), os.environ.get("PYTHONPATH", "")] if p)
