"""The zero-code bootstrap as Python runs it: a sitecustomize on PYTHONPATH, in real processes."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tracekit import open_store
from tracekit.launch import bootstrap_env as be
from tests.paths import REPO

SITECUSTOMIZE = os.path.join(be.BOOTSTRAP_DIR, "sitecustomize.py")

# A training script that never imports tracekit (a world of one: no torchrun).
PLAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        x = torch.randn(5, 4)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print("trained", flush=True)
""")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_") and k not in ("RANK", "PYTHONPATH")}
    env.update(extra)
    return env


def run_python(args, env, cwd=None, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


@pytest.fixture
def user_site(tmp_path):
    """A folder holding the user's own sitecustomize, which must still run behind ours."""
    folder = tmp_path / "user_site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    return str(folder)


PROBE = ("import os, sys, sitecustomize; print(os.environ.get('USER_SITECUSTOMIZE'), sitecustomize.__file__, "
         "type(sys.meta_path[0]).__name__, 'torch' in sys.modules, 'tracekit' in sys.modules)")


def test_existing_sitecustomize_still_runs_and_nothing_heavy_is_imported(user_site, tmp_path):
    env = clean_env(PYTHONPATH=os.pathsep.join([be.BOOTSTRAP_DIR, user_site]), TRACEKIT_BOOTSTRAP="1",
                    TRACEKIT_STORE=str(tmp_path / "s"))
    result = run_python(["-c", PROBE], env)
    assert result.returncode == 0, result.stderr
    ran, module_file, first_finder, torch_loaded, tracekit_loaded = result.stdout.split()
    assert ran == "ran" and module_file == os.path.join(user_site, "sitecustomize.py")
    assert first_finder == "_AfterTorchImport"  # waits for `import torch`, imports nothing itself
    assert torch_loaded == tracekit_loaded == "False"


def test_bootstrap_without_its_settings_only_chains(user_site):
    result = run_python(["-c", PROBE], clean_env(PYTHONPATH=os.pathsep.join([be.BOOTSTRAP_DIR, user_site])))
    assert result.returncode == 0, result.stderr
    ran, _, first_finder, _, _ = result.stdout.split()
    assert ran == "ran" and first_finder != "_AfterTorchImport"


def test_torchrun_agent_is_left_alone():
    spec = importlib.util.spec_from_file_location("tracekit_bootstrap_probe", SITECUSTOMIZE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    agent = module._is_torchrun_agent
    assert agent(["python", "/venv/bin/torchrun", "--nproc-per-node=2", "train.py"])
    assert agent(["python", "-m", "torch.distributed.run", "--standalone", "train.py"])
    assert not agent(["python", "-u", "train.py", "--parallelism", "ddp"])
    assert not agent(["python", "-m", "mypackage.train"])


def test_launcher_env_prepends_the_bootstrap_and_names_match_the_bootstrap():
    env = be.bootstrap_env({"PYTHONPATH": os.pathsep.join(["/a", be.BOOTSTRAP_DIR, "/b"])}, strict=True,
                           optimizer="Adam")
    assert env["PYTHONPATH"].split(os.pathsep) == [be.BOOTSTRAP_DIR, "/a", "/b"]
    assert env[be.ENV_STRICT] == "1" and env[be.ENV_OPTIMIZER] == "Adam" and env[be.ENV_BOOTSTRAP] == "1"
    assert env[be.ENV_LAUNCHER_PID] == str(os.getpid())
    text = open(SITECUSTOMIZE).read()  # the bootstrap spells the names out (it cannot import tracekit)
    for name in (be.ENV_BOOTSTRAP, be.ENV_STRICT):
        assert f'"{name}"' in text
    assert os.listdir(be.BOOTSTRAP_DIR) in (["sitecustomize.py"], ["sitecustomize.py", "__pycache__"],
                                           ["__pycache__", "sitecustomize.py"])


@pytest.mark.torchrun
@pytest.mark.parametrize("zero_code", [True, False])
def test_record_passes_the_bootstrap_unless_told_not_to(tmp_path, zero_code):
    probe = "import os; print(os.environ.get('TRACEKIT_BOOTSTRAP'), os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    flag = "--zero-code" if zero_code else "--no-zero-code"
    result = run_python(["-m", "tracekit.cli.main", "record", "-o", str(tmp_path / "s"), flag, "--",
                         sys.executable, "-c", probe], clean_env(PYTHONPATH="/x"), cwd=REPO)
    # the probe trains nothing: record says so and exits 2 (a successful command with an empty store)
    assert result.returncode == 2 and "Error: nothing was recorded" in result.stderr, result.stderr
    assert result.stdout.split() == (["1", be.BOOTSTRAP_DIR] if zero_code else ["None", "/x"])


@pytest.mark.torchrun
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


@pytest.mark.torchrun
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


@pytest.mark.torchrun
@pytest.mark.parametrize("strict", [False, True])
def test_bootstrap_that_cannot_load_tracekit_says_so_once_or_fails_when_strict(tmp_path, strict):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    broken = tmp_path / "broken" / "tracekit"  # found before any installed tracekit
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('broken tracekit')\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([be.BOOTSTRAP_DIR, str(broken.parent)]), TRACEKIT_BOOTSTRAP="1",
                    TRACEKIT_STORE=str(tmp_path / "s"), TRACEKIT_STRICT="1" if strict else "0")
    result = run_python([str(script)], env, cwd=str(tmp_path))
    if strict:
        assert result.returncode != 0 and "trained" not in result.stdout
        assert "ImportError: broken tracekit" in result.stderr
    else:
        assert result.returncode == 0 and "trained" in result.stdout, result.stderr
        assert result.stderr.count("tracekit: zero-code recording is off") == 1, result.stderr
        assert "broken tracekit" in result.stderr and "Traceback" not in result.stderr
