"""What `tracekit record` says while it waits after training (tracekit/launch/progress.py), without
processes: a rank's writer is busy while someone holds its spool's lock, as the writer does for
its whole life."""

import fcntl
import os

from tracekit.launch import progress
from tracekit.writer.spool_gc import LAUNCHER_LOCK
from tracekit.writer.spool_writer import LOCK


def _rank_folder(spools, name, entries, held):
    folder = spools / name
    folder.mkdir()
    for entry in entries:
        (folder / entry).write_bytes(b"x")
    f = open(folder / LOCK, "w")
    if held:
        fcntl.flock(f, fcntl.LOCK_EX)  # another open file: this process's own probe is refused too
    return f


def test_pending_counts_the_entries_of_busy_writers_only(tmp_path, capsys):
    held = _rank_folder(tmp_path, "tracekit-rank0-a", ["0000000001.step", "0000000002.step", "0000000003.prov",
                                                       "0000000004.part", "attrs.json"], held=True)
    done = _rank_folder(tmp_path, "tracekit-rank1-b", ["0000000001.step"], held=False)
    try:
        assert progress.pending(str(tmp_path)) == {str(tmp_path / "tracekit-rank0-a"): 3}  # .part is not handed off yet
        progress.command_ended(str(tmp_path), 137, 59.6)
        assert capsys.readouterr().err == ("tracekit record: the command ended (exit status 137); storing 3 spooled "
                                           "entries of 1 rank (at most 60 s more: --flush-timeout) ...\n")
    finally:
        held.close()
        done.close()
    assert progress.pending(str(tmp_path)) == {}  # the lock released: that writer is done
    progress.command_ended(str(tmp_path), 0, 60)
    assert capsys.readouterr().err == ""  # nothing to wait for, nothing said
    assert progress.pending(str(tmp_path / "gone")) == {}


def test_stored_while_running_speaks_once_after_the_last_writer_is_gone(tmp_path, capsys):
    watch = progress.StoredWhileRunning(str(tmp_path))
    (tmp_path / LAUNCHER_LOCK).write_text("")  # the launcher's, there for its whole life
    watch()  # no writer started yet: not "all stored"
    (tmp_path / "tracekit-rank0-a").mkdir()
    (tmp_path / "tracekit-rank1-b").mkdir()
    watch()
    os.rmdir(tmp_path / "tracekit-rank0-a")
    watch()  # one writer still at work
    assert capsys.readouterr().err == ""
    os.rmdir(tmp_path / "tracekit-rank1-b")
    watch()
    watch()
    assert capsys.readouterr().err == ("tracekit record: every rank's writer has stored its steps; waiting for the "
                                       "command to exit ...\n")
