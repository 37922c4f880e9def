"""One job per store on a filesystem without file locks: the conditional-create fallback.

Every filesystem on this machine has locks, so the fallback is reached the way a lock-less
filesystem (some NFS setups, FUSE mounts) reaches it: flock fails with ENOLCK.
"""

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from tracekit.errors import StoreError
from tracekit.store import ownership
from tracekit.store.ownership import CLAIM_FILE, JobClaim, job_alive


@pytest.fixture
def no_locks(monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ownership.fcntl, "flock", flock)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    path.mkdir()
    return str(path)


def _plant_claim(store: str, owner: dict) -> None:
    """The claim file another job left behind, as the fallback writes it."""
    path = os.path.join(store, CLAIM_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {"tracekit_job": owner}}, f)


def test_without_locks_the_first_claim_wins_until_released(no_locks, store):
    first = JobClaim.acquire(store)
    assert os.path.exists(os.path.join(store, CLAIM_FILE))
    assert job_alive(store) is True
    with pytest.raises(StoreError, match="being recorded by another job.*" + first.run_id):
        JobClaim.acquire(store)
    first.release()
    assert not os.path.exists(os.path.join(store, CLAIM_FILE))
    assert job_alive(store) is False
    second = JobClaim.acquire(store)
    assert second.run_id != first.run_id
    second.release()


def test_without_locks_a_dead_owners_claim_is_stale_and_taken_over(no_locks, store):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited and reaped: no process has this pid now (reuse aside)
    _plant_claim(store, {"run_id": "deadbeef", "pid": dead_pid, "host": socket.gethostname(), "start_time": "x"})
    # the job lock file exists (the dead job made it) but, without locks, only the claim file tells
    open(os.path.join(store, ownership.JOB_LOCK), "a").close()
    assert job_alive(store) is False
    claim = JobClaim.acquire(store)
    assert ownership.read_owner(store)["run_id"] == claim.run_id
    claim.release()


def test_without_locks_another_hosts_claim_is_never_taken(no_locks, store):
    _plant_claim(store, {"run_id": "elsewhere", "pid": 1, "host": "another-host", "start_time": "x"})
    with pytest.raises(StoreError, match="another-host"):
        JobClaim.acquire(store)
