"""tests/e2e/: the tests that launch real workers (torchrun, `tracekit record -- COMMAND`, a training
script), mirrored inside by package. Every test here is marked `torchrun`, so the slow tier is this
folder (`pytest tests/e2e`) or the marker (`-m torchrun`), and the fast tier is `-m "not torchrun"`;
a `torchrun` mark outside this folder fails its test (tests/launch_guard.py).

Real torchrun runs cost ~15-20 s each on the 2-core CI machine, so every test that needs a store
of a sample mode asks `recorded_sample`, and the same (script, mode, ranks, extra args) is recorded
only once per test run, whichever pytest-xdist worker asks first.
"""

import hashlib
import json
import shutil
import subprocess

import pytest
from filelock import FileLock

from tests.launch_guard import MARKER, in_e2e
from tests.launching import MODE_RANKS, TORCHRUN_TIMEOUT, run_recorded
from tests.sharing import shared_root


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there when it reads them
def pytest_collection_modifyitems(items):
    for item in items:
        if in_e2e(item.path):
            item.add_marker(getattr(pytest.mark, MARKER))


@pytest.fixture(scope="session")
def recorded_sample(tmp_path_factory):
    """recorded_sample(mode, script="tutorial", steps=3, ranks=None, extra=(), tag="") -> (store path, result).

    Same arguments, same store: recorded once per test run and shared across tests and across
    pytest-xdist workers (the first worker to ask records under a file lock; the others wait for it
    and read the store and the command's output). Use `tag` to force a separate run.
    """
    root = shared_root(tmp_path_factory) / "recorded-samples"
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
