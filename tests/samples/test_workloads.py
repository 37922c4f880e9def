"""The reference workloads in samples/: data, model and flags in-process; each mode under torchrun.

The torchrun tests read the output of samples/plain/train.py (no tracekit import) run once per
mode, 2 ranks (simplefsdp_tp as a 2 x 2 mesh, compiled with aot_eager), 3 steps: the zero-code
recordings that tests/recorders/test_zerocode_torchrun.py proves bitwise equal to the explicit
ones (conftest's `recorded_sample`, shared by the whole test run), so checking the training itself
costs no extra launch. One launch without tracekit at all stays: the refused no-op step.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
PLAIN = SAMPLES / "plain" / "train.py"
TUTORIAL = SAMPLES / "tutorial" / "train.py"

# The package is imported as samples.common here (the scripts import it as `common`).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from samples.common.config import parse_config  # noqa: E402
from samples.common.data import GLOBAL_BATCH, batch_slice, global_batch  # noqa: E402
from samples.common.faults import Faults, parse_faults  # noqa: E402
from samples.common.model import build_model  # noqa: E402

from tests.conftest import MODE_RANKS, PLAIN_RECORD_ARGS  # noqa: E402

TIMEOUT_S = 240  # a hung collective becomes a test failure, never a stuck CI

# mode -> (ranks, steps, expected local shapes of the weights at that world size); the ranks and
# flags are conftest's MODE_RANKS and mode_args
RUNS = {
    "ddp": (2, 3, {"0.weight": "256x128", "2.weight": "128x256"}),
    "fsdp": (2, 3, {"0.weight": "128x128", "2.weight": "64x256"}),  # (256/N, 128), (128/N, 256)
    "tp": (2, 3, {"0.weight": "128x128", "2.weight": "128x128"}),  # (256/N, 128), (128, 256/N)
    # (dp, tp) = (2, 2): (256/tp, 128/dp) and (128/dp, 256/tp)
    "simplefsdp_tp": (4, 3, {"0.weight": "128x64", "2.weight": "64x128"}),
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


def torchrun(ranks: int, script: Path, args: list[str]) -> subprocess.CompletedProcess:
    return launch([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   str(script), *args])


def run_mode(recorded_sample, mode: str) -> subprocess.CompletedProcess:
    """samples/plain/train.py's run of `mode` (recorded zero-code; its stdout is the script's own)."""
    ranks, steps, _ = RUNS[mode]
    assert MODE_RANKS[mode] == ranks
    return recorded_sample(mode, script="plain", steps=steps, record_args=PLAIN_RECORD_ARGS.get(mode, ()))[1]


def losses_by_rank(stdout: str) -> dict[int, list[float]]:
    by_rank: dict[int, list[float]] = {}
    for step, _, rank, loss in STEP_LINE.findall(stdout):
        by_rank.setdefault(int(rank), []).append(float(loss))
        assert len(by_rank[int(rank)]) == int(step), f"rank {rank} printed step {step} out of order"
    return by_rank


# ---------------------------------------------------------------- in-process: data, model, flags


def test_global_batch_is_a_pure_function_of_the_step():
    x1, y1 = global_batch(3)
    x2, y2 = global_batch(3)
    assert x1.shape == (GLOBAL_BATCH, 128) and y1.shape == (GLOBAL_BATCH, 128)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x4, _ = global_batch(4)
    assert not torch.equal(x1, x4)
    # drawing it must not consume the global RNG (the model's init comes from torch.manual_seed)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    global_batch(1)
    assert torch.equal(torch.rand(3), expected)


def test_float64_data_and_model_are_the_float32_ones_promoted():
    x32, y32 = global_batch(2)
    x64, y64 = global_batch(2, torch.float64)
    assert x64.dtype == torch.float64 and torch.equal(x64, x32.double()) and torch.equal(y64, y32.double())
    m32, m64 = build_model(0), build_model(0, torch.float64)
    for (name, p32), (_, p64) in zip(m32.named_parameters(), m64.named_parameters()):
        assert p64.dtype == torch.float64 and torch.equal(p64, p32.double()), name


def test_model_is_seeded_and_the_bias_free_variant_has_only_weights():
    a, b, c = build_model(0), build_model(0), build_model(1)
    assert [n for n, _ in a.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[0].weight, c[0].weight)
    bias_free = build_model(0, bias=False)
    shapes = {n: tuple(p.shape) for n, p in bias_free.named_parameters()}
    assert shapes == {"0.weight": (256, 128), "2.weight": (128, 256)}
    assert torch.equal(bias_free[0].weight, a[0].weight)  # same seed, same first draw


def test_batch_slices_partition_the_batch_in_rank_order():
    x, _ = global_batch(1)
    parts = [batch_slice(x, i, 4) for i in range(4)]
    assert all(p.shape == (128, 128) for p in parts)
    assert torch.equal(torch.cat(parts), x)
    with pytest.raises(ValueError, match="does not split into 3"):
        batch_slice(x, 0, 3)


def test_fault_specs_parse_and_bad_ones_are_refused():
    faults = parse_faults(["lr_scale=1.01", "loss_scale=1:3:2.5", "nan_grad=0:2", "reported_loss_scale=4:10"])
    assert faults.lr_scale == pytest.approx(1.01)
    assert faults.local_loss_factor(1, 3) == 2.5 and faults.local_loss_factor(0, 3) == 1.0
    assert faults.wants_nan_grad(0, 2) and not faults.wants_nan_grad(1, 2)
    assert faults.reported_loss_factor(4) == 10 and faults.reported_loss_factor(3) == 1.0
    opt = parse_faults(["opt_lr=1:3:1.5"])
    assert opt.last_param_lr_factor(1, 3) == 1.5 and opt.last_param_lr_factor(0, 3) == 1.0 and opt.any
    assert parse_faults([]) == Faults() and not Faults().any
    shapes = parse_faults(["stale_grad=2", "swap_data=3"])  # the exact-match shapes' faults (issue 35)
    assert shapes.stale_grad == {2} and shapes.swap_data == {3} and shapes.any
    for bad, message in [("bogus=1", "unknown fault"), ("lr_scale", "NAME=VALUE"), ("loss_scale=1:2", "N:N:F"),
                         ("nan_grad=a:1", "not made of numbers"), ("nan_grad=-1:1", "non-negative"),
                         ("stale_grad=1:2", "expected N after")]:
        with pytest.raises(ValueError, match=message):
            parse_faults([bad])


def test_config_defaults_and_refusals(capsys):
    config = parse_config(["--parallelism", "simplefsdp_tp"])
    assert (config.device, config.backend, config.steps, config.seed, config.lr) == ("cpu", "gloo", 10, 0, 0.01)
    assert (config.tp, config.compile_backend, config.dtype) == (2, "aot_eager", "float32")
    assert config.run_info()["mode"] == "simplefsdp_tp"
    assert parse_config(["--parallelism", "simplefsdp_tp", "--device", "cuda"]).compile_backend == "inductor"
    assert parse_config(["--parallelism", "simplefsdp_tp", "--compile-backend", "none"]).compile_backend is None
    assert parse_config(["--parallelism", "ddp"]).compile_backend is None
    for argv, message in [(["--parallelism", "ddp", "--tp", "2"], "--tp applies to simplefsdp_tp only"),
                          (["--parallelism", "tp", "--compile-backend", "inductor"], "--compile-backend applies"),
                          (["--parallelism", "ddp", "--steps", "0"], "--steps must be at least 1"),
                          (["--parallelism", "ddp", "--backend", "nccl"], "--backend nccl cannot run --device cpu"),
                          (["--parallelism", "ddp", "--fault", "oops=1"], "unknown fault")]:
        with pytest.raises(SystemExit) as exit_info:
            parse_config(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_plain_workload_and_shared_code_never_import_tracekit():
    for path in [PLAIN, *sorted((SAMPLES / "common").glob("*.py"))]:
        assert not {n for n in _imports(path) if n.split(".")[0] == "tracekit"}, path
    assert "tracekit.recorders" in _imports(TUTORIAL)


@pytest.mark.torchrun
def test_expected_world_size_mismatch_fails_before_any_collective():
    # torchrun's environment for one worker; the check runs before the process group starts.
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = launch([sys.executable, str(PLAIN), "--parallelism", "ddp", "--expected-world-size", "2"], env)
    assert result.returncode == 1
    assert "expected world size 2 (--expected-world-size) but torchrun started 1 ranks" in result.stderr
    assert "Traceback" not in result.stderr and "training=completed" not in result.stdout


# ---------------------------------------------------------------- torchrun: every mode end to end


@pytest.mark.torchrun
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


@pytest.mark.torchrun
def test_eager_modes_follow_the_same_loss_trajectory(recorded_sample):
    common = min(RUNS[m][1] for m in ("ddp", "fsdp", "tp"))
    trajectories = {m: losses_by_rank(run_mode(recorded_sample, m).stdout)[0][:common] for m in ("ddp", "fsdp", "tp")}
    assert all(len(t) == common for t in trajectories.values()), trajectories
    for mode in ("fsdp", "tp"):
        torch.testing.assert_close(torch.tensor(trajectories[mode]), torch.tensor(trajectories["ddp"]),
                                   rtol=1e-5, atol=0, msg=lambda m, mode=mode: f"{mode} vs ddp: {m}")


@pytest.mark.torchrun
def test_a_step_that_changes_nothing_fails_loudly():
    result = torchrun(1, PLAIN, ["--parallelism", "ddp", "--steps", "2", "--fault", "lr_scale=0"])
    assert result.returncode != 0
    assert "ERROR rank=0 mode=ddp: step 1: the optimizer step changed no parameter on any rank" in result.stderr
    assert "PASS" not in result.stdout
