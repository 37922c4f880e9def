"""The reference workloads in samples/, in-process: data, model and flags. Each mode under torchrun
is tests/e2e/samples/test_workloads.py."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from tests import paths

SAMPLES = Path(paths.SAMPLES)
PLAIN = SAMPLES / "plain" / "train.py"
TUTORIAL = SAMPLES / "tutorial" / "train.py"

# The package is imported as samples.common here (the scripts import it as `common`).
if paths.REPO not in sys.path:
    sys.path.insert(0, paths.REPO)

from samples.common.config import parse_config  # noqa: E402
from samples.common.data import GLOBAL_BATCH, batch_slice, global_batch  # noqa: E402
from samples.common.faults import Faults, parse_faults  # noqa: E402
from samples.common.model import build_model  # noqa: E402



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
    # op faults: from a step on, or over a window; several when their steps do not overlap
    ops = parse_faults(["op=act:1:6:6", "op=bwd_bf16:1:7", "op=matmul_bf16:0:2:3"])
    assert ops.op == (("act", 1, 6, 6), ("bwd_bf16", 1, 7, None), ("matmul_bf16", 0, 2, 3)) and ops.any
    assert parse_faults(["op=act:1:3"]).op == (("act", 1, 3, None),)
    for bad, message in [("bogus=1", "unknown fault"), ("lr_scale", "NAME=VALUE"), ("loss_scale=1:2", "N:N:F"),
                         ("nan_grad=a:1", "not made of numbers"), ("nan_grad=-1:1", "non-negative"),
                         ("stale_grad=1:2", "expected N after"), ("op=act:1:3:2", "last step comes before"),
                         ("op=flip:1:3", "the op fault is one of")]:
        with pytest.raises(ValueError, match=message):
            parse_faults([bad])
    for overlapping in (["op=act:1:3", "op=bwd_bf16:0:5"], ["op=act:1:3:5", "op=bwd_bf16:1:5:6"],
                        ["op=act:1:4:4", "op=bwd_bf16:1:2"]):
        with pytest.raises(ValueError, match="overlap another op fault"):
            parse_faults(overlapping)



def test_op_faults_over_disjoint_windows_take_turns_on_one_module():
    """act over step 6 only, then bwd_bf16 from step 8 on, both on module 1 (the ReLU) of rank 1: each
    step's forward and backward are the one fault's whose window holds the step, or the ReLU's."""
    import torch.nn.functional as F

    from samples.common.op_faults import FaultSwitch, install_op_fault

    model = build_model(0)
    switches = [FaultSwitch("act", 1, 6, 6), FaultSwitch("bwd_bf16", 1, 8)]
    for switch in switches:
        install_op_fault(model, switch)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    relu_grad = grad * (x > 0)
    for rank, step, want_out, want_grad in [
        (1, 5, torch.relu(x), relu_grad),
        (1, 6, F.leaky_relu(x, 0.01), torch.where(x > 0, grad, 0.01 * grad)),
        (1, 7, torch.relu(x), relu_grad),
        (1, 8, torch.relu(x), relu_grad.bfloat16().float()),
        (1, 9, torch.relu(x), relu_grad.bfloat16().float()),
        (0, 6, torch.relu(x), relu_grad),
    ]:
        for switch in switches:
            switch.update(rank, step)
        leaf = x.clone().requires_grad_()
        out = model[1](leaf)
        out.backward(grad)
        assert torch.equal(out, want_out) and torch.equal(leaf.grad, want_grad), (rank, step)
    assert not torch.equal(relu_grad.bfloat16().float(), relu_grad)  # the rounding is visible

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


# ---------------------------------------------------------------- torchrun: every mode end to end


# ---------------------------------------------------------------- the end of a rank (common/quick_exit.py)

# a rank as the runners end it, in a plain interpreter: an exit handler registered after arm() (as the
# recorder's and torch's are) prints "handler"; an object still alive at teardown prints "teardown"
QUICK_EXIT_RANK = """
import atexit, sys
sys.path.insert(0, sys.argv[1])
from common import quick_exit
quick_exit.arm()
class Alive:
    def __del__(self):
        sys.stdout.write("teardown")
        sys.stdout.flush()
alive = Alive()
atexit.register(lambda: sys.stdout.write("handler "))
sys.stdout.write("trained ")  # left in the buffer: the rank's last output must not be lost
if sys.argv[2] == "raised":
    raise SystemExit(3)
sys.exit(quick_exit.ending(int(sys.argv[2])))
"""


def test_a_rank_whose_training_returned_ends_after_every_exit_handler_without_teardown():
    import subprocess

    def rank(how):
        return subprocess.run([sys.executable, "-c", QUICK_EXIT_RANK, str(SAMPLES), how], capture_output=True,
                              text=True, timeout=60)

    for code in (0, 1):  # the status the training returned (1: a WorkloadError's one line)
        ended = rank(str(code))
        assert (ended.returncode, ended.stdout, ended.stderr) == (code, "trained handler ", ""), ended
    # an exception, or sys.exit before the runner's end: Python's own exit, status and teardown included
    failed = rank("raised")
    assert (failed.returncode, failed.stdout) == (3, "trained handler teardown"), failed


@pytest.mark.parametrize("runner, first_torch_import", [
    ("plain/train.py", "from common.config import"),
    ("tutorial/train.py", "from common.config import"),
    ("replay/train.py", "import torch"),
    ("torchtitan/train.py", "import cpu_shim"),
])
def test_each_runner_arms_the_quick_exit_before_torch_and_ends_with_it(runner, first_torch_import):
    """arm() must come before anything registers an exit handler (torch, a recorder), or it would run
    before theirs; the end must say the status the training returned."""
    source = (SAMPLES / runner).read_text()
    assert source.index("quick_exit.arm()") < source.index(first_torch_import), runner
    assert "quick_exit.ending(" in source, runner
