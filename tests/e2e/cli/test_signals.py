"""Kills and signals never lose a completed step (docs/RELIABILITY.md).

Each test runs `tracekit record -- python signal_train.py ...` (a world of one; a few cells under
torchrun), lets the script reach a known point, signals or kills it, and checks the store: every
step the script reported complete before the signal is there, nothing else is claimed, and the
rank's status says how it ended. A slow disk is simulated by throttling the writer process
(TRACEKIT_WRITE_MBPS), so the rank always dies with steps still spooled: each signal cell lists the
sealed entries in the rank's spool just before it sends the signal, asserts there are some, and that
their steps are in the store afterwards (the writer stored them after the rank's death).
"""

import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from tracekit import StoreError, open_store
from tracekit.cli.main import main
from tracekit.writer.spool import entries, read_entry
from tests.cli.runner import cli
from tests.paths import CLI_SCRIPTS
from tests.writer_faults import faulty_writer_pythonpath

# every test here runs `tracekit record` of a script and signals it (8-12 s each): the slow tier
SCRIPT = os.path.join(CLI_SCRIPTS, "signal_train.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
WATCHDOG_S = 240
# MB/s: the tiny model's ~50 KB spool entries take the writer ~0.05 s each, on top of the writer's
# start-up (importing zarr, ~0.4 s, while the rank's steps take milliseconds), so the steps a signal
# finds spooled (3 to 6 sealed entries in one run of the cells, step 0's parameters included; the
# cells assert there are some) are still there when it lands, and
# drain in a fraction of a second after it (at 0.25 MB/s, ~1.3 s of every cell's wall was that drain:
# an idle worker)
SLOW_DISK = "1"
# The cells' runs: STEPS steps, stopped at step STOP_AT (between steps, mid-step) or after the last
# one (exit); two steps before the signal are as good as more, and every entry spooled is one more
# to drain at the slow disk's pace.
STEPS, STOP_AT = 4, 2
CELL_ARGS = ["--steps", str(STEPS), "--stop-at", str(STOP_AT)]


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT's default action would dump core
    # A job started under nohup inherits SIGHUP ignored, and one started in the background of a
    # non-interactive shell inherits SIGINT and SIGQUIT ignored; tracekit keeps what it inherits (as
    # nohup asks). These tests signal a job started as from a terminal, so they pass from either too.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Job:
    """A running `tracekit record` job whose stdout is read line by line."""

    def __init__(self, tmp_path, script_args, record_args=(), torchrun=False, mbps=SLOW_DISK, env=None):
        self.store = str(tmp_path / "s")
        cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", self.store, *record_args, "--",
               *(TORCHRUN if torchrun else [sys.executable]), SCRIPT, *script_args]
        env = dict(os.environ, TRACEKIT_WRITE_MBPS=mbps, **(env or {}))
        self.stderr = open(tmp_path / "stderr.txt", "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
                                     preexec_fn=_no_core_dumps)
        self.lines: list[str] = []
        self.pids: list[int] = []
        # a hung job fails the test instead of hanging it
        self.hung = False
        self._watchdog = threading.Timer(WATCHDOG_S, self._kill_hung)
        self._watchdog.start()

    def _kill_hung(self) -> None:
        self.hung = True
        for pid in [self.proc.pid, *self.pids]:  # the workers too: none may outlive the test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def wait_for(self, pattern: str, count: int = 1) -> None:
        """Read stdout until `count` lines match `pattern`."""
        seen = 0
        for line in self.proc.stdout:
            self._note(line)
            if re.search(pattern, line):
                seen += 1
                if seen == count:
                    return
        raise AssertionError(f"the job ended before {pattern!r}: {self.lines}\n{self.err()}")

    def _note(self, line: str) -> None:
        line = line.strip()
        self.lines.append(line)
        if line.startswith("pid "):
            self.pids.append(int(line.split()[1]))

    def finish(self) -> int:
        for line in self.proc.stdout:
            self._note(line)
        rc = self.proc.wait()
        self._watchdog.cancel()
        assert not self.hung, f"the job hung: killed after {WATCHDOG_S} s; its last lines {self.lines[-4:]}\n{self.err()}"
        return rc

    def done_steps(self, rank: int = 0) -> list[int]:
        return [int(m.group(1)) for x in self.lines if (m := re.fullmatch(rf"rank={rank} step=(\d+)", x))]

    def err(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-3000:]


def _sealed_in_spool(rank_pid: int) -> tuple[int, list[int]]:
    """The rank, and the steps of the sealed entries waiting in its spool now (its writer process, the
    rank's child, names the folder, tracekit-rank<R>-*, in its command line); an entry stored
    meanwhile is skipped."""
    (writer,) = _children(rank_pid)
    with open(f"/proc/{writer}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    folder = argv[argv.index("--spool") + 1]
    rank = int(re.match(r"tracekit-rank(\d+)-", os.path.basename(folder)).group(1))
    steps = []
    for _, name in entries(folder, final=False):
        try:
            entry = read_entry(os.path.join(folder, name), populate=False)
        except (OSError, ValueError):
            continue
        steps.append(entry.step)
        entry.close()
    return rank, steps


def _rank(job, rank=0):
    return open_store(job.store).rank(rank)


def _assert_kept(job, rank=0, in_flight=False):
    """Every step the rank reported complete is in the store, and nothing past the one in flight."""
    done = job.done_steps(rank)
    got = _rank(job, rank).completed_steps
    if in_flight:  # a kill at a random moment: the step being sealed may be in, unreported
        assert got in (done, done + [len(done) + 1]), (got, done, job.err())
    else:
        assert got == done, (got, done, job.err())
    assert done == list(range(1, len(done) + 1))


# One world-of-one cell per signal and timing; targets and recording modes alternate, so that every
# signal is sent both to the worker and to `tracekit record`, and zero-code and the explicit
# Recorder both meet every timing. SIGINT is forwarded as SIGINT; SIGQUIT has no Python handler.
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT]
TIMINGS = ["between", "mid", "exit"]
CELLS = [(sig, timing, ("worker", "launcher")[i % 2], ("zero", "explicit")[(i // 2) % 2])
         for i, (sig, timing) in enumerate((s, t) for s in SIGNALS for t in TIMINGS)]


def _expected_status(sig, timing):
    """SIGTERM and SIGHUP: the recorder closes as `terminated`; SIGINT: a KeyboardInterrupt, `failed`;
    SIGQUIT: no Python handler, the rank never closes, and in a world of one the launcher cannot
    tell a signal from an exit (`died`; under torchrun, `killed`)."""
    during = {signal.SIGTERM: "terminated", signal.SIGHUP: "terminated", signal.SIGINT: "failed",
              signal.SIGQUIT: "died"}[sig]
    # in the exit flush the close has begun (finished, every step trained) or is about to
    return {"finished", during} if timing == "exit" else {during}


@pytest.mark.parametrize("sig, timing, target, mode", CELLS,
                         ids=[f"{s.name}-{t}-{g}-{m}" for s, t, g, m in CELLS])
def test_signal_keeps_every_completed_step(tmp_path, sig, timing, target, mode):
    job = Job(tmp_path, ["--mode", mode, *CELL_ARGS, "--stop", timing])
    job.wait_for("flushing" if timing == "exit" else f"{timing} {STOP_AT}")
    _, spooled = _sealed_in_spool(job.pids[0])  # what the slow disk has yet to store as the signal lands
    os.kill(job.pids[0] if target == "worker" else job.proc.pid, sig)
    rc = job.finish()
    assert rc == 128 + sig, job.err()
    _assert_kept(job)
    # the rank dies with steps still spooled, and its writer stores them after its death
    assert spooled and set(spooled) <= {0, *job.done_steps()}, (spooled, job.done_steps())
    assert job.done_steps() == list(range(1, {"mid": STOP_AT, "between": STOP_AT + 1, "exit": STEPS + 1}[timing]))
    assert _rank(job).status in _expected_status(sig, timing)
    # the parameters after every completed step, and the initial ones (step 0), the step in flight's not
    assert _rank(job).steps("parameters") == [0, *job.done_steps()]
    meta = open_store(job.store).meta
    assert meta["ranks"]["0"]["completed_steps"] == job.done_steps()
    # A signal in the exit flush may reach the worker after its last bytecode: the command then ends
    # 0, which the store keeps as the truth, while tracekit record still ends 128+N (it was signalled).
    assert meta["exit_status"] == rc or (timing == "exit" and meta["exit_status"] == 0), (meta["exit_status"], rc)


@pytest.mark.parametrize("mode", ["zero", "explicit"])
def test_os_exit_during_step_7_keeps_steps_1_to_6(tmp_path, mode):
    job = Job(tmp_path, ["--mode", mode, "--steps", "9", "--stop-at", "7", "--stop", "mid", "--crash", "exit"])
    assert job.finish() == 3, job.err()
    assert job.done_steps() == [1, 2, 3, 4, 5, 6]
    rank = _rank(job)
    assert rank.completed_steps == [1, 2, 3, 4, 5, 6]
    assert rank.status == "died"  # it never closed its recording
    assert rank.steps("parameters") == [0, 1, 2, 3, 4, 5, 6]


def test_exception_during_step_7_keeps_steps_1_to_6(tmp_path):
    job = Job(tmp_path, ["--mode", "zero", "--steps", "9", "--stop-at", "7", "--stop", "mid", "--crash", "raise"])
    assert job.finish() == 1, job.err()
    rank = _rank(job)
    assert rank.completed_steps == [1, 2, 3, 4, 5, 6]
    assert rank.status == "failed" and rank.cause == "RuntimeError: crash"


# One trial per recording mode: the moment within a step (the sleep below, and the scheduling) is new
# at every run; the step count is drawn from the trial's seed.
@pytest.mark.parametrize("trial", range(2))
def test_sigkill_at_a_random_moment_keeps_every_completed_step(tmp_path, trial):
    rng = random.Random(trial)
    job = Job(tmp_path, ["--mode", ("zero", "explicit")[trial % 2], "--steps", "100000", "--step-time", "0.01"],
              mbps="0")
    job.wait_for(r"rank=0 step=\d+", count=rng.randint(1, 30))
    time.sleep(rng.uniform(0, 0.01))  # the random moment within a step (not a synchronisation)
    os.kill(job.pids[0], signal.SIGKILL)
    assert job.finish() == 128 + signal.SIGKILL, job.err()
    _assert_kept(job, in_flight=True)
    assert _rank(job).status == "died"  # a world of one: the launcher sees no torchrun report


def test_flush_timeout_stops_a_slow_writer_and_lists_what_it_did_not_write(tmp_path):
    job = Job(tmp_path, ["--mode", "explicit", "--steps", "10", "--stop-at", "8", "--stop", "between",
                         "--dim", "64"], record_args=["--flush-timeout", "1"], mbps="0.02")
    job.wait_for("between 8")
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.finish() == 128 + signal.SIGTERM, job.err()
    assert "still writing at --flush-timeout" in job.err()
    rank = _rank(job)
    unwritten = rank.attrs["unwritten_steps"]
    assert [s for s in unwritten if s > 0], "the writer was expected to run out of time"
    assert rank.completed_steps + [s for s in unwritten if s > 0] == list(range(1, 9))
    assert rank.status == "terminated"


# ---- a few cells under torchrun: the agent in the middle ------------------------------------------

TORCHRUN_CELLS = [
    # the agent forwards SIGTERM, then SIGKILLs after 30 s: the writers outlive the workers
    (signal.SIGTERM, "mid", "agent", "zero"),
    (signal.SIGHUP, "between", "launcher", "explicit"),
    # rank 0 gets SIGINT in its exit flush; torchrun then stops rank 1 with SIGTERM
    (signal.SIGINT, "exit", "worker", "zero"),
]


@pytest.mark.parametrize("sig, timing, target, mode", TORCHRUN_CELLS,
                         ids=[f"{s.name}-{t}-{g}-{m}" for s, t, g, m in TORCHRUN_CELLS])
def test_signal_under_torchrun_keeps_every_completed_step(tmp_path, sig, timing, target, mode):
    job = Job(tmp_path, ["--mode", mode, *CELL_ARGS, "--stop", timing], torchrun=True)
    job.wait_for("flushing" if timing == "exit" else f"{timing} {STOP_AT}", count=2)
    spooled_rank, spooled = _sealed_in_spool(job.pids[0])  # the rank that printed its pid first
    if target == "agent":
        agent = [int(p) for p in subprocess.run(["pgrep", "-P", str(job.proc.pid)], capture_output=True,
                                                text=True).stdout.split()]
        assert len(agent) == 1
        os.kill(agent[0], sig)
    else:
        os.kill(job.pids[0] if target == "worker" else job.proc.pid, sig)
    rc = job.finish()
    if timing == "exit" and rc == 0:
        # a SIGINT in the exit flush can reach the worker after its last bytecode (Python ignores
        # it in its shutdown): the job then ends 0, as it would have, with both ranks finished
        assert {open_store(job.store).rank(r).status for r in (0, 1)} == {"finished"}, job.err()
    else:
        assert rc != 0, job.err()
    store = open_store(job.store)
    assert store.ranks == [0, 1]
    for r in (0, 1):
        _assert_kept(job, rank=r)
    assert spooled and set(spooled) <= {0, *job.done_steps(spooled_rank)}, (spooled, job.done_steps(spooled_rank))
    statuses = {store.rank(r).status for r in (0, 1)}
    if timing == "exit":  # rank 0 got SIGINT in its exit flush; torchrun then stops rank 1 with SIGTERM
        assert statuses <= {"finished", "failed", "terminated"}, statuses
    else:
        assert statuses == {"terminated"}, statuses


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _wait_for_rank_group(store: str, rank: int, writer: int, bound_s: float = 120) -> None:
    """Until the store lists the rank's group, which its writer makes at its start (a live store, read
    as `tracekit show` reads it; a group still being written may not parse yet)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            if rank in open_store(store).ranks:
                return
        except StoreError:
            pass
        assert os.path.exists(f"/proc/{writer}"), "the writer process ended before it made its rank's group"
        assert time.monotonic() < deadline, f"the writer made no group for rank {rank} within {bound_s} s"
        time.sleep(0.01)  # polling a state that holds once reached, not timing it


def test_a_stopped_writer_hangs_nothing_and_its_unstored_steps_are_listed(tmp_path):
    """A rank's writer process SIGSTOPped (a hung filesystem) after step 2: the rank ends within
    --flush-timeout of its training's end (before, it waited in its exit flush forever), `tracekit
    record` kills the writer, and the steps the writer never stored are listed as unwritten, with
    the cause; the rank, which finished training, reads `finished`, not `died`."""
    job = Job(tmp_path, ["--mode", "explicit", "--steps", "6", "--step-time", "0.3"], record_args=["--flush-timeout", "1"],
              mbps="0")
    job.wait_for(r"rank=0 step=2")
    (writer,) = _children(job.pids[0])  # the rank's one child: its writer process
    # The writer is stopped once it has made its rank's group, which its unstored steps are listed in.
    # Its start-up, at its low priority, can outlast the rank's six steps on a loaded machine (stopped
    # before it, the store held no rank at all), so the rank is held meanwhile: steps 3-6 still come
    # after the writer's stop, and stay unstored.
    os.kill(job.pids[0], signal.SIGSTOP)
    try:
        _wait_for_rank_group(job.store, 0, writer)
        os.kill(writer, signal.SIGSTOP)
    finally:
        os.kill(job.pids[0], signal.SIGCONT)
    try:
        job.wait_for("rank=0 step=6")
        ended = time.monotonic()
        rc = job.finish()
        # 1 s for the rank, then the launcher's 5 s grace for the SIGTERMed writer, then SIGKILL
        assert time.monotonic() - ended < 30, job.err()
    finally:
        os.kill(writer, signal.SIGKILL)  # a no-op once the launcher killed it; never left stopped
    assert "did not store this rank's spooled steps within --flush-timeout 1 s" in job.err()
    assert "killing it" in job.err()
    rank = _rank(job)
    unwritten = rank.unwritten_steps  # step 0 (the parameters before training) too, when it was not stored
    trained = [s for s in unwritten if s > 0]
    assert trained, "the stopped writer was expected to leave steps unstored"
    # a job whose writer stored no step at all fails as an empty recording, saying why
    assert rc == (0 if rank.completed_steps else 2), job.err()
    assert sorted(rank.completed_steps + trained) == list(range(1, 7))
    assert rank.status == "finished"
    assert "killed" in rank.unwritten_cause
    (last,) = [x for x in job.err().splitlines() if x.startswith("tracekit record: 1 rank(s)")]
    assert f"unwritten: rank 0 steps {unwritten[0]}-6" in last and "killed" in last, last
    # show reads the store in this process (a `tracekit show` process cost ~0.6 CPU-s and ~1 s each)
    code, shown = cli("show", job.store)
    assert code == 0 and f"rank 0 unwritten: steps {unwritten[0]}-6" in shown, shown
    shown = CliRunner().invoke(main, ["show", "--json", job.store])
    assert shown.exit_code == 0, shown.output
    (r0,) = json.loads(shown.stdout)["ranks"]
    assert r0["unwritten_steps"] == rank.unwritten_steps and "killed" in r0["unwritten_cause"]


def test_a_writer_stopped_before_it_makes_its_ranks_group_is_killed_and_the_rank_listed(tmp_path):
    """A writer process stopped as it starts, before it wrote its pid or made its rank's group (a
    hung filesystem, a machine out of memory): the rank ends at --flush-timeout, `tracekit record`
    kills the writer by the pid the rank noted for it, and makes the rank's group itself, so that
    the store lists the rank, finished, with every step it spooled as unwritten. Before, the
    launcher knew no pid to stop (the writer left running, stopped, holding its spool), and the
    store had no group for the rank: its summary named no rank; only a line on stderr did."""
    job = Job(tmp_path, ["--mode", "explicit", "--steps", "3"], record_args=["--flush-timeout", "1"], mbps="0",
              env={"PYTHONPATH": faulty_writer_pythonpath(tmp_path / "stop-the-writer")})
    job.wait_for("rank=0 step=3")
    (writer,) = _children(job.pids[0])
    try:
        rc = job.finish()
        assert _state(writer) in (None, "Z"), "the stopped writer was left behind"
    finally:
        os.kill(writer, signal.SIGKILL)  # never left stopped, whatever the outcome
    assert rc == 2, job.err()  # no step stored: an empty recording, and it says why
    assert f"writer process {writer} did not stop" in job.err() and "killing it" in job.err(), job.err()
    assert "stored nothing" not in job.err(), job.err()
    rank = _rank(job)
    assert rank.status == "finished" and rank.completed_steps == []
    assert [s for s in rank.unwritten_steps if s > 0] == [1, 2, 3]
    assert "killed" in rank.unwritten_cause
    (last,) = [x for x in job.err().splitlines() if x.startswith("tracekit record: 1 rank(s)")]
    assert "unwritten: rank 0 steps" in last, last


def _state(pid: int) -> str | None:
    """The process's state letter (/proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
