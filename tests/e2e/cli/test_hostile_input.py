"""Every bad input is one line and a non-zero exit: options, config files, hostile stores and dump files."""

import os
import sys

from tests.e2e.cli.tiny_runs import tiny_recording
from tests.paths import CLI_SCRIPTS




TINY = os.path.join(CLI_SCRIPTS, "tiny_train.py")


def test_a_selection_matching_no_rank_fails_the_record(tmp_path):
    """A range of 10^14 ranks is kept as its ends (it was a set of 10^14 ints: OOM-killed at 22 GB)."""
    import subprocess

    store = tmp_path / "s"
    r = subprocess.run([sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, "--ranks", "5,7-99999999999999",
                        "--", sys.executable, TINY, "--steps", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--ranks names rank(s) 5, 7-99999999999999, outside this 1-rank job" in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"Error: nothing was recorded in {store}: --ranks 5,7-99999999999999 "
                                                 "matched no rank of the job; see docs/ZEROCODE.md")


def test_replay_steps_beyond_the_run_fail_the_record(shared_once, tmp_path):
    """A reference of 3 steps replayed from step 3 by a run of 1 step replays nothing: exit 2 and
    one line, not exit 0 (the reference check at launch lets it through: step 3 has its state)."""
    import subprocess

    ref, _ = tiny_recording(shared_once)  # tiny_train.py, 3 steps, shared with test_record_cli.py
    cand = tmp_path / "cand"
    record = [sys.executable, "-m", "tracekit.cli.main", "record"]
    r = subprocess.run([*record, "-o", cand, "--replay-from", ref, "--replay-steps", "3:", "--",
                        sys.executable, TINY, "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"Error: no step was replayed from {ref} (--replay-steps 3:; "
                                                 "this run recorded steps 1)"), r.stderr
