"""The launcher (tracekit.launch) and the writer process (tracekit.writer) run without torch and
without tracekit.recorders (what runs inside a training rank): every module of theirs, and
`tracekit record`'s command, import with both blocked."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A finder first on sys.meta_path that refuses the blocked names, as an environment without them would.
BLOCKER = """
import importlib, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch' or name.startswith('tracekit.recorders'):
            raise ModuleNotFoundError(f'blocked: {name}')
sys.meta_path.insert(0, Blocked())
for name in sys.argv[1:]:
    importlib.import_module(name)
print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('tracekit.recorders')))
"""


def _modules(package: str) -> list[str]:
    folder = os.path.join(REPO, *package.split("."))
    return [package] + [f"{package}.{f[:-3]}" for f in sorted(os.listdir(folder)) if f.endswith(".py") and f != "__init__.py"]


def _import_blocked(modules: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER, *modules], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("package", ["tracekit.launch", "tracekit.writer"])
def test_process_packages_import_without_torch_or_recorders(package):
    modules = _modules(package)
    assert len(modules) > 3  # the listing found the package's modules
    out = _import_blocked(modules)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_record_command_and_the_launch_entry_point_import_without_torch():
    out = _import_blocked(["tracekit.cli.record", "tracekit.launch.launcher"])
    assert out.returncode == 0, out.stderr[-3000:]
    from tracekit import launch

    assert callable(launch.record_job) and launch.MAX_NICE >= launch.DEFAULT_WRITER_NICE


def test_the_blocker_blocks():
    # the check above could pass with a finder that blocks nothing
    out = _import_blocked(["tracekit.recorders.replay"])
    assert out.returncode != 0 and "blocked:" in out.stderr


def test_a_training_rank_starts_without_zarr():
    """Every rank of a recorded job imports tracekit.recorders.zerocode at `import torch`; zarr
    (~0.2 s of CPU per process, paid by every rank of every launch) loads only where a store is
    created or read: the launcher, the writer process, a replaying rank's Replay.open."""
    code = ("import sys, torch; from tracekit.recorders import zerocode; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('zarr', 'numcodecs', 'xarray')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
