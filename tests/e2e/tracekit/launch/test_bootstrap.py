"""The zero-code bootstrap as Python runs it: a sitecustomize on PYTHONPATH, in real processes."""

import os
import sys
import textwrap

import numpy as np
import pytest

from tracekit import open_store
from tracekit.launch import bootstrap_env as be
from tests.paths import CLI_SCRIPTS, REPO
from tests.processes import clean_env, run_python


# A training script that never imports tracekit (a world of one: no torchrun). Its optimizer is
# tests/cli/scripts/lean_sgd.py's (torch.optim.SGD's update, a torch.optim.Optimizer that never
# imports torch._dynamo, ~1.4 CPU-s of the rank): zero-code recording hooks its step() as it hooks
# SGD's; torch's own optimizers recorded zero-code are the samples' (tests/e2e/samples/).
PLAIN = textwrap.dedent("""
    import sys
    import torch
    sys.path.insert(0, %r)
    from lean_sgd import LeanSGD
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = LeanSGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        x = torch.randn(5, 4)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print("trained", flush=True)
""") % CLI_SCRIPTS


@pytest.mark.parametrize("zero_code", [True, False])
def test_record_passes_the_bootstrap_unless_told_not_to(tmp_path, zero_code):
    probe = "import os; print(os.environ.get('TRACEKIT_BOOTSTRAP'), os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    flag = "--zero-code" if zero_code else "--no-zero-code"
    result = run_python(["-m", "tracekit.cli.main", "record", "-o", str(tmp_path / "s"), flag, "--",
                         sys.executable, "-c", probe], clean_env(PYTHONPATH="/x"), cwd=REPO)
    # the probe trains nothing: record says so and exits 2 (a successful command with an empty store)
    assert result.returncode == 2 and "Error: nothing was recorded" in result.stderr, result.stderr
    assert result.stdout.split() == (["1", be.BOOTSTRAP_DIR] if zero_code else ["None", "/x"])


def test_record_without_torchrun_records_a_world_of_one(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    store = str(tmp_path / "s")
    result = run_python(["-m", "tracekit.cli.main", "record", "-o", store, "--", sys.executable, str(script)],
                        clean_env(), cwd=REPO)
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert "tracekit:" not in result.stderr
    s = open_store(store)
    view = s.rank(0)
    assert s.ranks == [0] and view.coords["world_size"] == 1 and view.completed_steps == [1, 2, 3]
    assert view.attrs["run"]["recorded_by"] == "zero-code" and view.attrs["run"]["model"] == "Sequential"
    assert [t.name for t in view.tensors("gradients")] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for step in (1, 2, 3):
        after, before = view.read_kind("parameters", step), view.read_kind("parameters", step - 1)
        for name, delta in view.read_kind("deltas", step).items():
            assert np.array_equal(delta, after[name] - before[name])
        assert view.read("outputs", step, "output").shape == (5, 2)


def test_instrumentation_failure_is_reported_once_and_the_job_goes_on(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    not_a_store = tmp_path / "file"
    not_a_store.write_text("a file where the store should be")
    env = clean_env(PYTHONPATH=be.BOOTSTRAP_DIR, TRACEKIT_BOOTSTRAP="1", TRACEKIT_STORE=str(not_a_store),
                    TRACEKIT_LAUNCHER_PID=str(os.getpid()))
    result = run_python([str(script)], env, cwd=str(tmp_path))
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert result.stderr.count("tracekit: zero-code recording failed on rank 0") == 1, result.stderr
    assert "Traceback" not in result.stderr


# The bootstrap loads tracekit when the program's `import torch` finishes: a script that imports torch
# and then runs on (no optimizer: torch's dynamo, imported by every optimizer, is not paid for)
IMPORTS_TORCH = "import torch\nprint('ran', int(torch.ones(3).sum()), flush=True)\n"


@pytest.mark.parametrize("strict", [False, True])
def test_bootstrap_that_cannot_load_tracekit_says_so_once_or_fails_when_strict(tmp_path, strict):
    script = tmp_path / "imports_torch.py"
    script.write_text(IMPORTS_TORCH)
    broken = tmp_path / "broken" / "tracekit"  # found before any installed tracekit
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('broken tracekit')\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([be.BOOTSTRAP_DIR, str(broken.parent)]), TRACEKIT_BOOTSTRAP="1",
                    TRACEKIT_STORE=str(tmp_path / "s"), TRACEKIT_STRICT="1" if strict else "0")
    result = run_python([str(script)], env, cwd=str(tmp_path))
    if strict:
        assert result.returncode != 0 and "ran" not in result.stdout
        assert "ImportError: broken tracekit" in result.stderr
    else:
        assert result.returncode == 0 and result.stdout == "ran 3\n", result.stderr
        assert result.stderr.count("tracekit: zero-code recording is off") == 1, result.stderr
        assert "broken tracekit" in result.stderr and "Traceback" not in result.stderr
