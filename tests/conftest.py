"""Shared fixtures, and the launch guard's hooks (tests/launch_guard.py). The fixtures that launch
workers (`recorded_sample`) are tests/e2e/conftest.py's; `shared_once` is here, since in-process
tests share work through it too.
"""

from __future__ import annotations

import json
import os
import shutil

# torch on one thread in every xdist worker and in every process a test starts without its own
# setting (the launching tests' ranks already run with OMP_NUM_THREADS=1): `-n auto` runs one worker
# per core, so a worker's second intra-op thread only took a core from the other worker and its
# processes, spinning between small ops. The fast tier, side by side on 2 cores: 231.3 vs 243.6 and
# 241.5 vs 281.5 CPU-s (130.9 vs 137.2 s and 150.4 vs 169.6 s), with against without. Set before
# any test module imports torch: OpenMP reads it once, when torch loads; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from filelock import FileLock

from tests.dynamo_teardown import release_dynamo
from tests.launch_guard import MARKER, Guard, misplaced
from tests.paths import SAMPLES
from tests.scheduling import ordered
from tests.sharing import shared_root
from tests.launching import TORCHRUN_TIMEOUT


_LAUNCH_GUARD = Guard()


def pytest_configure(config):
    _LAUNCH_GUARD.install()  # tests/launch_guard.py: an unmarked test that launches workers fails


# One pytest_unconfigure per module: a second `def` (or an imported hook of the same name) silently
# replaces the first, which is how dynamo's release went unrun at session end (issue 38).
@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    _LAUNCH_GUARD.uninstall()
    release_dynamo()  # tests/dynamo_teardown.py: no dynamo cleanup hook left to fire at interpreter teardown


@pytest.hookimpl(trylast=True)  # after `-k`/`-m` deselect: the slices are of what runs
def pytest_collection_modifyitems(config, items):
    # tests/scheduling.py: the slow groups first, one per worker's slice, then the other launching
    # tests, then the quick ones (xdist's workers collect; each is told how many there are)
    items[:] = ordered(items, getattr(config, "workerinput", {}).get("workercount", 1),
                       slow=lambda item: item.get_closest_marker(MARKER) is not None)


def pytest_runtest_setup(item):
    why = misplaced(item)  # tests/launch_guard.py: launching tests live in tests/e2e/, and only they
    if why:
        pytest.fail(why, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _LAUNCH_GUARD.current = item  # its setup (fixtures' launches included), call and teardown
    yield
    _LAUNCH_GUARD.current = None


@pytest.fixture(scope="session")
def divergence_runs(shared_once):
    """samples/inspect_divergence.py's reference and planted-fault candidate stores (4 ranks, 5 steps),
    made once per test run (shared_once, below). Read them, never write them."""
    import importlib.util

    def make(folder):
        spec = importlib.util.spec_from_file_location("inspect_divergence", os.path.join(SAMPLES, "inspect_divergence.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return list(module.make_runs(str(folder)))

    return tuple(shared_once("divergence-runs", make)[1])


# A secret that must never appear in a store, a report or a log (the object-store tests grep for it).
S3_SECRET = "tracekit-s3-secret-7f3e9c1d"


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server (moto) on 127.0.0.1, one per test session, stopped at the end."""
    from tracekit.testing_s3 import MotoServer

    with MotoServer() as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """A fresh bucket on the loopback S3 server, with the AWS credential chain (environment variables,
    this test only) pointed at it. Returns an object with .url(key), .endpoint, .secret, .fs (s3fs)."""
    import re
    import uuid

    for k, v in s3_server.env(S3_SECRET).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TRACEKIT_STORAGE_OPTIONS", raising=False)
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:8]
    s3_server.make_bucket(name, S3_SECRET)

    class Bucket:
        bucket = name
        endpoint = s3_server.endpoint
        secret = S3_SECRET

        @staticmethod
        def url(key: str = "") -> str:
            return f"s3://{name}/{key}".rstrip("/")

        @property
        def fs(self):
            import s3fs

            return s3fs.S3FileSystem(endpoint_url=s3_server.endpoint, key="x", secret=S3_SECRET)

        def objects(self) -> dict[str, bytes]:
            """Every object in the bucket, by key."""
            fs = self.fs
            return {k: fs.cat_file(k) for k in fs.find(name)}

        def keys(self) -> set[str]:
            """The key of every object in the bucket (one listing; objects() GETs each one too)."""
            return set(self.fs.find(name))

    return Bucket()


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(written=0): a context inside which tracekit's file writes (store/io.py: store
    objects, metadata, users' output files) fail with ENOSPC, each after `written` bytes."""
    import contextlib
    import errno

    from tracekit.store import io as store_io

    real_write = store_io.os.write

    @contextlib.contextmanager
    def full(written: int = 0):
        def write(fd, data):
            if written:
                real_write(fd, bytes(memoryview(data)[:written]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with monkeypatch.context() as m:
            m.setattr(store_io.os, "write", write)
            yield

    return full


# Not only for launches: the golden diff reports' stores are built once through it too.
@pytest.fixture(scope="session")
def shared_once(tmp_path_factory):
    """shared_once(name, make) -> (folder, result): make(folder) runs once per test run, whichever
    pytest-xdist worker asks first (the others wait on a file lock); its JSON-able result is kept in
    the folder for them. For work several tests read, like a command sequence with launches."""
    root = shared_root(tmp_path_factory) / "shared-once"
    root.mkdir(exist_ok=True)

    def get(name: str, make):
        folder = root / name
        done = root / f"{name}.json"
        with FileLock(str(folder) + ".lock", timeout=4 * TORCHRUN_TIMEOUT):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a failed attempt of another worker
                folder.mkdir()
                done.write_text(json.dumps(make(folder)))
        return folder, json.loads(done.read_text())

    return get
