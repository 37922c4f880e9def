"""`tracekit record` removes, as it starts, the spool folder a SIGKILLed launcher left; never a live one's."""

import os
import subprocess
import sys


WAIT = "import sys; print('ready', flush=True); sys.stdin.read()"  # runs until its stdin closes
TIMEOUT_S = 120  # a hang is a failure, never a stuck CI


def record(store, root, code, **kw):
    # TRACEKIT_SPOOL: the launcher's spool root, here a folder of this test's (by default /dev/shm)
    return subprocess.Popen([sys.executable, "-m", "tracekit.cli.main", "record", "-o", str(store), "--",
                             sys.executable, "-c", code], env={**os.environ, "TRACEKIT_SPOOL": str(root)},
                            text=True, **kw)


def started(root, known, store):
    """A launcher whose command runs (its spool folder is made and locked by then), and its folder."""
    proc = record(store, root, WAIT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout.readline() == "ready\n"
    (made,) = set(os.listdir(root)) - set(known)
    return proc, made


def test_a_killed_launchers_spool_folder_goes_at_the_next_start_a_live_ones_stays(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "launcher.lock").write_text("")  # a dead launcher's folder, but reached only through a link
    (root / "tracekit-spool-linklink").symlink_to(elsewhere)
    (root / "tracekit-spool-keep").mkdir()  # not a name of ours
    others = ["tracekit-spool-linklink", "tracekit-spool-keep"]
    live, live_folder = started(root, others, tmp_path / "live")
    killed, killed_folder = started(root, [*others, live_folder], tmp_path / "killed")
    try:
        killed.kill()  # its `finally` never runs: its folder stays
        killed.wait(timeout=TIMEOUT_S)
        killed.stdin.close()  # its command (reparented) reads EOF and ends
        assert sorted(os.listdir(root)) == sorted([*others, live_folder, killed_folder])
        nxt = record(tmp_path / "next", root, "pass", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = nxt.communicate(timeout=TIMEOUT_S)
        assert "nothing was recorded" in err  # it ran (nothing to record in `pass`)
        assert sorted(os.listdir(root)) == sorted([*others, live_folder])
        assert os.listdir(elsewhere) == ["launcher.lock"]
    finally:
        live.stdin.close()
        live.wait(timeout=TIMEOUT_S)
        live.stdout.close()
        killed.stdout.close()
    assert sorted(os.listdir(root)) == sorted(others)
