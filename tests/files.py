"""Reading a folder's files, for tests that compare what two writers left on disk."""

from __future__ import annotations

import os


def folder_bytes(root) -> dict[str, bytes]:
    """Every file under `root`, by its path relative to it, with its bytes."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out
