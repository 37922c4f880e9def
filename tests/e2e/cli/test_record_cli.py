import json
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest

from tracekit import open_store
from tracekit.schemas import load

from tests.e2e.cli.tiny_runs import EXIT_CODE, tiny_rank_unused_modules, tiny_recording
from tests.paths import CLI_SCRIPTS
from tests.writer_faults import faulty_writer_pythonpath

TINY = os.path.join(CLI_SCRIPTS, "tiny_train.py")
PLAIN_TINY = os.path.join(CLI_SCRIPTS, "plain_tiny_train.py")  # no tracekit import: recorded zero-code


def run_cli(*args, timeout=120, env=None):
    """The installed console entry point as a user runs it (a real process: signals, exit codes)."""
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})


# The tests below that only read a finished world of one share one recording (tests/e2e/cli/tiny_runs.py:
# tiny_train.py, 3 steps, `--json`, the script exiting 3); the killed-rank and SIGTERM cases are checked
# in test_objstore_cli.py (the same 2-rank launch, into a bucket) and test_signals.py's matrix.
def test_records_a_world_of_one_and_propagates_exit_code(shared_once):
    store, result = tiny_recording(shared_once)
    assert result.returncode == EXIT_CODE == 3, result.stderr
    s = open_store(store)
    assert s.meta["exit_status"] == 3
    assert s.meta["launcher"] == "tracekit record"
    assert s.rank(0).completed_steps == [1, 2, 3]
    assert s.run["mode"] == "tiny"
    # a rank with no DTensor, no FSDP and no dynamo-disabled optimizer: the recorder loads none of
    # them for it (DTensor's import alone was ~0.8 CPU-s of the rank's ~2)
    assert tiny_rank_unused_modules(shared_once) == ""


def test_refuses_existing_store_without_force_and_keeps_it(shared_once, tmp_path):
    """(--force overwrites it: test_says_what_it_waits_for_when_writers_outlive_the_command records
    over a copy of the same store.)"""
    store = str(tmp_path / "s")
    shutil.copytree(tiny_recording(shared_once)[0], store)  # a finished 3-step store, ours to overwrite
    again = run_cli("record", "-o", store, "--", sys.executable, TINY, "--steps", "2")
    assert again.returncode == 2
    assert again.stderr.strip() == f"Error: {store} already holds a tracekit store; pass --force to overwrite it"
    assert open_store(store).rank(0).completed_steps == [1, 2, 3]
    assert open_store(store).meta["exit_status"] == EXIT_CODE  # the tiny recording's, untouched


def test_unrunnable_command_is_one_line_and_the_store_is_finalized(tmp_path):
    bogus = tmp_path / "not-a-program"
    bogus.write_bytes(b"garbage\x00")
    bogus.chmod(0o755)
    store = str(tmp_path / "s")
    result = run_cli("record", "-o", store, "--", str(bogus))
    assert result.returncode == 2
    assert result.stderr.strip() == f"Error: cannot run {bogus}: Exec format error"
    assert open_store(store).meta["exit_status"] == 127


def test_a_job_that_ignores_sigterm_keeps_ignoring_it_and_exits_without_close_flushing_every_step(tmp_path):
    """Two promises, one process: a recorder started in a job that ignores SIGTERM leaves it ignored
    (a SIGTERM mid-run changes nothing), and a recorder never closed is drained by the exit hooks,
    before zarr's executors shut down (every step of 20, each ~3 MiB, status `finished`)."""
    # the optimizer: tests/cli/scripts/lean_sgd.py's SGD update, which does not import torch._dynamo
    # (torch.optim.SGD's ~1.4 CPU-s is not what this test is about)
    script = (
        "import os, signal, sys, torch\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "from tracekit.recorders import Recorder\n"
        f"sys.path.insert(0, {CLI_SCRIPTS!r}); from lean_sgd import LeanSGD\n"
        "m = torch.nn.Linear(512, 512); opt = LeanSGD(m.parameters(), lr=0.1)\n"
        "rec = Recorder(m, opt, store=sys.argv[1]).start()\n"
        "for s in range(20):\n"
        "    if s == 1:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    out = m(torch.ones(3, 512)); l = out.sum(); l.backward()\n"
        "    rec.observe(output=out, loss=l); opt.step(); opt.zero_grad()\n"
        "print('survived SIGTERM')\n"
    )  # never closes
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "survived SIGTERM" in out.stdout
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == list(range(1, 21))
    assert rank.status == "finished"


def test_ends_with_a_one_line_summary(shared_once):
    """On stderr; with --json, also the object of schemas/record-result as the last stdout line,
    after the job's own output."""
    store, result = tiny_recording(shared_once)  # `record --json`, the script exiting 3
    assert result.returncode == 3, result.stderr
    *job, last_out = result.stdout.splitlines()
    assert job == ["rank=0 step=1", "rank=0 step=2", "rank=0 step=3"]
    doc = json.loads(last_out)
    jsonschema.validate(doc, load("record-result"))
    assert (doc["ranks"], doc["steps"], doc["statuses"], doc["exit_status"], doc["errors"]) == (
        1, [1, 2, 3], {"finished": 1}, 3, [])
    assert (doc["coverage"]["optimizer_params"], doc["coverage"]["recorded"], doc["unwritten"]) == (2, 2, {})
    assert doc["store"] in result.stderr.splitlines()[-1]
    *before, finalizing, last = result.stderr.strip().splitlines()
    assert last.startswith("tracekit record: 1 rank(s), steps 1-3, kinds outputs, loss, gradients, parameters, deltas, "
                           "2 of 2 optimizer parameters, ")  # the script's Recorder(model, opt): its coverage
    assert last.endswith(f" in {store}; ranks: 1 finished; exit status 3")
    assert finalizing == f"tracekit record: finalizing {store} ..."  # the wait after training is never silent
    # the rank closed its Recorder (waiting for its writer) before exiting: nothing left to store then
    assert not any("the command ended" in line for line in before), result.stderr


def test_a_zero_code_rank_ends_without_waiting_for_its_writer(tmp_path):
    """Zero-code under `tracekit record`: the rank tells its writer how it ended and exits; the writer
    stores the steps it held back while the rank trained (--hold-mb) as the job ends, and the launcher
    waits for it before finalizing. With the writer slowed to ~0.1 s per entry, it is still storing
    when the command ends (a rank that waited for it, as the explicit Recorder's close does, would
    leave nothing to store then), and the store has every step."""
    store = str(tmp_path / "s")
    result = run_cli("record", "-o", store, "--", sys.executable, PLAIN_TINY, "--steps", "4",
                     env={"TRACEKIT_WRITE_MBPS": "0.04"})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith("tracekit record: the command ended (exit status 0); storing ") for line in lines), (
        result.stderr)
    view = open_store(store).rank(0)
    assert view.completed_steps == [1, 2, 3, 4] and view.status == "finished"


def test_says_what_it_waits_for_when_writers_outlive_the_command(shared_once, tmp_path):
    """A rank killed with steps still spooled (a writer slowed to ~0.1 s per entry: the rank trains
    its 3 steps and dies in milliseconds, while its writer is still starting): the launcher says it
    stores them, then that it finalizes, then the summary. Recorded with --force over a copy of the
    shared tiny store (test_refuses_existing_store_without_force_and_keeps_it's): --force overwrites
    it, a new run with its own exit status."""
    store = str(tmp_path / "s")
    shutil.copytree(tiny_recording(shared_once)[0], store)
    old_run = open_store(store).meta["run_id"]
    result = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "record", "--force", "-o", store, "--",
                             sys.executable, TINY, "--steps", "4", "--die-rank", "0", "--die-step", "4"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "TRACEKIT_WRITE_MBPS": "0.04"})
    assert result.returncode == 137, result.stderr
    lines = result.stderr.strip().splitlines()
    ended = next(i for i, line in enumerate(lines) if "the command ended" in line)
    assert lines[ended].startswith("tracekit record: the command ended (exit status 137); storing ")
    assert lines[ended].endswith(" of 1 rank (at most 60 s more: --flush-timeout) ...")
    assert lines[ended + 1:ended + 2] == [f"tracekit record: finalizing {store} ..."]
    assert lines[-1].startswith("tracekit record: 1 rank(s), steps 1-3,")
    overwritten = open_store(store)
    assert overwritten.rank(0).completed_steps == [1, 2, 3]
    assert overwritten.meta["run_id"] != old_run and overwritten.meta["exit_status"] == 137  # the tiny run's was 3


@pytest.mark.parametrize("command, why", [
    (["true"], "no rank started recording"),
    ([sys.executable, TINY, "--steps", "0"], "no rank completed a step"),
])
def test_nothing_recorded_is_a_clear_failure(tmp_path, command, why):
    store = str(tmp_path / "s")
    result = run_cli("record", "-o", store, "--json", "--", *command)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "no steps" in lines[-2] and lines[-2].endswith("exit status 0")
    assert lines[-1].startswith(f"Error: nothing was recorded in {store}: {why}")
    doc = json.loads(result.stdout.splitlines()[-1])  # --json: the object says it too, beside the command's 0
    jsonschema.validate(doc, load("record-result"))
    assert (doc["steps"], doc["exit_status"], doc["errors"]) == ([], 0, [lines[-1].removeprefix("Error: ")])


def test_a_writer_that_fails_as_it_starts_is_named_and_the_end_line_points_to_it(tmp_path):
    """The rank's writer process exits as it starts: the rank says so, and the closing error, which
    cannot tell it from a command that never recorded, points to that line instead of only asking
    whether the command ran a training script. No step is taken, so the rank hears of the failure
    when it closes, in one line (a hand-off may hear of it first: the next test)."""
    store = str(tmp_path / "s")
    result = run_cli("record", "-o", store, "--", sys.executable, TINY, "--steps", "0",
                     env={"PYTHONPATH": faulty_writer_pythonpath(tmp_path / "fail", "exit")})
    assert result.returncode == 2, result.stderr
    assert "tracekit: the writer process exited at start" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: nothing was recorded in {store}: no rank started recording")
    assert "writer process failed as it started says why above" in last, last


def test_an_explicit_recorder_that_hears_of_its_dead_writer_mid_run_raises_and_the_end_line_points_to_it(tmp_path):
    """The explicit Recorder reports a writer that failed at start at the next hand-off or flush
    after it did (docs/RELIABILITY.md): here a flush before step 1, which waits for the writer.
    WriterFailed ends the script (its exit status is the command's), and the launcher's end line
    still points to the cause."""
    store = str(tmp_path / "s")
    go_on = tmp_path / "go_on"
    go_on.touch()  # the pause ends at once: a flush that did not raise would print "paused" and train on
    result = run_cli("record", "-o", store, "--", sys.executable, TINY, "--steps", "2", "--pause-at", "1",
                     "--pause-file", str(go_on),
                     env={"PYTHONPATH": faulty_writer_pythonpath(tmp_path / "fail", "exit")})
    assert result.returncode == 1, result.stderr
    assert "WriterFailed: the writer process exited at start" in result.stderr, result.stderr
    assert "rank=0 paused" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: nothing was recorded in {store}: no rank started recording")
    assert "writer process failed as it started says why above" in last, last
