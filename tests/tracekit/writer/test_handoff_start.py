"""A rank hands its first steps off while its writer process is still starting (tracekit/writer/
handoff.py): the hand-off does not wait for the writer's start-up, and a writer that fails at
start is still reported, with its own words."""

import os
import shutil
import signal
import threading

import numpy as np
import pytest

from tracekit import open_store
from tracekit.store import TensorData, create_store
from tracekit.writer.handoff import Handoff, WriterFailed
from tracekit.writer.spool_writer import LOCK
from tests.writer_faults import faulty_writer_pythonpath


def _step(value: float):
    return [("parameters", TensorData("w", "float32", (3,), np.full(3, value, np.float32)))]


def test_a_hand_off_does_not_wait_for_a_writer_still_starting(tmp_path):
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20)
    os.kill(handoff._proc.pid, signal.SIGSTOP)  # a writer that takes as long as it likes to start
    try:
        handed = threading.Thread(target=lambda: [handoff.put(s, _step(s), complete=True) for s in (1, 2)])
        handed.start()
        handed.join(timeout=60)  # a guard against a hang, not a sync: the puts need nothing from the writer
        assert not handed.is_alive(), "put() waited for the writer process to start"
    finally:
        os.kill(handoff._proc.pid, signal.SIGCONT)
    handoff.close("finished")
    view = open_store(store).rank(0)
    assert view.completed_steps == [1, 2]
    assert view.read("parameters", 2, "w").tolist() == [2.0, 2.0, 2.0]


def test_a_writer_that_fails_at_start_is_reported_at_the_next_hand_off_or_flush(tmp_path):
    not_a_store = tmp_path / "plain"
    not_a_store.mkdir()
    handoff = Handoff(str(not_a_store), 0, {"coords": {"rank": 0}}, 1 << 20)
    with pytest.raises(WriterFailed, match="not a tracekit store"):
        handoff.put(1, _step(1), complete=True)
        handoff.flush()


def test_the_writers_pid_is_in_its_lock_file_before_the_writer_runs(tmp_path, monkeypatch):
    """`tracekit record` stops, then kills, a writer still running at --flush-timeout by the pid in
    its lock file. The writer wrote it there itself, once it ran: one stopped or stuck before that
    was never signalled, and was left running, holding its spool (found with a writer stopped as it
    started). The rank now writes it as it starts the writer."""
    monkeypatch.setenv("PYTHONPATH", faulty_writer_pythonpath(tmp_path / "stop"))
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20)
    try:
        with open(os.path.join(handoff.spool, LOCK)) as f:
            assert f.read() == str(handoff._proc.pid)
    finally:
        os.kill(handoff._proc.pid, signal.SIGKILL)
        handoff._proc.wait()
        shutil.rmtree(handoff.spool, ignore_errors=True)
