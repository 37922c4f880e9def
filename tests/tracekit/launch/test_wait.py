"""The launcher's wait for its command (tracekit/launch/launcher.py _wait): the exit status as the
command ends (a pidfd, or Popen.wait's polling where there is none), a kill past the deadline."""

import subprocess
import sys
import time

import pytest

from tracekit.launch import launcher


@pytest.fixture(params=["pidfd", "polling"])
def way(request, monkeypatch):
    if request.param == "polling":
        monkeypatch.setattr(launcher, "_pidfd", lambda pid: None)
    return request.param


def test_the_commands_exit_status(way):
    polls = []
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"], stdin=subprocess.PIPE)
    proc.stdin.close()  # it exits once it has read to the end
    assert launcher._wait(proc, [], lambda: polls.append(1)) == 3
    assert polls  # on_poll ran while it waited


def test_past_the_deadline_the_command_is_killed(way, capsys):
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert launcher._wait(proc, [time.monotonic()]) == -9  # SIGKILL
    finally:
        proc.stdin.close()
    assert "did not end within --flush-timeout" in capsys.readouterr().err


def test_a_pidfd_where_linux_has_one():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = launcher._pidfd(proc.pid)
    try:
        assert fd is not None or not sys.platform.startswith("linux")
    finally:
        proc.wait()
        if fd is not None:
            launcher.os.close(fd)
