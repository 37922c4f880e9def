"""The writer process (tracekit/writer/spool_writer.py) stops when told, whatever it is doing, starting included."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tracekit import open_store
from tracekit.writer.handoff import Handoff
from tracekit.writer.spool import write_entry
from tracekit.writer.spool_names import STEP, entry_name
from tracekit.writer.spool_writer import ATTRS, STOPPED_CAUSE
from tracekit.store import TensorData, create_store

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

BOUND_S = 60  # an idle writer stops at once; far more than that is a writer that never stops


def _reap(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


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
        _reap(proc)
    assert rc == 0
    rank = open_store(store).rank(0)
    assert rank.completed_steps == [1]
    assert rank.attrs["unwritten_steps"] == []  # nothing was left to write


# Holds the writer program's import of the store's modules (its heaviest start-up: zarr, numpy) until
# the test says go, and says when it holds: a SIGTERM can then land while the writer is starting,
# which on cores the ranks keep busy (the writer at nice 19) can take seconds.
HOLD_STORE_IMPORT = """
import importlib.abc, os, sys, time
class _Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tracekit.store":
            sys.meta_path.remove(self)
            open(os.environ["TK_TEST_HOLDING"], "w").close()
            while not os.path.exists(os.environ["TK_TEST_GO"]):
                time.sleep(0.01)
        return None
sys.meta_path.insert(0, _Hold())
"""


def _wait_for_file(path, proc, bound_s=BOUND_S):
    deadline = time.monotonic() + bound_s
    while not os.path.exists(path):
        assert proc.poll() is None, f"the writer ended (exit {proc.returncode}) before its start-up was held"
        assert time.monotonic() < deadline, f"the writer's start-up was not held within {bound_s} s"
        time.sleep(0.01)


def test_a_writer_stopped_while_it_starts_lists_every_spooled_step_as_unwritten(tmp_path):
    """`tracekit record`'s --flush-timeout can SIGTERM a writer that is still starting. It used to die
    of it there, before it made its rank's group: the store then held no trace of the rank's steps."""
    store, spool = str(tmp_path / "s"), tmp_path / "spool"
    create_store(store, {})
    spool.mkdir()
    (spool / ATTRS).write_text(json.dumps({"coords": {"rank": 0}}))
    for step in (1, 2):
        write_entry(str(spool / entry_name(step, STEP)), step, True,
                    [("parameters", TensorData("w", "float32", (3,), np.full(3, step, np.float32)))])
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_STORE_IMPORT)
    holding, go = tmp_path / "holding", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), REPO]),
           "TK_TEST_HOLDING": str(holding), "TK_TEST_GO": str(go)}
    proc = subprocess.Popen([sys.executable, "-m", "tracekit.writer.spool_writer", "--spool", str(spool),
                             "--store", store, "--rank", "0", "--rank-pid", str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        _wait_for_file(holding, proc)
        os.kill(proc.pid, signal.SIGTERM)  # mid start-up: before it imported the store's modules
        go.touch()
        rc = proc.wait(timeout=BOUND_S)
    finally:
        _reap(proc)
    assert rc == 0
    rank = open_store(store).rank(0)
    assert rank.completed_steps == []  # stopped before it stored anything
    assert rank.attrs["unwritten_steps"] == [1, 2]
    assert rank.attrs["unwritten_cause"] == STOPPED_CAUSE


# Wraps shutil.rmtree in the writer process: says, for each spool folder it removes, whether the
# folder's lock was free then (a second open of it takes the lock at once unless the writer holds it).
PROBE_SPOOL_LOCK = """
import fcntl, os, shutil
_rmtree = shutil.rmtree
def _probe(path, *args, **kwargs):
    lock = os.path.join(path, "writer.lock")
    if os.path.exists(lock):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        finally:
            os.close(fd)
        with open(os.environ["TK_TEST_LOCK_STATE"], "a") as f:
            f.write(f"{free}\\n")
    return _rmtree(path, *args, **kwargs)
shutil.rmtree = _probe
"""


def _probed_handoff(tmp_path, monkeypatch, hold_bytes: int):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PROBE_SPOOL_LOCK)
    state = tmp_path / "lock_state"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), REPO]))
    monkeypatch.setenv("TK_TEST_LOCK_STATE", str(state))
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 8 << 20, hold_bytes=hold_bytes)
    for step in (1, 2):
        handoff.put(step, [("parameters", TensorData("w", "float32", (4,), np.full(4, step, np.float32)))],
                    complete=True)
    return store, handoff, state


def test_a_writer_that_stored_everything_frees_its_lock_before_it_removes_its_spool(tmp_path, monkeypatch):
    """The launcher finalizes once every writer's lock is free; freeing a rank's spool files (hundreds
    of MB of slabs on TorchTitan) need not delay that when nothing is left in the spool."""
    store, handoff, state = _probed_handoff(tmp_path, monkeypatch, hold_bytes=0)
    try:
        handoff.close("finished")
    finally:
        _reap(handoff._proc)
    assert open_store(store).rank(0).completed_steps == [1, 2]
    assert state.read_text().split() == ["True"]


def test_a_writer_stopped_with_steps_left_removes_its_spool_before_it_frees_its_lock(tmp_path, monkeypatch):
    """A free lock over a spool that still holds entries would read, to the launcher, as the rank's
    unwritten steps in a writer that ended without storing them; the writer stopped with steps left
    therefore frees its lock only once its spool is gone."""
    store, handoff, state = _probed_handoff(tmp_path, monkeypatch, hold_bytes=8 << 20)  # both steps held
    proc = handoff._proc
    try:
        handoff._wait_ready()
        os.kill(proc.pid, signal.SIGTERM)  # stopped while it holds steps 1-2 for the rank's end
        assert proc.wait(timeout=BOUND_S) == 0
    finally:
        _reap(proc)
    rank = open_store(store).rank(0)
    assert rank.attrs["unwritten_steps"] == [1, 2]
    assert state.read_text().split() == ["False"]
