"""The zero-code bootstrap as Python runs it: a sitecustomize on PYTHONPATH, in real processes."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tracekit.launch import bootstrap_env as be

SITECUSTOMIZE = os.path.join(be.BOOTSTRAP_DIR, "sitecustomize.py")


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
