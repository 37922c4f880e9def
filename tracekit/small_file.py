"""Reading a small text file the user named (a config file): a regular file only, size capped, UTF-8.

A FIFO or a device given as a file would block the open or never end the read (/dev/zero), so
the file is opened without blocking and refused unless it is a regular file; a file larger than
the cap is refused before it is read; bytes that are not UTF-8 are one line, not a traceback.
"""

from __future__ import annotations

import os
import stat

from tracekit.errors import UsageError


def read_small_text(path: str, option: str, max_bytes: int) -> str:
    """The text of the regular file `path`, at most `max_bytes` bytes; UsageError naming `option` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO's open would wait for a writer
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{option} {path}: not a regular file")
        if st.st_size > max_bytes:
            raise UsageError(f"{option} {path}: {st.st_size} bytes, more than the {max_bytes} a config file may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(max_bytes + 1)  # a file that grew since fstat is still capped
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise UsageError(f"{option} {path}: more than the {max_bytes} bytes a config file may have")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{option} {path}: not UTF-8 text (byte {e.start})") from None
