"""A store's bytes in a local folder (the local ByteStore, tracekit/store/bytestore.py): plain file
calls; an object is written under a temporary name and renamed over its key, large ones around
the page cache where the file system takes O_DIRECT; reads are positional, with read-ahead hints.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import stat
import uuid
from typing import Iterable


def local_path(root: str, key: str) -> str:
    return os.path.join(os.fspath(root), *key.split("/"))


class LocalBytes:
    """The objects of a store in the local folder `folder`."""

    direct_io = True  # large objects may be written around the page cache (where the file system takes it: Direct)
    atomic_rename = True  # written under a temporary name, renamed over the key: readers never see half an object
    conditional_create = True  # O_EXCL: a new file or an error
    listing = True
    read_hints = True  # the kernel can be asked to read ahead (posix_fadvise)
    batch_writes = False  # each object is written as soon as it is made (from a thread: store/object_queue.py)

    def __init__(self, folder: str):
        self.folder = folder

    def exists(self, key: str) -> bool:
        return os.path.isfile(local_path(self.folder, key))

    def size(self, key: str) -> int | None:
        try:
            return os.stat(local_path(self.folder, key)).st_size
        except FileNotFoundError:
            return None

    def reader(self, key: str, whole: int | None = None, ranged: bool = False) -> "Reader":
        return Reader(self.folder, key)

    def write_objects(self, items, direct: "Direct | None" = None) -> int:
        return sum(_write_once_local(local_path(self.folder, k), p, direct) for k, p in items)

    def prefetch(self, spans: Iterable[tuple[str, int, int | None]]) -> None:
        for key, base, length in spans:
            try:
                fd, _ = open_regular(local_path(self.folder, key))
            except OSError:
                continue  # missing objects are the reader's to report
            try:
                prefetch_fd(fd, base, length)
            finally:
                os.close(fd)

    def direct_writes(self) -> "Direct":
        return Direct(self.folder)


def _publish(tmp: str, path: str, parts: Iterable, folder: str | None = None, direct: "Direct | None" = None,
             mode: int = 0o644) -> None:
    """Write the buffers into the new file `tmp`, then rename it over `path`: a reader sees the old
    file or the whole new one, and a failure removes the temporary. `folder`: made when missing
    (an object's new folder; a makedirs per object would cost a syscall each). `direct`: the
    store's Direct, when a large aligned object may be written around the page cache."""
    parts = list(parts)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    views = [memoryview(p).cast("B") for p in parts]
    head = direct.head(views) if direct is not None else 0
    if head:
        flags |= os.O_DIRECT
    try:
        try:
            fd = _open_new(tmp, flags, folder, mode)
        except OSError as e:
            if not head or e.errno != errno.EINVAL:
                raise
            direct.refused()  # this file system takes no O_DIRECT (tmpfs): plain writes from now on
            head, flags = 0, flags & ~os.O_DIRECT
            fd = _open_new(tmp, flags, folder, mode)
        try:  # os.write, no buffered file: the parts are large and go out as they are
            for i, view in enumerate(views):
                if i == 0 and head:
                    view = _write_direct(fd, view, head, direct)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _open_new(tmp: str, flags: int, folder: str | None, mode: int = 0o644) -> int:
    try:
        return os.open(tmp, flags, mode)
    except FileNotFoundError:
        if folder is None:
            raise
        os.makedirs(folder, exist_ok=True)
        return os.open(tmp, flags, mode)


def _write_direct(fd: int, view: memoryview, head: int, direct: "Direct") -> memoryview:
    """Write view[:head] through the O_DIRECT descriptor `fd`, then turn O_DIRECT off for the rest
    (the tail that is not a whole block); returns what is left to write. A write the file system
    refuses (EINVAL) is taken up again without O_DIRECT, and the store writes plainly from then on."""
    done = 0
    try:
        while done < head:
            done += os.write(fd, view[done:head])
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        direct.refused()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    return view[done:]


# Objects of at least this many bytes are written with O_DIRECT where the store's file system
# takes it: the bytes go from the writer's memory (the rank's spool) to the disk by DMA, with no
# copy into the page cache. That copy (and the page allocation and reclaim behind it) was most of
# a writer's CPU (1.3 of 1.8 s per step for a 100M-parameter FSDP rank's 600 MB), and on a
# machine whose cores all train it is taken from the training. Measured here, 60 MB as objects
# into fresh page cache against direct: 64 KiB each 110 vs 65 ms of CPU, 200 KiB 89 vs 26-38,
# 1 MiB 73 vs 10-15 (the direct writes wait for the disk instead: 130, 80-100 and 60 ms of wall,
# which the writer, running beside the training, can spend). A 10M-parameter recording (~200 KiB
# pieces; bench/bench_record.py, 8 runs alternating, the disk quiet: creating a file 13-22 us)
# takes 182-213 ms of writer CPU per step with 128 KiB (50-66 of it in the kernel) against
# 198-268 (105-147) with 1 MiB; its step ratio, noisy here, 1.25-1.42x against 1.32-1.47x. An
# earlier test that saw no gain was made while recent deletions made each file creation cost
# ~0.3 ms (bench_record.py's doc), which then hid the copy.
DIRECT_MIN = 128 << 10
DIRECT_ALIGN = 4096  # buffer address and length: a multiple of any disk's logical block
# Local disk file systems where O_DIRECT is plain DMA; elsewhere (NFS, FUSE, overlay, tmpfs) it
# can be slow, emulated or refused, so objects are written through the page cache.
DIRECT_FS = frozenset({"ext4", "xfs", "btrfs"})
ENV_DIRECT = "TRACEKIT_DIRECT_WRITES"  # "0": never write around the page cache


class Direct:
    """Whether a local store's large objects are written with O_DIRECT (one per kind writer: each
    learns a refusal by itself, once)."""

    def __init__(self, folder: str):
        self.enabled = (hasattr(os, "O_DIRECT") and os.environ.get(ENV_DIRECT, "1") != "0"
                        and fs_type(folder) in DIRECT_FS)

    def head(self, views: list[memoryview]) -> int:
        """How many bytes of this object to write with O_DIRECT: its whole blocks when it is one
        buffer of at least DIRECT_MIN bytes at an aligned address (a rank's spool), else 0."""
        if not self.enabled or len(views) != 1 or len(views[0]) < DIRECT_MIN:
            return 0
        # numpy here, not at the top: the launcher writes a new store's root through this module
        # before its command starts, and numpy's import would delay the command
        import numpy as np

        if np.frombuffer(views[0], dtype=np.uint8).ctypes.data % DIRECT_ALIGN:
            return 0
        return len(views[0]) - len(views[0]) % DIRECT_ALIGN

    def refused(self) -> None:
        self.enabled = False


def fs_type(path: str) -> str | None:
    """The type of the file system `path` lies on (Linux /proc/self/mounts; None elsewhere)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return None
    path = os.path.realpath(path)
    best, kind = "", None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind


_TMP = {"pid": None, "tag": "", "seq": itertools.count()}


def _tmp_name() -> str:
    """A temporary object name no other process uses (a forked child gets its own tag)."""
    if _TMP["pid"] != os.getpid():
        _TMP.update(pid=os.getpid(), tag=uuid.uuid4().hex[:16], seq=itertools.count())
    return f".tmp-{_TMP['tag']}-{next(_TMP['seq'])}"


def _write_once_local(path: str, parts: Iterable, direct: Direct | None = None) -> bool:
    """write_once() of the object at a local `path`."""
    if os.path.isfile(path):
        return False
    folder, _, _ = path.rpartition(os.sep)
    _publish(f"{folder}{os.sep}{_tmp_name()}", path, parts, folder, direct)
    return True


def prefetch_fd(fd: int, offset: int = 0, length: int | None = None) -> None:
    """Ask the kernel to read a file (or `length` bytes of it from `offset`: a tensor in a pack)
    into the page cache now, in the background: a reader that will compare it range by range then
    computes on one range while the disk delivers the next, and several files hinted at once keep
    the disk busy (a cold diff is read-bound). A hint only: nothing is waited for, and a system
    without it just reads on demand. Only the range: the kernel walks every page of what it is
    hinted, and a pack's members hinted the whole pack each cost a diff ~30% of its time."""
    if length == 0:  # an empty tensor: nothing to read (0 would mean "to the end" to the kernel)
        return
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, 0 if length is None else length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass


class NotRegular(OSError):
    """Something other than a regular file where a file of the store should be (a FIFO, a folder)."""


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(a read-only descriptor, its fstat) of the regular file at `path`. O_NONBLOCK: a FIFO left
    in a file's place must not block the open (hostile stores). FileNotFoundError where nothing is
    there, NotRegular where something else is; other OSErrors as the open gives them."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file")
    except OSError:
        os.close(fd)
        raise
    return fd, st


class Reader:
    """Positional reads of one local object, the file opened once."""

    def __init__(self, root: str, key: str):
        self.key = key
        # anything but a regular file is refused as an OSError the callers report in one line
        self._fd, _ = open_regular(local_path(root, key))  # FileNotFoundError: missing

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def readinto(self, offset: int, view: memoryview) -> int:
        return os.preadv(self._fd, [view], offset)

    def prefetch(self, offset: int = 0, length: int | None = None) -> None:
        """Start reading the object (or `length` bytes from `offset`) from disk in the background
        (see prefetch_fd)."""
        prefetch_fd(self._fd, offset, length)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
