"""A bench's own scratch folder, made inside the folder that --dir names: the only thing the bench removes.

bench_diff.py and bench_diff_workers.py used to build their stores in --dir itself and remove --dir at
the end, so `--dir ~/data` or `--dir .` would have deleted everything in it. Now each makes (or reuses,
for --keep) a folder of its own name inside --dir, marks it with a sentinel file, and removes only a
folder that carries the sentinel; a folder of that name the bench did not make is refused.
"""

from __future__ import annotations

import os
import shutil
import tempfile

SENTINEL = ".tracekit-bench-folder"  # made by a bench: the bench may remove it


def own_folder(parent: str | None, name: str) -> str:
    """PARENT/NAME (PARENT: the temp folder when None), made if missing and marked as the bench's.
    SystemExit, naming the folder, when it exists with files in it and was not made by a bench."""
    path = os.path.join(parent or tempfile.gettempdir(), name)
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        raise SystemExit(f"error: {path} exists and is not a folder: choose another --dir")
    if os.path.isdir(path) and os.listdir(path) and not os.path.exists(os.path.join(path, SENTINEL)):
        raise SystemExit(f"error: {path} holds files a bench did not make (no {SENTINEL} in it): "
                         f"choose another --dir, or remove it")
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, SENTINEL), "a").close()
    return path


def remove_own(path: str) -> None:
    """Remove a folder own_folder() made (and everything in it); anything else is left alone."""
    if os.path.isdir(path) and not os.path.islink(path) and os.path.exists(os.path.join(path, SENTINEL)):
        shutil.rmtree(path, ignore_errors=True)
