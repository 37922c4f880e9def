"""The reference workloads in samples/ under torchrun (in-process: tests/samples/test_workloads.py).

The torchrun tests read the output of samples/plain/train.py (no tracekit import) run once per
mode, 2 ranks (simplefsdp_tp as a 2 x 2 mesh, compiled with aot_eager), 8 steps: the zero-code
recordings that tests/e2e/recorders/test_zerocode_torchrun.py proves bitwise equal to the explicit
ones and the root-cause matrix traces (tests/e2e/samples/traced_layouts.py, shared by the whole test
run), so checking the training itself costs no extra launch. Two processes without tracekit or
torchrun stay (a world of one started with torchrun's environment): the world-size check and the
refused no-op step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.samples.traced_layouts import STEPS, plain_run
from tests.launching import MODE_RANKS
from tests.paths import REPO, SAMPLES

PLAIN = Path(SAMPLES) / "plain" / "train.py"


TIMEOUT_S = 240  # a hung collective becomes a test failure, never a stuck CI


# mode -> (ranks, steps, expected local shapes of the weights at that world size); the ranks and
# flags are tests/launching.py's MODE_RANKS and mode_args
RUNS = {
    "ddp": (2, STEPS, {"0.weight": "256x128", "2.weight": "128x256"}),
    "fsdp": (2, STEPS, {"0.weight": "128x128", "2.weight": "64x256"}),  # (256/N, 128), (128/N, 256)
    "tp": (2, STEPS, {"0.weight": "128x128", "2.weight": "128x128"}),  # (256/N, 128), (128, 256/N)
    # (dp, tp) = (2, 2): (256/tp, 128/dp) and (128/dp, 256/tp)
    "simplefsdp_tp": (4, STEPS, {"0.weight": "128x64", "2.weight": "64x128"}),
}


STEP_LINE = re.compile(r"^step=(\d+)/(\d+) training=completed rank=(\d+) loss=(\S+)$", re.M)


def launch(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """Run cmd in its own process group; on timeout kill that whole group (torchrun and its workers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("TRACEKIT_STORE", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {TIMEOUT_S}s: {' '.join(cmd)}\n{out[-2000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_mode(recorded_sample, mode: str) -> subprocess.CompletedProcess:
    """samples/plain/train.py's run of `mode` (recorded zero-code; its stdout is the script's own)."""
    ranks, steps, _ = RUNS[mode]
    assert MODE_RANKS[mode] == ranks
    assert steps == STEPS
    return plain_run(recorded_sample, mode)[1]


def losses_by_rank(stdout: str) -> dict[int, list[float]]:
    by_rank: dict[int, list[float]] = {}
    for step, _, rank, loss in STEP_LINE.findall(stdout):
        by_rank.setdefault(int(rank), []).append(float(loss))
        assert len(by_rank[int(rank)]) == int(step), f"rank {rank} printed step {step} out of order"
    return by_rank


def test_expected_world_size_mismatch_fails_before_any_collective():
    # torchrun's environment for one worker; the check runs before the process group starts.
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = launch([sys.executable, str(PLAIN), "--parallelism", "ddp", "--expected-world-size", "2"], env)
    assert result.returncode == 1
    assert "expected world size 2 (--expected-world-size) but torchrun started 1 ranks" in result.stderr
    assert "Traceback" not in result.stderr and "training=completed" not in result.stdout


@pytest.mark.parametrize("mode", list(RUNS))
def test_mode_trains_on_every_rank(recorded_sample, mode):
    ranks, steps, shapes = RUNS[mode]
    result = run_mode(recorded_sample, mode)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in range(ranks):
        assert f"PASS rank={rank} mode={mode} world_size={ranks}" in result.stdout
        shape_line = re.search(rf"^local_shapes rank={rank} (.*)$", result.stdout, re.M)
        assert shape_line, result.stdout
        printed = dict(item.split("=") for item in shape_line.group(1).split())
        assert {name: printed[name] for name in shapes} == shapes
    losses = losses_by_rank(result.stdout)
    assert sorted(losses) == list(range(ranks))
    assert all(len(rank_losses) == steps for rank_losses in losses.values())
    assert all(f"step={k}/{steps} training=completed" in result.stdout for k in range(1, steps + 1))
    # the reported loss is the global one: the same on every rank, and finite
    assert all(losses[r] == losses[0] for r in losses)
    assert all(0 < loss < 10 for loss in losses[0])


def test_eager_modes_follow_the_same_loss_trajectory(recorded_sample):
    common = min(RUNS[m][1] for m in ("ddp", "fsdp", "tp"))
    trajectories = {m: losses_by_rank(run_mode(recorded_sample, m).stdout)[0][:common] for m in ("ddp", "fsdp", "tp")}
    assert all(len(t) == common for t in trajectories.values()), trajectories
    for mode in ("fsdp", "tp"):
        torch.testing.assert_close(torch.tensor(trajectories[mode]), torch.tensor(trajectories["ddp"]),
                                   rtol=1e-5, atol=0, msg=lambda m, mode=mode: f"{mode} vs ddp: {m}")


def test_a_step_that_changes_nothing_fails_loudly():
    # a world of one started as torchrun starts a worker, without torchrun's agent (the check is the
    # loop's); port 0: the store of a world of one takes any free port, no peer looks for it
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    result = launch([sys.executable, str(PLAIN), "--parallelism", "ddp", "--steps", "2", "--fault", "lr_scale=0"], env)
    assert result.returncode != 0
    assert "ERROR rank=0 mode=ddp: step 1: the optimizer step changed no parameter on any rank" in result.stderr
    assert "PASS" not in result.stdout
