"""The launcher's wait for the ranks' writer processes (tracekit/launch/launcher.py wait_for_writers):
bounded whatever a writer does."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tracekit.launch import launcher as launch
from tracekit.store import TensorData
from tracekit.writer.spool import write_entry
from tracekit.writer.spool_names import STEP, entry_name
from tracekit.writer.spool_writer import ATTRS, LOCK

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


def _spool_entries(folder, steps):
    (folder / ATTRS).write_text(json.dumps({"coords": {"rank": 3}}))
    for step in steps:
        write_entry(str(folder / entry_name(step, STEP)), step, True,
                    [("parameters", TensorData("w", "float32", (3,), np.full(3, step, np.float32)))])


@pytest.mark.parametrize("ends", ["at the deadline", "before the deadline"])
def test_a_writer_that_ends_leaving_its_spool_has_its_steps_listed_as_unwritten(tmp_path, monkeypatch, ends):
    """A writer that ends of its own removes its spool folder; one still there, with entries, ended
    without storing them (killed by the SIGTERM of --flush-timeout as it started, or before it). The
    launcher lists them for finalize, which used to hear nothing of them."""
    proc = _holder(tmp_path, "stop")
    folder = tmp_path / "spools" / "rank-0"
    _spool_entries(folder, [1, 2])
    monkeypatch.setattr(launch, "STOP_GRACE_S", 0.5)
    try:
        if ends == "before the deadline":
            proc.kill()
            proc.wait()
        losses = launch.wait_for_writers(str(tmp_path / "spools"), time.monotonic() + (30 if ends != "at the deadline" else 0))
    finally:
        proc.kill()
        proc.wait()
    assert losses == {3: {"unwritten_steps": [1, 2], "unwritten_cause": launch.ENDED_CAUSE,
                          "status": None, "cause": None}}


def test_a_rank_whose_writer_ended_before_making_its_group_is_listed_in_the_store(tmp_path):
    """Its writer was killed (or crashed) before it made the rank's group: the launcher makes the group
    from the attributes the rank left in its spool, so that the store's summary lists the rank and its
    spooled steps (it used to list the rank nowhere but in a line on stderr)."""
    from tracekit.store import create_store, finalize_store

    store = str(tmp_path / "s")
    create_store(store, {"launcher": "tracekit record"})
    proc = _holder(tmp_path, "stop")
    _spool_entries(tmp_path / "spools" / "rank-0", [1, 2])
    proc.kill()
    proc.wait()
    spools = str(tmp_path / "spools")
    losses = launch.wait_for_writers(spools, time.monotonic() + 30)
    assert launch.group_lost_ranks(spools, losses, store, None) == [3]
    assert launch.group_lost_ranks(spools, losses, store, None) == []  # it has its group now
    summary = finalize_store(store, 0, {}, losses)
    assert summary["ranks"]["3"]["unwritten_steps"] == [1, 2]
    assert summary["ranks"]["3"]["unwritten_cause"] == launch.ENDED_CAUSE
    assert launch.unlisted_losses(losses, summary["ranks"], store) == []


def test_a_store_that_takes_no_lost_ranks_group_stops_nothing(tmp_path):
    """Best effort: a store that refuses the group, or is not one (damaged, or its root gone), gives
    no group and raises nothing, so the launcher goes on to finalize (and names the rank on stderr)."""
    plain = tmp_path / "not-a-store"
    plain.mkdir()
    (plain / "zarr.json").write_text("{half a document")  # zarr fails on it with its own error, not an OSError
    proc = _holder(tmp_path, "stop")
    _spool_entries(tmp_path / "spools" / "rank-0", [1])
    proc.kill()
    proc.wait()
    spools = str(tmp_path / "spools")
    losses = launch.wait_for_writers(spools, time.monotonic() + 30)
    assert launch.group_lost_ranks(spools, losses, str(plain), None) == []


def test_a_writer_that_stored_everything_and_removed_its_spool_leaves_no_loss(tmp_path):
    proc = _holder(tmp_path, "stop")
    folder = tmp_path / "spools" / "rank-0"
    _spool_entries(folder, [1])
    proc.kill()
    proc.wait()
    for name in os.listdir(folder):  # what the writer's exit does, its lock file included
        os.unlink(folder / name)
    folder.rmdir()
    assert launch.wait_for_writers(str(tmp_path / "spools"), time.monotonic() + 30) == {}


def test_a_loss_of_a_rank_the_store_has_no_group_for_is_said_on_stderr():
    """The store took no group for it (group_lost_ranks could not make one)."""
    losses = {0: {"unwritten_steps": [1, 2], "unwritten_cause": launch.ENDED_CAUSE},
              1: {"unwritten_steps": [4], "unwritten_cause": launch.KILLED_CAUSE.format(grace=5)}}
    lines = launch.unlisted_losses(losses, {"1": {"completed_steps": [1, 2, 3]}}, "runs/s")
    assert lines == [f"tracekit: rank 0 stored nothing ({launch.ENDED_CAUSE}); its spooled steps 1 2 are not in runs/s"]
