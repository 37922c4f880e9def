"""One job per store: real concurrent `tracekit record` jobs, stale locks, and a killed torchrun agent."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import zarr

from tracekit import open_store
from tracekit.store.ownership import job_alive
from tests.paths import CLI_SCRIPTS

TINY = os.path.join(CLI_SCRIPTS, "tiny_train.py")
DEADLINE_S = 120  # a condition not met by then is a failure, never a stuck CI


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test():
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()  # its workers follow (parent-death signal)
            proc.wait()


def record(store, *args, force=False, env=None):
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, *(["--force"] if force else []), "--", *args]
    # the launcher's spool folder in the test's own folder: a SIGKILLed launcher leaves it behind
    spools = os.path.join(os.path.dirname(store), "spools")
    os.makedirs(spools, exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TRACEKIT_SPOOL": spools, **(env or {})})
    _STARTED.append(proc)
    return proc


def paused_job(store, pause_file, steps=4, force=False):
    return record(store, sys.executable, TINY, "--steps", str(steps), "--pause-at", "2", "--pause-file", pause_file,
                  force=force)


def wait_for(condition, what):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def root_meta(store):
    with open(os.path.join(store, "zarr.json")) as f:
        return json.load(f)["attributes"]["tracekit"]


def wait_paused(proc, ranks=1):
    """Read the job's output up to the pause of each of its `ranks` ranks (each flushed its recorder
    first: the steps before the pause are on disk by then). A job not paused by DEADLINE_S is killed
    (its output ends), a failure rather than a stuck CI."""
    seen = 0
    watchdog = threading.Timer(DEADLINE_S, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            if "paused" in line:
                seen += 1
                if seen == ranks:
                    return
    finally:
        watchdog.cancel()
    raise AssertionError(f"the job ended without pausing: {proc.stderr.read()}")


def test_two_jobs_started_together_one_wins_and_later_ones_are_refused_while_it_lives(tmp_path):
    """Two jobs started together (both --force): exactly one runs, the other is refused; while the
    winner lives, a later job is refused in one line naming its run, with and without --force; the
    store's data is the winner's, under its run id. (One launch for what two tests launched apart.)"""
    store, go = str(tmp_path / "s"), str(tmp_path / "go")
    jobs = [paused_job(store, go, steps=3, force=True), paused_job(store, go, steps=5, force=True)]
    # exactly one is refused; the other holds the store until released
    deadline = time.monotonic() + DEADLINE_S
    while all(j.poll() is None for j in jobs):
        assert time.monotonic() < deadline, "neither job was refused"
        time.sleep(0.05)
    loser = next(j for j in jobs if j.poll() is not None)
    winner = next(j for j in jobs if j is not loser)
    assert loser.returncode == 2
    assert "is being recorded by another job" in loser.stderr.read()
    wait_paused(winner)
    for force in (False, True):
        second = record(store, sys.executable, TINY, "--steps", "5", force=force)
        out, err = second.communicate(timeout=DEADLINE_S)
        assert second.returncode == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "is being recorded by another job" in lines[0], err
        assert root_meta(store)["run_id"] in lines[0]
    open(go, "w").close()
    assert winner.wait(timeout=DEADLINE_S) == 0, winner.stderr.read()
    s = open_store(store)
    expected = [1, 2, 3] if winner is jobs[0] else [1, 2, 3, 4, 5]
    assert s.rank(0).completed_steps == expected  # the winner's data, under its own run id
    assert s.rank(0).attrs["run_id"] == s.meta["run_id"]
    assert s.job_state == "finished"


def test_stale_lock_of_a_killed_launcher_is_reported_and_taken_over_with_force(tmp_path):
    store, go = str(tmp_path / "s"), str(tmp_path / "go")
    first = paused_job(store, go, steps=3)
    wait_paused(first)
    assert job_alive(store) is True
    rank_pid = open_store(store).rank(0).attrs["pid"]
    first.send_signal(signal.SIGKILL)  # the launcher itself: nothing finalizes the store
    first.wait(timeout=DEADLINE_S)
    # its child got SIGTERM as its parent died (parent-death signal), flushed, and ended
    wait_for(lambda: not os.path.exists(f"/proc/{rank_pid}"), "the orphaned rank to exit")
    s = open_store(store)
    assert s.job_state == "launcher died"
    assert s.rank(0).completed_steps == [1]
    assert s.rank(0).status == "terminated"
    assert len(os.listdir(tmp_path / "spools")) == 1  # the killed launcher's folder (in tmp_path, not /dev/shm)
    run_id = s.meta["run_id"]
    again = record(store, sys.executable, TINY, "--steps", "2")
    _, err = again.communicate(timeout=DEADLINE_S)
    assert again.returncode == 2
    assert err.strip() == (f"Error: {store} already holds a tracekit store left unfinished by run {run_id}, "
                           "whose launcher died; pass --force to overwrite it")
    forced = record(store, sys.executable, TINY, "--steps", "2", force=True)
    _, err = forced.communicate(timeout=DEADLINE_S)
    assert forced.returncode == 0, err
    s = open_store(store)
    assert s.meta["run_id"] != run_id and s.job_state == "finished"
    assert s.rank(0).completed_steps == [1, 2]
    assert os.listdir(tmp_path / "spools") == []  # the killed launcher's folder went as the next job started


def _running(pid: int) -> bool:
    """Alive and not a zombie: an orphan that exited stays in /proc until its new parent (here maybe a
    pid 1 that never reaps) collects it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def paused_torchrun_job(store, go):
    """A 2-rank torchrun job recorded into `store`, returned once both ranks have stored steps 1-2
    and wait before step 3 for the file `go`."""
    launcher = record(store, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                      TINY, "--steps", "4", "--pause-at", "3", "--pause-file", go)
    # both ranks' pause lines, not a poll of the store (an open_store every 50 ms while torchrun and
    # the ranks start): each rank flushed its recorder before printing its line
    wait_paused(launcher, ranks=2)
    s = open_store(store)
    assert s.ranks == [0, 1] and all(s.rank(r).completed_steps == [1, 2] for r in (0, 1))
    return launcher


def test_killed_torchrun_agent_is_not_finalized_before_its_workers_end(tmp_path):
    store, go = str(tmp_path / "s"), str(tmp_path / "go")
    launcher = paused_torchrun_job(store, go)
    with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
        (agent,) = [int(p) for p in f.read().split()]
    workers = [open_store(store).rank(r).attrs["pid"] for r in (0, 1)]
    os.kill(agent, signal.SIGKILL)
    assert launcher.wait(timeout=DEADLINE_S) == 128 + signal.SIGKILL
    # the launcher returned only after both workers were gone, and then finalized
    assert not any(_running(p) for p in workers)
    live = open_store(store)
    assert live.job_state == "finished" and live.meta["exit_status"] == 137
    consolidated = zarr.open_consolidated(store, mode="r")
    for r in (0, 1):
        attrs = dict(consolidated[f"rank_{r}"].attrs)
        assert attrs["completed_steps"] == live.rank(r).completed_steps == [1, 2]
        assert attrs["status"] == live.rank(r).status == "terminated"


def test_killed_launcher_takes_the_torchrun_agent_and_its_workers_with_it(tmp_path):
    """`tracekit record` SIGKILLed under torchrun (2 ranks, paused in step 3): the agent gets SIGTERM
    (parent-death signal, set on it by the launcher), stops its workers, and every process of the
    job ends, writers included; the store says its launcher died, and keeps steps 1-2 of each rank.
    Before, the agent and its workers trained on with no launcher."""
    store, go = str(tmp_path / "s"), str(tmp_path / "go")
    launcher = paused_torchrun_job(store, go)
    with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
        (agent,) = [int(p) for p in f.read().split()]
    workers = [open_store(store).rank(r).attrs["pid"] for r in (0, 1)]
    writers = [int(p) for w in workers for p in open(f"/proc/{w}/task/{w}/children").read().split()]
    assert len(writers) == 2  # each rank's writer process
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=DEADLINE_S)
    # The go file only once the agent has ended: a worker still polling for it in the moment between
    # the agent's SIGTERM and its own could otherwise finish step 3 first (seen once in CI). Workers
    # that outlived their agent would find it and train steps 3-4; an agent that lived on fails here.
    wait_for(lambda: not _running(agent), "the torchrun agent to end")
    open(go, "w").close()
    wait_for(lambda: not any(_running(p) for p in [agent, *workers, *writers]), "every process of the job to end")
    s = open_store(store)
    assert s.job_state == "launcher died"
    for r in (0, 1):
        assert s.rank(r).completed_steps == [1, 2]
        assert s.rank(r).status == "terminated"
