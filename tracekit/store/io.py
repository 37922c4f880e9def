"""Every byte a store reads or writes outside zarr's own calls goes through this module.

Keys are '/'-separated paths relative to the store root. A root is a local folder, the Location of
a store at a URL, or the ByteStore chosen for either (tracekit/store/bytestore.py: local_bytes.py
writes objects under a temporary name and renames them; object_bytes.py PUTs them, atomic by
themselves).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shutil
import sys
from typing import Iterable

from tracekit.store.bytestore import ByteStore, byte_store
# what the rest of tracekit (and its tests) use of the local implementation, by their old address
from tracekit.store.local_bytes import (DIRECT_FS, DIRECT_MIN, ENV_DIRECT, Direct, NotRegular, Reader,  # noqa: F401
                                        _open_new, _publish, _tmp_name, fs_type, local_path, open_regular,
                                        prefetch_fd)


def compact_metadata(fn):
    """Run a metadata-writing entry point with zarr writing its zarr.json files unindented. Their
    indentation (zarr's default: 2) doubled the metadata bytes, which grow with ranks while a DDP
    run's unique tensor bytes don't: at 16 ranks of the tutorial sample it was 6-8% of the store.

    A call that begins before this process imported zarr does not import it: a rank's writer on a
    local store writes every document itself (tracekit/store/nodes.py, nodemeta.py) and is spared
    zarr's import (~0.1-0.18 s of CPU, while the ranks train). Whatever in the call needs zarr then
    loads it through load_zarr(), which sets the compact writing for the rest of the call."""
    @functools.wraps(fn)
    def compact(*args, **kwargs):
        zarr = sys.modules.get("zarr")
        if zarr is not None:
            with zarr.config.set({"json_indent": None}):
                return fn(*args, **kwargs)
        if _COMPACT_LATER.get() is not None:  # inside a call that waits for zarr already: that one sets it
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as later:
            token = _COMPACT_LATER.set(later)
            try:
                return fn(*args, **kwargs)
            finally:
                _COMPACT_LATER.reset(token)
    return compact


# The outermost compact_metadata call running while zarr is not imported: its exit stack, which
# load_zarr enters zarr's compact setting into once the call imports zarr.
_COMPACT_LATER: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar(
    "tracekit_compact_later", default=None)


def load_zarr():
    """zarr, imported here where a metadata-writing call (compact_metadata) may be the first to
    need it: from then on until that call ends, zarr writes compact documents."""
    import zarr

    later = _COMPACT_LATER.get()
    if later is not None:
        later.enter_context(zarr.config.set({"json_indent": None}))
        _COMPACT_LATER.set(None)  # set once; the call's end takes the variable back to its old value
    return zarr


# Set while tracekit creates a node directly under a group it holds (io.child_group, io.child_array).
_PARENTS_EXIST: contextvars.ContextVar[bool] = contextvars.ContextVar("tracekit_parents_exist", default=False)


@functools.cache  # decided once per process: whether zarr's save_metadata is wrapped
def _hook_parents() -> bool:
    """Wrap zarr's save_metadata (as zarr.core.array and zarr.core.group call it) once, so that under
    _PARENTS_EXIST it writes the node's own zarr.json only. zarr 3.1 otherwise "ensures the parents"
    of every node it creates: it reads each ancestor's metadata and re-PUTs it if-none-match, 3 to 8
    requests a node on an object store (a 2-rank, 3-step store on S3 took 422 requests, ~200 of them
    for this), stat/open calls on a folder. A zarr whose internals differ is left as it is: False."""
    try:
        import zarr.core.array as za
        import zarr.core.group as zg
        from zarr.core.metadata import io as zio
    except ImportError:
        return False
    real = zio.save_metadata
    if za.save_metadata is not real or zg.save_metadata is not real:
        return False

    async def save_metadata(store_path, metadata, ensure_parents: bool = False):
        return await real(store_path, metadata, ensure_parents=ensure_parents and not _PARENTS_EXIST.get())

    za.save_metadata = zg.save_metadata = save_metadata
    return True


def _under_existing_parent(make, name: str, **kwargs):
    # a name with a "/" makes intermediate groups: those zarr must still create
    if "/" in name or not _hook_parents():
        return make(name, **kwargs)
    token = _PARENTS_EXIST.set(True)  # zarr's event loop thread runs the write in a copy of this context
    try:
        return make(name, **kwargs)
    finally:
        _PARENTS_EXIST.reset(token)


def child_group(parent, name: str, **kwargs):
    """parent.create_group(name, ...) for a group `parent` that exists (tracekit holds it open): the
    same node, refused the same way where one exists, without zarr's rewrite of every ancestor."""
    return _under_existing_parent(parent.create_group, name, **kwargs)


def child_array(parent, name: str, **kwargs):
    """parent.create_array(name, ...), as child_group."""
    return _under_existing_parent(parent.create_array, name, **kwargs)


def array_key(array) -> tuple[str, str] | None:
    """(store root, array path) of a zarr array on a local store; None for any other store."""
    root = getattr(array.store_path.store, "root", None)
    if root is None:
        return None
    return os.fspath(root), array.store_path.path


def exists(root, key: str) -> bool:
    return byte_store(root).exists(key)


def size(root, key: str) -> int | None:
    """The object's size in bytes; None when there is none."""
    return byte_store(root).size(key)


def direct_writes(root) -> Direct | None:
    """The Direct of a local store (None at a URL): made once per kind writer."""
    return byte_store(root).direct_writes()




def write_parts(root: str, key: str, parts: Iterable, pad_to: int | None = None) -> None:
    """Write the buffers one after another into `key` (zero-padded to `pad_to` bytes)."""
    path = local_path(root, key)
    # The folder is made only when the open says it is missing (_open_new, as for objects): a
    # makedirs per file (a writer's index rows, 15 a rank-step) is a mkdir each, which locks the
    # folder even when it exists. Mode 0o666, as open(path, "wb") makes files (less the umask).
    fd = _open_new(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.path.dirname(path), 0o666)
    with open(fd, "wb") as f:
        for p in parts:
            f.write(p)
        if pad_to is not None and f.tell() < pad_to:
            f.truncate(pad_to)


# File systems in memory: no file operation waits on a device there, and a thread pool only adds
# its own overhead (bench/bench_derived_loss.py on /dev/shm: 0.72 s concurrently, 0.52 s serially).
MEMORY_FS = frozenset({"tmpfs", "ramfs"})


POOL_WORKERS = 16


def concurrently(fn, items: list, folder: str) -> None:
    """fn(item) for every item, from a thread pool unless `folder` is in memory: for many small file
    operations on local chunk folders, each of which waits on the disk (zarr keeps each row's chunk
    in a folder of its own, `c/<row>/`: 600 of them removed one by one took 1.1 s on this VM's
    ext4, concurrently 0.14-0.30 s). The first exception is raised once all have run. fn must not
    call concurrently itself (the pool's threads would wait on work queued behind them)."""
    if len(items) <= 1 or fs_type(folder) in MEMORY_FS:
        for item in items:
            fn(item)
        return
    from concurrent.futures import wait

    futures = [_pool().submit(fn, item) for item in items]
    wait(futures)  # all of them, failed or not: none may still run in the pool once we return
    for future in futures:
        future.result()


_POOLS: dict = {}  # thread name prefix -> (pid, pool): a forked child has none of its parent's threads


def process_pool(prefix: str, workers: int):
    """This process's thread pool of `workers` threads named `prefix`, made at its first use and kept
    (in a forked child, made anew)."""
    from concurrent.futures import ThreadPoolExecutor

    pid, pool = _POOLS.get(prefix, (None, None))
    if pid != os.getpid():
        pool = ThreadPoolExecutor(workers, thread_name_prefix=prefix)
        _POOLS[prefix] = (os.getpid(), pool)
    return pool


def _pool():
    """The process's pool for `concurrently`, made at its first use and kept: a writer process calls
    it for each kind of each batch of steps, and a pool made per call started up to 16 threads each
    time (~140 thread starts per writer process over the TorchTitan bench's 10 steps)."""
    return process_pool("tracekit-io", POOL_WORKERS)


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


def write_once(root, key: str, parts: Iterable) -> bool:
    """Write an immutable object unless it exists; False if it was already there.

    For content-addressed keys: any writer that finds the key present, or loses a race to write
    it, would have written the same bytes. Locally a temporary name and an atomic rename mean a
    reader never sees a half-written object under its final key, and a crash leaves only a temp
    file; on an object store a PUT is atomic by itself.
    """
    return write_objects(root, [(key, list(parts))]) == 1


def write_objects(root, items, present: set | None = None, direct: Direct | None = None) -> int:
    """write_once() for each (key, parts) of `items`; the number of objects newly written.

    `present`: keys known to be in the store already (skipped without a look), updated with
    every key of `items`, so a writer asks about an unchanged object once. On an object store
    the HEAD and PUT requests of all items run concurrently (tracekit/store/location.py).
    `direct`: the store's Direct (a local store's large objects written around the page cache)."""
    todo = [(k, p) for k, p in items if present is None or k not in present]
    written = byte_store(root).write_objects(todo, direct)
    if present is not None:
        present.update(k for k, _ in items)
    return written


def prefetch(root, spans: Iterable[tuple[str, int, int | None]]) -> None:
    """prefetch_fd for each (object key, first byte, length or None: to its end) of a local store
    (missing objects are the reader's to report); a store at a URL: nothing (its reads are ranged
    GETs of what is compared)."""
    byte_store(root).prefetch(spans)


def reader(root, key: str, whole: int | None = None, base: int = 0, length: int | None = None):
    """Positional reads of one object. `root`: a local folder, or a Location (tracekit/store/location.py)
    of a store at a URL, read with ranged GETs. Missing: FileNotFoundError; not a regular file or
    unreadable: OSError. `whole`: the size the caller expects when it reads the object whole, from
    offset 0; at a URL the object then comes in one GET (no HEAD for its size first).
    `base`, `length`: read the `length` bytes from `base` of the object instead (a tensor in a
    pack, store/packs.py): offsets and size() are then those within that range; with `whole` too
    (the caller reads the range whole, from its first byte), at a URL served by obstore the range
    comes in one ranged GET whose answer also gives the object's size (no HEAD first)."""
    if length is None:
        return byte_store(root).reader(key, whole)
    # (a range at a URL: a HEAD for the object's size, then ranged GETs; or one ranged GET, above)
    return _Range(byte_store(root).reader(key, None, ranged=whole is not None), base, length)


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


