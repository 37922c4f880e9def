"""The launcher's thread that imports what finalizing needs while the command runs."""

import subprocess
import sys

# in a fresh interpreter: this test process has zarr imported already
CODE = """
import sys
from tracekit.launch import prefetch
assert 'zarr' not in sys.modules and 'numpy' not in sys.modules
thread = prefetch.start(tuple(sys.argv[1:]))
assert thread.daemon
thread.join()
print(sorted(m for m in ('zarr', 'numpy', 'tracekit.store.finalize', 'tracekit.writer.spool') if m in sys.modules))
"""


def _run(*names):
    return subprocess.run([sys.executable, "-c", CODE, *names], capture_output=True, text=True, timeout=120)


def test_the_thread_imports_what_finalizing_needs():
    from tracekit.launch.prefetch import FINALIZING

    out = _run(*FINALIZING)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "['numpy', 'tracekit.store.finalize', 'tracekit.writer.spool', 'zarr']"


def test_a_module_that_fails_to_import_is_left_to_the_main_thread_silently():
    """The thread stops at the failing module (its error comes where the launcher imports it itself)."""
    out = _run("tracekit.no_such_module", "tracekit.store.finalize")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "[]" and out.stderr == ""
