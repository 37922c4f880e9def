"""A disk that fills up mid-run: the steps written before stay whole and readable, and every
tracekit process says so in one line instead of a traceback (docs/RELIABILITY.md).

The full disk is a real one: a 3 MiB tmpfs mounted for the test (root only; skipped elsewhere).
The recorded model writes about 0.8 MiB per step, so the disk fills during step 3 or 4.
"""

import os
import subprocess
import sys

import pytest

from tracekit import open_store
from tests.cli.runner import cli
from tests.paths import CLI_SCRIPTS

SCRIPT = os.path.join(CLI_SCRIPTS, "signal_train.py")
TRACEKIT = [sys.executable, "-m", "tracekit.cli.main"]


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_keeps_the_steps_written_before_and_says_so_in_one_line(tiny_disk, tmp_path):
    store = str(tiny_disk / "s")
    run = subprocess.run([*TRACEKIT, "record", "-o", store, "--", sys.executable, SCRIPT,
                          "--mode", "zero", "--steps", "12", "--dim", "256"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    # zero-code recording gives up and the training goes on to the end
    assert "rank=0 step=12" in run.stdout, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "No space left on device" in run.stderr
    # Two endings, both said in one line: the launcher cannot finalize the full disk either (exit
    # non-zero, the store left unfinalized); or, as format 2 leaves no half-written object behind
    # (written under a temporary name, removed when the write fails), the room that write took is
    # free again and the store is finalized, the rank marked failed, the job's own exit status kept.
    finalized = f"cannot finalize {store}" not in run.stderr
    if not finalized:
        assert run.returncode != 0

    store_view = open_store(store)
    rank = store_view.rank(0)
    done = rank.completed_steps
    assert done and done == list(range(1, len(done) + 1)) and len(done) < 12, done
    if finalized:
        assert run.returncode == store_view.meta["exit_status"] == 0 and "ranks: 1 failed" in run.stderr
        assert rank.status == "failed" and "No space left on device" in rank.cause
        # the writer may fail after the rank ended (it holds steps until then: --hold-mb), so the
        # launcher says it, whether or not the rank heard of it
        assert f"tracekit record: rank 0: recording failed: {rank.cause.removeprefix('recording: ')}" in run.stderr

    # what was written reads back whole: show, and a diff of the store with itself (in this process,
    # click's CliRunner: a `tracekit` process cost ~0.5 CPU-s each; an exception would be exit code 1)
    code, shown = cli("show", store)
    assert code == 0, shown
    assert ("finished: yes" if finalized else "launcher died") in shown
    code, out = cli("diff", "--exact", store, store)
    assert code == 0, out
    assert f"PASS comparison ranks=1 steps={len(done)}" in out
