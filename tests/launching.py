"""Launching sample trainings under `tracekit record -- torchrun`: the settings every launching test
shares and the command they run. Used by tests/e2e/ (its conftest's fixtures record once per run)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import SAMPLES

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


def second_recording(recorded_sample, mode: str) -> str:
    """Another recording of the same job, from its own launch, for run-to-run comparisons: samples/plain's
    zero-code recording, which tests/e2e/recorders/test_zerocode_torchrun.py shows equal bit for bit to the
    explicit one (every rank's tensors and loss), so no launch is spent on it. It is the root-cause
    matrix's traced reference (tests/e2e/samples/traced_layouts.py), with more steps than the explicit
    recording's 3: compare them with allow_missing (--allow-missing)."""
    from tests.e2e.samples.traced_layouts import traced_reference

    return traced_reference(recorded_sample, mode)
