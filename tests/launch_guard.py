"""The `torchrun` marker's guard: a test without the marker that starts training workers fails,
and so does a test marked `torchrun` outside tests/e2e/.

The tests that launch workers live in tests/e2e/, whose conftest marks every test there `torchrun`:
the slow tier is that folder or that marker. `-m "not torchrun"` is the fast tier only if every
test that launches workers is there.
Whether a test launches is decided where it happens, at process start (subprocess.Popen in the
tests' process, fixtures' setup included), not by reading the test's source: a launch through a
shared fixture or a helper is caught like a direct one. What counts as launching workers:
- torchrun (`torchrun`, `python -m torch.distributed.run`), also inside a `bash -c` line;
- `tracekit record ... -- COMMAND` as a process (`record --help` or a refusal before `--` is not);
- any command started by tracekit's launcher in the tests' own process (CliRunner's `record`).
Writer processes of an in-process Recorder are not: they are the recorder's own unit tests
(~100 tests of ~1 s), and leaving them out of the fast tier would leave the recorder untested there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

MARKER = "torchrun"
E2E = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e")
_LAUNCHER_MODULES = ("tracekit.launch.launcher",)  # tracekit record's launcher: whatever it starts is the job
_TORCHRUN = re.compile(r"(^|[\s/])torchrun(\s|$)|\btorch\.distributed\.run\b")
_RECORD = re.compile(r"(^|[\s/])tracekit(\.cli\.main)? record .*(^|\s)--(\s|$)")


def in_e2e(path) -> bool:
    """True for a file under tests/e2e/ (where every test is marked `torchrun`)."""
    return str(path).startswith(E2E + os.sep)


def misplaced(item) -> str | None:
    """Why a collected test is in the wrong tier's folder, or None: one marked `torchrun` by hand
    outside tests/e2e/ would be slow-tier only by a mark that nothing else keeps in step."""
    if item.get_closest_marker(MARKER) is not None and not in_e2e(item.path):
        return (f"{item.nodeid} is marked {MARKER} outside tests/e2e/: move it to the same path under "
                f"tests/e2e/ (whose conftest marks it), so the slow tier stays one folder")
    return None


def launches_workers(argv, caller_module: str = "") -> bool:
    """True if starting argv (from a function of caller_module) launches training workers."""
    if caller_module in _LAUNCHER_MODULES:
        return True
    line = argv if isinstance(argv, str) else " ".join(str(a) for a in argv)
    return bool(_TORCHRUN.search(line) or _RECORD.search(line))


class Guard:
    """Installed once per test process; `current` is the running test (None between tests)."""

    def __init__(self) -> None:
        self.current = None
        self._popen_init = subprocess.Popen.__init__

    def install(self) -> None:
        guard, real = self, self._popen_init

        def checked_init(popen, args, *a, **k):
            item = guard.current
            if item is not None and item.get_closest_marker(MARKER) is None:
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if launches_workers(args, caller):
                    raise AssertionError(
                        f"{item.nodeid} launches training workers ({str(args)[:200]}) but is not in tests/e2e/ "
                        f"(which marks it {MARKER}): move it there, so that -m 'not {MARKER}' stays the fast tier")
            return real(popen, args, *a, **k)

        subprocess.Popen.__init__ = checked_init

    def uninstall(self) -> None:
        subprocess.Popen.__init__ = self._popen_init
