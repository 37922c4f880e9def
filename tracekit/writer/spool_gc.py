"""Spool folders that tell whether their owner lives, and the removal of those whose owner died.

A spool folder is removed by its owner when it ends: a rank's by its writer process
(tracekit/writer/spool_writer.py), `tracekit record`'s by the launcher (tracekit/launch/launcher.py). A SIGKILL
(a scheduler ending every process of a job, the OOM killer) skips that, and the folder, with any
steps still in it, would hold /dev/shm memory until reboot. So every folder holds a lock file
that its owner keeps locked (flock) for its life, and a recording that starts removes the folders
in the spool roots whose lock nobody holds (collect()).

The owner locks its folder right after creating it (new_folder). A folder without a lock file is
left alone until it has been unchanged for STALE_S (its maker may be about to create the lock file;
tracekit before this change made launcher folders without one). A collector that finds the lock
file there but free removes the folder while holding the lock, and an owner that was just about
to lock it sees, once it gets the lock, that its lock file is gone, and starts over with a new
folder. So a folder being made, or whose owner lives, is never removed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import time

from tracekit.writer import spool_names
from tracekit.writer.spool_names import LOCK as RANK_LOCK

LAUNCHER_PREFIX = "tracekit-spool-"  # + mkdtemp's 8 characters: `tracekit record`'s folder of rank spools
LAUNCHER_LOCK = "launcher.lock"  # held by the launcher for its life
# mkdtemp's names: the prefix, then 8 of [a-z0-9_]; nothing else of ours or anyone's matches
_LAUNCHER_NAME = re.compile(r"tracekit-spool-[a-z0-9_]{8}\Z")
_RANK_NAME = re.compile(r"tracekit-rank[0-9]+-[a-z0-9_]{8}\Z")
_ATTEMPTS = 10  # folders a new_folder() may lose to collectors (each needs a collector in a window of microseconds)
# A folder without its lock file counts as dead once unchanged this long (its mtime moves with every
# entry made or removed in it). Such folders are a launcher's of a tracekit before the launcher's lock,
# which may still live (running a command whose ranks have yet to record), or a maker's killed
# between making the folder and its lock file, or while removing it.
STALE_S = 24 * 3600

log = logging.getLogger(__name__)


def rank_prefix(rank: int) -> str:
    return f"tracekit-rank{rank}-"


def new_folder(prefix: str, root: str, lock_name: str) -> tuple[str, int]:
    """A fresh folder `root/prefix*` and the fd of its lock file `lock_name`, locked (LOCK_EX) by
    us: the folder is ours as long as that fd (or an inherited copy) stays open."""
    for _ in range(_ATTEMPTS):
        folder = tempfile.mkdtemp(prefix=prefix, dir=root)
        lock = os.path.join(folder, lock_name)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a collector holds it only while it removes the folder
        try:
            here = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return folder, fd
        os.close(fd)  # we locked the lock file of a folder a collector removed meanwhile
    raise OSError(errno.EAGAIN, f"cannot create a spool folder in {root} (removed {_ATTEMPTS} times as it was made)")


def roots() -> list[str]:
    """Where spool folders are made (spool_names.spool_root): /dev/shm and the temp folder."""
    return list(dict.fromkeys([spool_names.SHM, tempfile.gettempdir()]))


def collect(where: list[str] | None = None) -> int:
    """Remove the spool folders of dead recordings in `where` (default: roots()): rank spools whose
    writer lock is free, and launcher folders whose launcher lock is free once the dead rank spools
    in them are removed (folders without a lock file: once unchanged for STALE_S). Only our own names, owned by this user, never through a symlink. Never
    raises: a recording must not fail for this. Returns the number of folders removed."""
    removed, errors = 0, []
    for root in where if where is not None else roots():
        try:
            removed += _collect_root(root)
        except Exception as e:  # noqa: BLE001 - anything at all: cleanup never stops a recording
            errors.append(f"{root}: {e}")
    if errors:
        log.debug("spool cleanup skipped %s", "; ".join(errors))
    return removed


def _collect_root(root: str) -> int:
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        removed = 0
        for name in os.listdir(root_fd):
            try:
                if _RANK_NAME.match(name):
                    removed += _remove_rank_spool(root_fd, name)
                elif _LAUNCHER_NAME.match(name):
                    removed += _remove_launcher_folder(root_fd, name)
            except OSError:  # gone meanwhile, or not ours to look into: leave it
                pass
        return removed
    finally:
        os.close(root_fd)


def _open_own_dir(parent_fd: int, name: str) -> int | None:
    """An fd of the folder `name` in `parent_fd` if it is a real folder (no symlink) of this user."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):  # replaced since the stat
        os.close(fd)
        return None
    return fd


LIVE, DEAD, UNKNOWN = "live", "dead", "unknown"


def _owner(dir_fd: int, lock_name: str) -> tuple[str, int | None]:
    """Whether the folder's owner lives, and, when it is dead and the folder has a lock file, that
    lock, now taken by us. With a lock file: dead when nobody holds the lock. Without one: dead once
    the folder is unchanged for STALE_S, unknown until then (its maker may be about to lock it)."""
    try:
        fd = os.open(lock_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return (DEAD if time.time() - os.fstat(dir_fd).st_mtime > STALE_S else UNKNOWN), None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return LIVE, None
    return DEAD, fd


def _remove_rank_spool(parent_fd: int, name: str) -> int:
    dir_fd = _open_own_dir(parent_fd, name)
    if dir_fd is None:
        return 0
    try:
        owner, lock = _owner(dir_fd, RANK_LOCK)
        if owner != DEAD:
            return 0
        try:
            # its entries are steps the dead writer never stored: nothing can store them now
            shutil.rmtree(name, ignore_errors=True, dir_fd=parent_fd)  # checks again for a symlink
        finally:
            if lock is not None:
                os.close(lock)
        return 1
    finally:
        os.close(dir_fd)


def _remove_launcher_folder(parent_fd: int, name: str) -> int:
    dir_fd = _open_own_dir(parent_fd, name)
    if dir_fd is None:
        return 0
    try:
        owner, lock = _owner(dir_fd, LAUNCHER_LOCK)
        if owner == LIVE:
            return 0  # it removes its folder itself when it ends
        try:
            removed = 0
            for inner in os.listdir(dir_fd):  # each has a lock of its own, whoever made the folder
                if _RANK_NAME.match(inner):
                    try:
                        removed += _remove_rank_spool(dir_fd, inner)
                    except OSError:
                        pass
            # a writer that outlived its launcher still holds its spool here: keep the folder for now
            if owner != DEAD or set(os.listdir(dir_fd)) - {LAUNCHER_LOCK}:
                return removed
            if lock is not None:
                os.unlink(LAUNCHER_LOCK, dir_fd=dir_fd)
            os.rmdir(name, dir_fd=parent_fd)
            return removed + 1
        finally:
            if lock is not None:
                os.close(lock)
    finally:
        os.close(dir_fd)
