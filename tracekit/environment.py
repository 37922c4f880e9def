"""The facts about a run's environment that shape its numerics, captured for the store metadata."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import socket
import subprocess
import sys

# Environment variables that change what a run computes (compiler flags, math modes, collectives).
NUMERIC_ENV_PREFIXES = (
    "NEURON_", "TORCH_NEURONX_", "XLA_", "NCCL_", "CUDA_", "CUBLAS_", "CUDNN_", "TORCH_", "TORCHINDUCTOR_",
    "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_",
)
NUMERIC_ENV_NAMES = ("CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MASTER_ADDR", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_MODULE_OF = {"torch-neuronx": "torch_neuronx", "neuronx-cc": "neuronxcc"}
_VERSIONED = ("torch", "numpy", "zarr", "xarray", "torch-neuronx", "neuronx-cc", "tracekit")


def numeric_env(environ=None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in sorted(environ.items())
        if (k.startswith(NUMERIC_ENV_PREFIXES) or k in NUMERIC_ENV_NAMES) and not k.startswith("TRACEKIT_")
    }


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            # Neuron SDK builds are often installed without pip metadata: ask the module, if loaded.
            module = sys.modules.get(_MODULE_OF.get(name, ""))
            if getattr(module, "__version__", None):
                out[name] = str(module.__version__)
    return out


def git_commit(path: str | None) -> str | None:
    """The HEAD commit of the repository holding path, or None (no git, not a repo, timeout)."""
    if not path:
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        out = subprocess.run(
            ["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def script_of(command: list[str]) -> str | None:
    """The training script a command runs (the first argument ending in .py), if any."""
    return next((a for a in command if a.endswith(".py") and os.path.exists(a)), None)


def run_environment(command: list[str] | None = None) -> dict:
    """Everything run-level the launcher knows before any rank starts."""
    command = list(command if command is not None else sys.argv)
    script = script_of(command)
    return {
        "command": command,
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "versions": package_versions(),
        "env": numeric_env(),
        "git_commit": git_commit(script),
        "script": script,
    }
