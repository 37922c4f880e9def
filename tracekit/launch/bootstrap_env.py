"""The environment `tracekit record` gives its command so that scripts are recorded zero-code.

Like ddtrace-run and opentelemetry-instrument: settings travel in environment variables, and
bootstrap/ (holding only sitecustomize.py) goes first on PYTHONPATH, so every Python process of
the job runs it at startup. Kept free of torch: the launcher imports it.
"""

from __future__ import annotations

import os

from tracekit.errors import TracekitError

# Read by bootstrap/sitecustomize.py (which spells the names out: it cannot import tracekit) and
# by zerocode.py.
ENV_BOOTSTRAP = "TRACEKIT_BOOTSTRAP"  # "1": record zero-code
ENV_STRICT = "TRACEKIT_STRICT"  # "1": an instrumentation failure fails the job
ENV_LAUNCHER_PID = "TRACEKIT_LAUNCHER_PID"  # its own child (no torchrun) records as a world of one
ENV_OPTIMIZER = "TRACEKIT_OPTIMIZER"  # class name of the training optimizer, when the guess is wrong
ENV_MODEL = "TRACEKIT_MODEL"  # class name or attribute path of the root model, when the guess cannot decide
ENV_LOSS_REDUCTION = "TRACEKIT_LOSS_REDUCTION"  # mean or sum: how the dp ranks' local losses combine

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


def bootstrap_env(base: dict | None = None, strict: bool = False, optimizer: str | None = None,
                  model: str | None = None, loss_reduction: str | None = None) -> dict[str, str]:
    """The variables to add to `base` (default os.environ) for a zero-code recorded command."""
    base = os.environ if base is None else base
    if not os.path.isfile(os.path.join(BOOTSTRAP_DIR, "sitecustomize.py")):
        raise TracekitError(f"tracekit's zero-code bootstrap is missing ({BOOTSTRAP_DIR}): reinstall tracekit, "
                            "or record with --no-zero-code from a script that uses tracekit's Recorder")
    path = [BOOTSTRAP_DIR] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env = {
        "PYTHONPATH": os.pathsep.join(path),
        ENV_BOOTSTRAP: "1",
        ENV_STRICT: "1" if strict else "0",
        ENV_LAUNCHER_PID: str(os.getpid()),
    }
    if optimizer:
        env[ENV_OPTIMIZER] = optimizer
    if model:
        env[ENV_MODEL] = model
    if loss_reduction:
        env[ENV_LOSS_REDUCTION] = loss_reduction
    return env
