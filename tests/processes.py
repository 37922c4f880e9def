"""Running a Python child in a clean environment: no TRACEKIT_* variables, RANK or PYTHONPATH of the caller."""

import os
import subprocess
import sys


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_") and k not in ("RANK", "PYTHONPATH")}
    env.update(extra)
    return env


def run_python(args, env, cwd=None, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
