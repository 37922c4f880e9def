"""Shared fixtures. `recorded_sample` records a reference workload once per test session.

Real torchrun runs cost ~10-15 s each on the 2-core CI machine, so every test that needs a store
of a sample mode asks this fixture, and the same (script, mode, ranks, extra args) is recorded
only once per session.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(REPO, "samples")
# Sample modes and the world size the tests run them at (simplefsdp_tp as a 2 x 2 mesh).
MODE_RANKS = {"ddp": 2, "fsdp": 2, "tp": 2, "simplefsdp_tp": 4}
TORCHRUN_TIMEOUT = 300  # a hang becomes a failure, never a stuck CI


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


@pytest.fixture(scope="session")
def recorded_sample(tmp_path_factory):
    """recorded_sample(mode, script="tutorial", steps=3, ranks=None, extra=(), tag="") -> (store path, result).

    Same arguments, same store: record once, share across tests. Use `tag` to force a separate run.
    """
    cache: dict = {}

    def get(mode: str, script: str = "tutorial", steps: int = 3, ranks: int | None = None, extra=(), tag: str = "",
            record_args=()):
        key = (mode, script, steps, ranks, tuple(extra), tag, tuple(record_args))
        if key not in cache:
            store = str(tmp_path_factory.mktemp(f"{script}-{mode}") / "store")
            result = run_recorded(store, script, mode, ranks, ["--steps", str(steps), *extra], record_args)
            cache[key] = (store, result)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def divergence_runs(tmp_path_factory):
    """samples/inspect_divergence.py's reference and planted-fault candidate stores (4 ranks, 5 steps)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("inspect_divergence", os.path.join(SAMPLES, "inspect_divergence.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_runs(str(tmp_path_factory.mktemp("divergence")))
