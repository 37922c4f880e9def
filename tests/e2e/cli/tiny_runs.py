"""One recording of tests/cli/scripts/tiny_train.py (a world of one) that several tests read instead
of each launching its own: `tracekit record --json -o S -- python tiny_train.py --steps 3
--exit-code 3`, recorded once per test run through conftest's `shared_once` (any xdist worker).
Tests that change a store copy it first."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import CLI_SCRIPTS

TINY = os.path.join(CLI_SCRIPTS, "tiny_train.py")
EXIT_CODE = 3  # the script's own exit status, which `tracekit record` passes on


def _shared(shared_once) -> dict:
    def make(folder) -> dict:
        store = str(folder / "s")
        cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "--json", "-o", store, "--", sys.executable, TINY,
               "--steps", "3", "--exit-code", str(EXIT_CODE)]
        modules = folder / "unused-modules.txt"  # what the rank loaded that it never needs
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                env={**os.environ, "TINY_MODULES_OUT": str(modules)})
        return {"args": cmd, "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
                "unused_modules": modules.read_text() if modules.exists() else None}

    folder, saved = shared_once("tiny-3-steps-exit-3", make)
    return {**saved, "store": str(folder / "s")}


def tiny_recording(shared_once) -> tuple[str, subprocess.CompletedProcess]:
    """(store, the `tracekit record` process's result) of the shared 3-step tiny recording."""
    saved = _shared(shared_once)
    return saved["store"], subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"],
                                                       saved["stderr"])


def tiny_rank_unused_modules(shared_once) -> str | None:
    """The modules the shared recording's rank loaded among those it never needs (tiny_train.py's
    UNUSED), space-separated; None if the rank never got to write them."""
    return _shared(shared_once)["unused_modules"]
