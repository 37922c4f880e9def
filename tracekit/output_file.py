"""Files a user names for output (a report, an exported tensor file): written whole or not at all.

A new or regular file is written under a temporary name beside it and renamed over it
(store/io.py replace_file): a failure (a full disk) or a crash leaves the old file as it was, never a
half-written one, and the temporary is removed on failure. A path that is a symbolic link
(/dev/stdout, or a link the user keeps pointing at the latest report) or an existing FIFO or
device is written into instead: a rename would put a file in its place, and the link, the pipe or,
as root, the device node (/dev/full) would be gone. The replacement gets the permissions of the file
it replaces (a private 0600 report stays private), a new file those of open(): 0666 less the umask.
"""

from __future__ import annotations

import os
import stat

from tracekit.store.io import replace_file


def _existing_mode(path: str) -> int | None:
    """The st_mode of what `path` names (a link itself, not its target); None when nothing does."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


def written_in_place(path: str) -> bool:
    """Whether `path` is written into rather than replaced (see the module's doc); OSError when
    it cannot be looked at (a folder on its way that may not be searched)."""
    mode = _existing_mode(path)
    return mode is not None and not stat.S_ISREG(mode)  # a link (lstat), FIFO or device


def write_output(path: str, data: bytes) -> None:
    """Write `data` as the whole content of the user's output file `path`; raises OSError."""
    if written_in_place(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    mode = _existing_mode(path)  # a regular file's, or None for a new one
    replace_file(path, data, 0o666 if mode is None else stat.S_IMODE(mode))
