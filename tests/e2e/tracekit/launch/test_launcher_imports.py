"""`tracekit record` starts its command before it imports zarr or numpy (tracekit/launch/launcher.py):
the store's root is written without them (tracekit/store/local_root.py), and what finalizing needs
is imported while the command runs (tracekit/launch/prefetch.py)."""

import subprocess
import sys

import pytest

# Runs `tracekit record` with its arguments and reports which of zarr and numpy were imported when the
# recorded command (sys.executable -c pass) was started: the first Popen of that command line.
AT_COMMAND_START = """
import subprocess, sys
real = subprocess.Popen
class Probe(real):
    def __init__(self, args, *rest, **kwargs):
        if list(args)[:1] == [sys.executable] and not hasattr(Probe, 'seen'):
            Probe.seen = sorted(m for m in ('zarr', 'numpy') if m in sys.modules)
            print('AT_START:' + ','.join(Probe.seen), file=sys.stderr)
        super().__init__(args, *rest, **kwargs)
subprocess.Popen = Probe
from tracekit.cli.main import main
main(['record', *sys.argv[1:], '--', sys.executable, '-c', 'pass'], prog_name='tracekit')
"""


@pytest.mark.parametrize("force", [False, True])
def test_record_starts_its_command_before_importing_zarr_or_numpy(tmp_path, force):
    """Their import (~0.15 s of CPU) came before every recorded command; now the store's root is
    written without them (tracekit/store/local_root.py), over an old store (--force) too."""
    store = tmp_path / "s"
    if force:
        from tracekit.store import create_store

        create_store(str(store), {"launcher": "tracekit record"})
    args = ["-o", str(store), *(["--force"] if force else [])]
    out = subprocess.run([sys.executable, "-c", AT_COMMAND_START, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    started = [line for line in out.stderr.splitlines() if line.startswith("AT_START:")]
    assert started == ["AT_START:"], out.stderr[-3000:]
    assert "0 rank(s), no steps" in out.stderr  # it ran and finalized the store, through zarr, after the command
