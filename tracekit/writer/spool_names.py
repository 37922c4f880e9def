"""The names in a spool, and the notes in it that `tracekit record` reads (tracekit/writer/spool.py
describes the spool). Nothing here imports numpy: the launcher needs these before its command
starts, where numpy's import (~50 ms) would delay the command."""

from __future__ import annotations

import json
import os
import tempfile
import time

PART, PROV, STEP = ".part", ".prov", ".step"
ENV_SPOOL = "TRACEKIT_SPOOL"  # a folder for the ranks' spool folders, set by `tracekit record`
LOCK = "writer.lock"  # held for the writer's life: `tracekit record` waits on it before finalizing
ATTRS = "attrs.json"  # the rank group's attributes, written by the rank before it starts its writer


SHM = "/dev/shm"


def spool_root(need_bytes: int) -> str:
    """Where spools go: $TRACEKIT_SPOOL, else /dev/shm (memory) if it has room, else the temp folder."""
    chosen = os.environ.get(ENV_SPOOL)
    if chosen:
        return chosen
    if os.access(SHM, os.W_OK) and spool_room(SHM) >= need_bytes:
        return SHM
    return tempfile.gettempdir()


def spool_room(folder: str) -> int:
    """Bytes still free on the filesystem of `folder` for an unprivileged writer (0 if it cannot be asked)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def entry_name(seq: int, suffix: str) -> str:
    return f"{seq:010d}{suffix}"


def entry_seq(filename: str) -> int | None:
    stem, dot, _ = filename.partition(".")
    return int(stem) if dot and stem.isdigit() else None


# The rank's own word on how it ended, written into its spool folder when its training ends (before
# it tells its writer process): `tracekit record` reads it when that writer never answered, to keep
# the rank's status and to time --flush-timeout from the end of the rank's training.
ENDED = "ended.json"


def note_ended(folder: str, status: str, cause: str | None) -> None:
    tmp = os.path.join(folder, ENDED + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"status": status, "cause": cause, "time": time.time()}, f)
        os.rename(tmp, os.path.join(folder, ENDED))
    except OSError:  # the folder is gone (the writer ended): nobody needs the note
        pass


def read_ended(folder: str) -> dict | None:
    """{"status", "cause", "time"} as the rank wrote them, or None (it never ended its training)."""
    try:
        with open(os.path.join(folder, ENDED)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("status"), str)
            and isinstance(doc.get("time"), (int, float)) and doc["time"] == doc["time"]):
        return None
    return doc
