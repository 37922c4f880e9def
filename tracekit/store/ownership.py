"""One job per store: the launcher's exclusive claim, the writers' shared claim, and the run id.

Two lock files live in the store. Each is the `zarr.json` of a tiny hidden group (zarr warns about
any other file in a hierarchy, so a plain lock file would make every listing of the store noisy):

- JOB_LOCK: `tracekit record` holds an exclusive lock on it for the life of the job. A second
  job (with --force or not) finds it held and is refused; readers probe it to tell a live job
  from one whose launcher died before finalizing.
- WRITERS_LOCK: every writing rank holds a shared lock on it while its rank group is open. The
  launcher takes it exclusively before it finalizes, so it never closes a store that an orphaned
  worker still writes, and a new job never takes over a store that one still writes.

Both are flock(2) locks: the kernel drops them when the holder dies, so a lock left by a dead job
is never mistaken for a live one. A filesystem without locks (flock fails with ENOLCK/ENOTSUP)
falls back to a conditional create (O_CREAT|O_EXCL) of the claim file, whose staleness is then
judged by its recorded pid on this host.

The job lock file also holds the owner's description (run id, pid, host, start time) as one JSON
line, for the refusal message. The run id is also in the root metadata; each rank writes only
while the root's run id is the one it was started with.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import uuid

from tracekit.errors import StoreError

JOB_GROUP = ".tracekit_job"
WRITERS_GROUP = ".tracekit_writers"
JOB_LOCK = f"{JOB_GROUP}/zarr.json"
WRITERS_LOCK = f"{WRITERS_GROUP}/zarr.json"
CLAIM_FILE = f"{JOB_GROUP}/claim"  # the no-locks fallback's conditional create
LOCK_ENTRIES = (JOB_GROUP, WRITERS_GROUP)  # what a --force wipe of an old store leaves in place
ENV_RUN_ID = "TRACEKIT_RUN_ID"
# A reader's probe holds a shared lock for microseconds; a launcher retries this long before
# calling the store busy, so a concurrent `tracekit show` never makes a job refuse to start.
_PROBE_GRACE_S = 0.5
_NO_LOCKS = (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _describe(owner: dict) -> str:
    parts = [f"run {owner.get('run_id', '?')}"]
    if owner.get("pid"):
        parts.append(f"pid {owner['pid']} on {owner.get('host', '?')}")
    if owner.get("start_time"):
        parts.append(f"since {owner['start_time']}")
    return ", ".join(parts)


def _group_doc(attrs: dict | None = None) -> bytes:
    return (json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attrs or {}}) + "\n").encode()


def _open_lock(store: str, name: str) -> int:
    """Open (creating it, a valid empty group's metadata, if need be) one of the store's lock files."""
    path = os.path.join(store, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if os.fstat(fd).st_size == 0:
        os.write(fd, _group_doc())  # concurrent creators write the same bytes
    return fd


def read_owner(store: str) -> dict:
    """What the job lock file says about its (last) owner; {} when absent or unreadable."""
    for name in (JOB_LOCK, CLAIM_FILE):
        try:
            with open(os.path.join(store, name)) as f:
                owner = json.load(f).get("attributes", {}).get("tracekit_job")
            if isinstance(owner, dict):
                return owner
        except (OSError, ValueError, AttributeError):
            pass
    return {}


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def _try_flock(fd: int, exclusive: bool, grace_s: float = 0.0) -> bool:
    """Non-blocking flock, retried for grace_s; raises OSError for filesystems without locks."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


class JobClaim:
    """The launcher's exclusive ownership of a store folder; release() or process death ends it."""

    def __init__(self, store: str | None, run_id: str, fd: int | None, exclusive_file: str | None = None):
        """store None: a claim without a lock (an object store), holding only the run id."""
        self.store = store
        self.run_id = run_id
        self._fd = fd
        self._writers_fd: int | None = None
        self._exclusive_file = exclusive_file  # the fallback's claim file, removed on release

    @classmethod
    def acquire(cls, store: str, run_id: str | None = None) -> "JobClaim":
        """Claim `store` (an existing folder) for a new job, or raise StoreError naming its owner."""
        run_id = run_id or new_run_id()
        try:
            fd = _open_lock(store, JOB_LOCK)
        except OSError as e:
            raise StoreError(f"{store}: cannot create its lock file ({e.strerror or e})") from None
        try:
            got = _try_flock(fd, exclusive=True, grace_s=_PROBE_GRACE_S)
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return cls._acquire_by_create(store, run_id)
            raise StoreError(f"{store}: cannot lock it ({e.strerror or e})") from None
        if not got:
            os.close(fd)
            raise StoreError(f"{store} is being recorded by another job ({_describe(read_owner(store))}); "
                             "wait for it to end or record into another store (--force does not override a live job)")
        claim = cls(store, run_id, fd)
        busy = writers_alive(store)
        if busy:
            claim.release()
            raise StoreError(f"{store} is still being written by ranks of {_describe(read_owner(store))}, whose "
                             "launcher is gone; wait for them to exit or record into another store")
        claim._write_owner()
        return claim

    @classmethod
    def _acquire_by_create(cls, store: str, run_id: str) -> "JobClaim":
        """Fallback without locks: whoever creates the claim file first owns the store."""
        path = os.path.join(store, CLAIM_FILE)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = read_owner(store)
                if owner.get("host") == socket.gethostname() and not _pid_alive(owner.get("pid")):
                    os.unlink(path)  # its owner is dead: a stale claim
                    continue
                raise StoreError(f"{store} is being recorded by another job ({_describe(owner)}); wait for it "
                                 "to end or record into another store") from None
            claim = cls(store, run_id, None, exclusive_file=path)
            os.write(fd, _group_doc({"tracekit_job": claim.owner()}))
            os.close(fd)
            claim._write_owner()
            return claim
        raise StoreError(f"{store}: cannot claim it (its claim file keeps reappearing)")

    def owner(self) -> dict:
        return {"run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(),
                "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def _write_owner(self) -> None:
        # Readers of the file never lock it, so a rewrite in place is fine: one line, one write.
        fd = _open_lock(self.store, JOB_LOCK)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, _group_doc({"tracekit_job": self.owner()}))
        finally:
            os.close(fd)  # a second descriptor: closing it leaves the flock on self._fd alone

    def wait_for_writers(self, timeout_s: float) -> bool:
        """Hold the writers lock exclusively once no rank holds it (True), or give up after timeout_s (False).

        Held until release(): a rank that opens late finds the store finalized and does not write.
        """
        if self.store is None:
            return True
        try:
            fd = _open_lock(self.store, WRITERS_LOCK)
        except OSError:
            return True  # no lock file can be made: no rank can hold one either
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if _try_flock(fd, exclusive=True):
                    self._writers_fd = fd
                    return True
            except OSError:
                os.close(fd)
                return True  # a filesystem without locks: nothing to wait on
            if time.monotonic() >= deadline:
                os.close(fd)
                return False
            time.sleep(0.01)  # the launcher's finalize waits on this (writers release it as they close)

    def release(self) -> None:
        for attr in ("_fd", "_writers_fd"):
            fd = getattr(self, attr, None)
            if fd is not None:
                os.close(fd)  # closing the only descriptor drops the flock
                setattr(self, attr, None)
        if self._exclusive_file is not None:
            try:
                os.unlink(self._exclusive_file)
            except OSError:
                pass
            self._exclusive_file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class ObjectClaim:
    """The launcher's claim on an object store (no locks there): the object CLAIM_FILE, created only
    if absent (a conditional PUT, S3's If-None-Match: *), so of two jobs on one prefix exactly one
    gets it and the other is refused, --force or not. Deleted on release. A claim left by a launcher
    that died stays: nothing tells a dead job from a live one there, so the next job is refused
    with the owner named, and the claim object to delete once that job is known to be dead."""

    def __init__(self, location, run_id: str, claimed: bool):
        self.store = None  # no local folder: no writers lock to wait on
        self.location = location
        self.run_id = run_id
        self._claimed = claimed

    @classmethod
    def acquire(cls, location, run_id: str | None = None) -> "ObjectClaim":
        run_id = run_id or new_run_id()
        owner = {"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
                 "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        created = location.put_if_absent(CLAIM_FILE, _group_doc({"tracekit_job": owner}))
        if created is None:  # a client without conditional writes: only the run id guards the data
            return cls(location, run_id, claimed=False)
        if not created:
            try:
                held = json.loads(location.read_bytes(CLAIM_FILE) or b"{}").get("attributes", {}).get("tracekit_job")
            except (ValueError, AttributeError):
                held = None
            raise StoreError(f"{location} is claimed by another job ({_describe(held if isinstance(held, dict) else {})}); "
                             "wait for it to end or record into another store (--force does not override a claim; "
                             f"if that job is dead, delete {location.join(CLAIM_FILE)})")
        return cls(location, run_id, claimed=True)

    def wait_for_writers(self, timeout_s: float) -> bool:
        return True  # object stores hold no writers lock

    def release(self) -> None:
        if self._claimed:
            self._claimed = False
            try:
                self.location.delete(CLAIM_FILE)
            except StoreError:  # an endpoint gone meanwhile: the claim stays, naming us
                pass


def _lock_held(path: str, exclusive: bool) -> bool | None:
    """Whether another process holds the lock file at `path` in a way that blocks a lock of ours
    (`exclusive` or shared); None when there is no lock file or the filesystem has no locks."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if _try_flock(fd, exclusive=exclusive):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def writers_alive(store: str) -> bool:
    """Whether some process holds the store's writers lock (a rank group is open for writing)."""
    return bool(_lock_held(os.path.join(store, WRITERS_LOCK), exclusive=True))


def job_alive(store: str) -> bool | None:
    """Whether a launcher holds the store's job lock; None when the store has no lock file."""
    path = os.path.join(store, JOB_LOCK)
    if not os.path.exists(path):
        return None
    if _lock_held(path, exclusive=False):
        return True
    # not held, or a filesystem without locks: the fallback's claim file tells
    if os.path.exists(os.path.join(store, CLAIM_FILE)):
        owner = read_owner(store)
        return owner.get("host") != socket.gethostname() or _pid_alive(owner.get("pid"))
    return False


class WriterClaim:
    """A writing rank's shared hold on the writers lock; the kernel drops it when the rank dies."""

    def __init__(self, store: str | None):
        self._fd: int | None = None
        if store is None:  # an object store: no file locks there
            return
        try:
            fd = _open_lock(store, WRITERS_LOCK)
        except OSError:
            return  # a read-only or lockless store folder: the launcher cannot wait on us, nothing else breaks
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # shared locks never wait on each other; only on a finalizing launcher
            self._fd = fd
        except OSError:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def forget_in_child(self) -> None:
        """In a forked child: drop our reference, so the lock ends with the rank, not with its children."""
        self.release()


def check_run_id(store: str, meta: dict, run_id: str | None) -> None:
    """StoreError unless the store's root metadata names `run_id` (None: the caller adopts any)."""
    if run_id is None:
        return
    theirs = meta.get("run_id")
    if theirs != run_id:
        raise StoreError(f"{store} now belongs to run {theirs or '(none)'}, not to this job's run {run_id}; "
                         "this rank stops writing to it")
