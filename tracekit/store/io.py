"""Every byte a store reads or writes outside zarr's own calls goes through this module.

Keys are '/'-separated paths relative to the store root. A root is a local folder (a path: plain
file calls, objects written under a temporary name and renamed) or the Location of a store at a
URL (tracekit/store/location.py: GET, HEAD and PUT through the location's zarr store; a PUT is
atomic on an object store, so no temporary name is needed there).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import json
import os
import shutil
import stat
import uuid
from typing import Iterable

import numpy as np
import zarr
from zarr.storage import LocalStore


def compact_metadata(fn):
    """Run a metadata-writing entry point with zarr writing its zarr.json files unindented. Their
    indentation (zarr's default: 2) doubled the metadata bytes, which grow with ranks while a DDP
    run's unique tensor bytes don't: at 16 ranks of the tutorial sample it was 6-8% of the store."""
    @functools.wraps(fn)
    def compact(*args, **kwargs):
        with zarr.config.set({"json_indent": None}):
            return fn(*args, **kwargs)
    return compact


def is_local(root) -> bool:
    """Whether a store root is a local folder (the direct read/write paths need one). A Location
    is os.PathLike even for a URL (its __fspath__ refuses), so it is asked, not type-checked."""
    return getattr(root, "is_local", True)


def _folder(root) -> str:
    """The folder of a local root given as a path or as a local Location."""
    return getattr(root, "path", None) or os.fspath(root)


def zarr_store(root: str, read_only: bool = False):
    """The zarr store object for a store root."""
    return LocalStore(os.fspath(root), read_only=read_only)


def open_root_group(root: str, mode: str) -> zarr.Group:
    return zarr.open_group(zarr_store(root, read_only=mode == "r"), mode=mode, use_consolidated=False)


def local_path(root: str, key: str) -> str:
    return os.path.join(os.fspath(root), *key.split("/"))


def array_key(array) -> tuple[str, str] | None:
    """(store root, array path) of a zarr array on a local store; None for any other store."""
    root = getattr(array.store_path.store, "root", None)
    if root is None:
        return None
    return os.fspath(root), array.store_path.path


def exists(root, key: str) -> bool:
    if not is_local(root):
        return root.exists(key)
    return os.path.isfile(local_path(_folder(root), key))


def size(root, key: str) -> int | None:
    """The object's size in bytes; None when there is none."""
    if not is_local(root):
        return root.size(key)
    try:
        return os.stat(local_path(_folder(root), key)).st_size
    except FileNotFoundError:
        return None


def read_json(root: str, key: str):
    """A JSON document; FileNotFoundError / ValueError / OSError pass through for the caller to word."""
    with open(local_path(root, key)) as f:
        return json.load(f)


def list_dir(root: str, key: str = "") -> list[str]:
    try:
        return sorted(os.listdir(local_path(root, key) if key else os.fspath(root)))
    except (FileNotFoundError, NotADirectoryError):
        return []


def write_parts(root: str, key: str, parts: Iterable, pad_to: int | None = None) -> None:
    """Write the buffers one after another into `key` (zero-padded to `pad_to` bytes)."""
    path = local_path(root, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)
        if pad_to is not None and f.tell() < pad_to:
            f.truncate(pad_to)


# File systems in memory: no file operation waits on a device there, and a thread pool only adds
# its own overhead (bench/bench_derived_loss.py on /dev/shm: 0.72 s concurrently, 0.52 s serially).
MEMORY_FS = frozenset({"tmpfs", "ramfs"})


def concurrently(fn, items: list, folder: str, workers: int = 16) -> None:
    """fn(item) for every item, from a thread pool unless `folder` is in memory: for many small file
    operations on local chunk folders, each of which waits on the disk (zarr keeps each row's chunk
    in a folder of its own, `c/<row>/`: 600 of them removed one by one took 1.1 s on this VM's
    ext4, concurrently 0.14-0.30 s). The first exception is raised once all have run."""
    from concurrent.futures import ThreadPoolExecutor

    if len(items) <= 1 or fs_type(folder) in MEMORY_FS:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        list(pool.map(fn, items))


def remove_folder(path: str) -> None:
    """Remove a local folder of zarr chunks, its row folders concurrently (see `concurrently`)."""
    concurrently(shutil.rmtree, [top for top, dirs, _ in os.walk(path) if not dirs and top != path], path)
    shutil.rmtree(path)


def replace_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace a local file (a metadata document, a report) atomically: written under a temporary
    name beside it, zarr's own (`zarr.<hex>.partial` for zarr.json), then renamed over it; a crash
    leaves the old file or the new one, and at worst a stray temporary, as zarr's writes do (a
    failed write removes it). `mode`: the new file's permissions, less the umask (as os.open)."""
    stem, _ = os.path.splitext(path)
    _publish(f"{stem}.{_tmp_name()[5:]}.partial", path, [data], mode=mode)


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
        if np.frombuffer(views[0], dtype=np.uint8).ctypes.data % DIRECT_ALIGN:
            return 0
        return len(views[0]) - len(views[0]) % DIRECT_ALIGN

    def refused(self) -> None:
        self.enabled = False


def direct_writes(root) -> Direct | None:
    """The Direct of a local store (None at a URL): made once per kind writer."""
    return Direct(_folder(root)) if is_local(root) else None


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


def write_once(root, key: str, parts: Iterable) -> bool:
    """Write an immutable object unless it exists; False if it was already there.

    For content-addressed keys: any writer that finds the key present, or loses a race to write
    it, would have written the same bytes. Locally a temporary name and an atomic rename mean a
    reader never sees a half-written object under its final key, and a crash leaves only a temp
    file; on an object store a PUT is atomic by itself.
    """
    if not is_local(root):
        return write_objects(root, [(key, list(parts))]) == 1
    return _write_once_local(local_path(_folder(root), key), parts)


def _write_once_local(path: str, parts: Iterable, direct: Direct | None = None) -> bool:
    """write_once() of the object at a local `path`."""
    if os.path.isfile(path):
        return False
    folder, _, _ = path.rpartition(os.sep)
    _publish(f"{folder}{os.sep}{_tmp_name()}", path, parts, folder, direct)
    return True


def write_objects(root, items, present: set | None = None, direct: Direct | None = None) -> int:
    """write_once() for each (key, parts) of `items`; the number of objects newly written.

    `present`: keys known to be in the store already (skipped without a look), updated with
    every key of `items`, so a writer asks about an unchanged object once. On an object store
    the HEAD and PUT requests of all items run concurrently (tracekit/store/location.py).
    `direct`: the store's Direct (a local store's large objects written around the page cache)."""
    todo = [(k, p) for k, p in items if present is None or k not in present]
    if is_local(root):
        folder = _folder(root)  # once, not per object: a step writes hundreds
        written = sum(_write_once_local(local_path(folder, k), p, direct) for k, p in todo)
    elif not todo:
        written = 0
    else:
        written = root.put_missing([(k, _joined(p)) for k, p in todo])
    if present is not None:
        present.update(k for k, _ in items)
    return written


def _joined(parts):
    """One bytes-like object of the parts (no copy for a single part)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


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


def prefetch(root, spans: Iterable[tuple[str, int, int | None]]) -> None:
    """prefetch_fd for each (object key, first byte, length or None: to its end) of a local store
    (missing objects are the reader's to report); a store at a URL: nothing (its reads are ranged
    GETs of what is compared)."""
    if not is_local(root):
        return
    folder = _folder(root)
    for key, base, length in spans:
        try:
            fd, _ = open_regular(local_path(folder, key))
        except OSError:
            continue
        try:
            prefetch_fd(fd, base, length)
        finally:
            os.close(fd)


def reader(root, key: str, whole: int | None = None, base: int = 0, length: int | None = None):
    """Positional reads of one object. `root`: a local folder, or a Location (tracekit/store/location.py)
    of a store at a URL, read with ranged GETs. Missing: FileNotFoundError; not a regular file or
    unreadable: OSError. `whole`: the size the caller expects when it reads the object whole, from
    offset 0; at a URL the object then comes in one GET (no HEAD for its size first).
    `base`, `length`: read the `length` bytes from `base` of the object instead (a tensor in a
    pack, store/packs.py): offsets and size() are then those within that range."""
    # (a range at a URL: a HEAD for the object's size, then ranged GETs)
    r = Reader(_folder(root), key) if is_local(root) else _RemoteReader(root, key, whole if length is None else None)
    return r if length is None else _Range(r, base, length)


class _Range:
    """Reads of `length` bytes from `base` of an object, as if they were an object of their own;
    size() is what of them the object holds (less when it is truncated)."""

    def __init__(self, inner, base: int, length: int):
        self.inner, self.base, self.length = inner, base, length
        self.key = inner.key
        self._size: int | None = None

    def size(self) -> int:
        if self._size is None:
            self._size = max(0, min(self.length, self.inner.size() - self.base))
        return self._size

    def readinto(self, offset: int, view: memoryview) -> int:
        view = view.cast("B") if view.format != "B" else view
        want = max(0, min(len(view), self.length - offset))
        if want == 0:
            return 0
        return self.inner.readinto(self.base + offset, view[:want])

    def prefetch(self) -> None:
        self.inner.prefetch(self.base, self.length)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _RemoteReader:
    """An object at a URL store: its size (one HEAD, when asked), then ranged GETs through the
    location's zarr store; or, for a caller reading it whole, one plain GET that gives both."""

    def __init__(self, location, key: str, whole: int | None = None):
        from zarr.core.sync import sync

        self.key = key
        self._store = location._remote()
        self._sync = sync
        self._size: int | None = None
        self._whole = whole
        if whole is None:
            self.size()  # missing: FileNotFoundError now, as a local open would

    def _call(self, coro):
        try:
            return self._sync(coro)
        except FileNotFoundError:
            raise
        except Exception as e:  # a refused or failed request: one line for the caller
            raise OSError(errno.EIO, f"{e.__class__.__name__}: {e}") from None

    def size(self) -> int:
        if self._size is None:
            self._size = int(self._call(self._store.getsize(self.key)))
        return self._size

    def readinto(self, offset: int, view: memoryview) -> int:
        from zarr.abc.store import RangeByteRequest
        from zarr.core.buffer import default_buffer_prototype

        dest = view.cast("B") if view.format != "B" else view
        if self._size is None and offset == 0 and self._whole is not None and len(dest) >= self._whole:
            buf = self._call(self._store.get(self.key, default_buffer_prototype()))  # the whole object
            if buf is None:
                raise FileNotFoundError(self.key)
            data = buf.as_numpy_array()
            self._size = len(data)  # a longer object than expected shows in size(), not here
            n = min(len(dest), len(data))
            dest[:n] = data[:n]
            return n
        want = min(len(dest), max(0, self.size() - offset))
        if want == 0:
            return 0
        buf = self._call(self._store.get(self.key, default_buffer_prototype(), RangeByteRequest(offset, offset + want)))
        if buf is None:
            raise FileNotFoundError(self.key)
        data = buf.as_numpy_array()
        dest[: len(data)] = data
        return len(data)

    def prefetch(self, offset: int = 0, length: int | None = None) -> None:
        pass  # ranged GETs of what is read: nothing to read ahead

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
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
