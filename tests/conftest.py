"""Shared fixtures. `recorded_sample` records a reference workload once per test run.

Real torchrun runs cost ~15-20 s each on the 2-core CI machine, so every test that needs a store
of a sample mode asks this fixture, and the same (script, mode, ranks, extra args) is recorded
only once per test run, whichever pytest-xdist worker asks first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.dynamo_teardown import release_dynamo
from filelock import FileLock

from tests.launch_guard import Guard
from tests.paths import REPO, SAMPLES  # noqa: F401  (REPO: tests import it from here)

# Sample modes and the world size the tests run them at (simplefsdp_tp as a 2 x 2 mesh).
MODE_RANKS = {"ddp": 2, "fsdp": 2, "tp": 2, "simplefsdp_tp": 4}
# samples/plain's zero-code recordings: simplefsdp_tp divides each rank's loss by the dp degree
# before backward() (its gradient reduction sums), so its global loss is the dp ranks' sum. Every
# test recording plain asks with these arguments, so one recording serves them all.
PLAIN_RECORD_ARGS = {"simplefsdp_tp": ("--loss-reduction", "sum")}
TORCHRUN_TIMEOUT = 300  # a hang becomes a failure, never a stuck CI
# recorded_sample("ddp", **FOUR_RANK_DDP): samples/plain at 4 ranks, 10 steps, with local_loss; the
# zero-code loss test needs it, and the 2-vs-4-ranks verdict test reuses it (no launch of its own)
FOUR_RANK_DDP = dict(script="plain", steps=10, ranks=4, record_args=("--kinds", "+local_loss"))


_LAUNCH_GUARD = Guard()


def pytest_configure(config):
    _LAUNCH_GUARD.install()  # tests/launch_guard.py: an unmarked test that launches workers fails


# One pytest_unconfigure per module: a second `def` (or an imported hook of the same name) silently
# replaces the first, which is how dynamo's release went unrun at session end (issue 38).
@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    _LAUNCH_GUARD.uninstall()
    release_dynamo()  # tests/dynamo_teardown.py: no dynamo cleanup hook left to fire at interpreter teardown


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _LAUNCH_GUARD.current = item  # its setup (fixtures' launches included), call and teardown
    yield
    _LAUNCH_GUARD.current = None


def mode_args(mode: str) -> list[str]:
    args = ["--parallelism", mode, "--device", "cpu", "--backend", "gloo"]
    if mode == "simplefsdp_tp":
        args += ["--tp", "2", "--compile-backend", "aot_eager"]
    return args


def run_recorded(store: str, script: str, mode: str, ranks: int | None = None, extra=(), record_args=()):
    """`tracekit record -o store -- torchrun ... samples/<script>/train.py <mode args> <extra>`."""
    ranks = ranks or MODE_RANKS[mode]
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "--force", "-o", store, *record_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           os.path.join(SAMPLES, script, "train.py"), *mode_args(mode), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT, env=env)
    if result.returncode != 0:
        raise AssertionError(f"recording failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-4000:]}")
    return result


def _shared_root(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the workers' basetemps' parent); without
    xdist, this process's own basetemp (the parent would be shared with earlier runs)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def recorded_sample(tmp_path_factory):
    """recorded_sample(mode, script="tutorial", steps=3, ranks=None, extra=(), tag="") -> (store path, result).

    Same arguments, same store: recorded once per test run and shared across tests and across
    pytest-xdist workers (the first worker to ask records under a file lock; the others wait for it
    and read the store and the command's output). Use `tag` to force a separate run.
    """
    root = _shared_root(tmp_path_factory) / "recorded-samples"
    root.mkdir(exist_ok=True)

    def get(mode: str, script: str = "tutorial", steps: int = 3, ranks: int | None = None, extra=(), tag: str = "",
            record_args=()):
        ranks = ranks or MODE_RANKS[mode]
        key = json.dumps([mode, script, steps, ranks, list(extra), tag, list(record_args)])
        folder = root / f"{script}-{mode}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        done = folder / "result.json"
        with FileLock(str(folder) + ".lock", timeout=2 * TORCHRUN_TIMEOUT):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a failed attempt of another worker
                result = run_recorded(str(folder / "store"), script, mode, ranks, ["--steps", str(steps), *extra],
                                      record_args)
                done.write_text(json.dumps({"key": key, "args": result.args, "returncode": result.returncode,
                                            "stdout": result.stdout, "stderr": result.stderr}))
        saved = json.loads(done.read_text())
        assert saved["key"] == key, (saved["key"], key)
        return str(folder / "store"), subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"],
                                                                  saved["stderr"])

    return get


@pytest.fixture(scope="session")
def shared_once(tmp_path_factory):
    """shared_once(name, make) -> (folder, result): make(folder) runs once per test run, whichever
    pytest-xdist worker asks first (the others wait on a file lock); its JSON-able result is kept in
    the folder for them. For work several tests read, like a command sequence with launches."""
    root = _shared_root(tmp_path_factory) / "shared-once"
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


def second_recording(recorded_sample, mode: str) -> str:
    """Another recording of the same job, from its own launch, for run-to-run comparisons: samples/plain's
    zero-code recording, which tests/e2e/recorders/test_zerocode_torchrun.py shows equal bit for bit to the
    explicit one (every rank's tensors and loss), so no launch is spent on it."""
    return recorded_sample(mode, script="plain", record_args=PLAIN_RECORD_ARGS.get(mode, ()))[0]


@pytest.fixture(scope="session")
def divergence_runs(tmp_path_factory):
    """samples/inspect_divergence.py's reference and planted-fault candidate stores (4 ranks, 5 steps)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("inspect_divergence", os.path.join(SAMPLES, "inspect_divergence.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_runs(str(tmp_path_factory.mktemp("divergence")))


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
