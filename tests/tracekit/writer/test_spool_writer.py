"""The writer process (tracekit/writer/spool_writer.py) stops when told, whatever it is doing."""

import os
import signal
import subprocess

import numpy as np
import pytest

from tracekit import open_store
from tracekit.writer.handoff import Handoff
from tracekit.store import TensorData, create_store

BOUND_S = 60  # an idle writer stops at once; far more than that is a writer that never stops


@pytest.mark.parametrize("signals", [1, 2])
def test_a_writer_told_to_stop_while_it_waits_on_a_live_rank_stops(tmp_path, signals):
    """`tracekit record` SIGTERMs a writer still running at --flush-timeout; its rank may outlive the
    command (an orphan of a killed agent) and say nothing more. The writer, idle in select() waiting
    for that rank, must stop anyway: Python resumes select() after a handler that does not raise."""
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20)  # its rank: this process, alive throughout
    proc = handoff._proc
    try:
        handoff.put(1, [("parameters", TensorData("w", "float32", (3,), np.ones(3, np.float32)))], complete=True)
        handoff.flush()  # step 1 written: the writer waits for the rank's next word
        for _ in range(signals):  # a second SIGTERM changes nothing
            os.kill(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the writer ignored SIGTERM for {BOUND_S} s while it waited for a live rank")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert rc == 0
    rank = open_store(store).rank(0)
    assert rank.completed_steps == [1]
    assert rank.attrs["unwritten_steps"] == []  # nothing was left to write
