"""The launcher's wait for the ranks' writer processes (tracekit/launch/launcher.py wait_for_writers):
bounded whatever a writer does."""

import signal
import subprocess
import sys
import time

import pytest

from tracekit.launch import launcher as launch
from tracekit.writer.spool_writer import LOCK

# a stand-in writer: holds its spool's lock for its life and writes its pid there, as the writer does
HOLDER = """
import fcntl, os, signal, sys, time
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
f.write(str(os.getpid()))
f.flush()
print("locked", flush=True)
time.sleep(600)
"""


def _holder(tmp_path, on_sigterm):
    folder = tmp_path / "spools" / "rank-0"
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder / LOCK), on_sigterm], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize("on_sigterm", ["stop", "ignore"])
def test_a_writer_still_writing_at_the_deadline_is_stopped_and_killed_if_it_does_not_stop(tmp_path, monkeypatch,
                                                                                            capsys, on_sigterm):
    proc = _holder(tmp_path, on_sigterm)
    monkeypatch.setattr(launch, "STOP_GRACE_S", 0.5)
    try:
        started = time.monotonic()
        launch.wait_for_writers(str(tmp_path / "spools"), time.monotonic())  # the deadline has passed
        waited = time.monotonic() - started
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    err = capsys.readouterr().err
    assert "still writing at --flush-timeout; stopping it" in err
    if on_sigterm == "stop":
        assert code == -signal.SIGTERM and "killing it" not in err
    else:  # before, the launcher waited on it forever
        assert code == -signal.SIGKILL and "did not stop within 0.5 s; killing it" in err
        assert waited < 0.5 + launch.KILL_WAIT_S + 5
