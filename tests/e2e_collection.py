"""One `pytest --collect-only` of tests/e2e per test run, shared by the two tests that read it
(whichever pytest-xdist worker asks first collects; conftest's `shared_once`): test_scheduling's
(the slow groups' prefixes name collected tests) and test_launch_guard's (the fast tier leaves out
all of tests/e2e). A collection imports torch and every e2e module: ~5 CPU-s, which each test used
to pay for its own.

It collects with `-m "(torchrun)"` (the parentheses: a bare ` torchrun` word on a command line is
what the launch guard takes for a launch), so the ids are the marked tests, and the summary says how
many were deselected, i.e. collected there without the mark."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.launch_guard import E2E, MARKER
from tests.paths import REPO


def e2e_collection(shared_once) -> dict:
    """{"returncode", "ids" (the node ids marked torchrun), "collected" (how many tests were
    collected in all, None if the summary line is missing), "deselected" (how many lacked the mark),
    "output" (the ends of stdout and stderr, for messages)}."""
    def make(folder):
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-m", f"({MARKER})", E2E], cwd=REPO, capture_output=True, text=True, timeout=120)
        ids = [line for line in out.stdout.splitlines() if "::" in line]
        # "134 tests collected in 3.2s", or "130/134 tests collected (4 deselected) in 3.2s"
        summary = re.search(r"^(?:(\d+)/)?(\d+) tests? collected(?: \((\d+) deselected\))?", out.stdout, re.M)
        return {"returncode": out.returncode, "ids": ids,
                "collected": int(summary.group(2)) if summary else None,
                "deselected": int(summary.group(3) or 0) if summary else None,
                "output": out.stdout[-2000:] + out.stderr[-2000:]}

    return shared_once("e2e-collection", make)[1]
