"""Drift or error, end to end (docs/DIFF.md "Drift or error"): a FAIL whose errors grow prints the
replay command, the command runs as printed, and the replay's diff decides it."""

import os
import shutil
import subprocess
import sys


import tracekit

from tests.conftest import TORCHRUN_TIMEOUT


def test_the_printed_replay_command_runs_and_tells_an_error_from_drift(recorded_sample, tmp_path):
    ref, _ = recorded_sample("ddp")
    shared, _ = recorded_sample("ddp", extra=("--fault", "lr_scale=1.01"))  # test_diff_workloads' recording
    cand = str(shutil.copytree(shared, tmp_path / "cand"))  # the replay is written beside it, not in the shared folder
    report = tracekit.diff(ref, cand)
    assert not report.passed and report.drift is not None
    errors = report.drift["errors"]
    assert report.drift["kind"] == "parameters" and errors[-1] >= 2 * errors[0]  # the lr error accumulates
    command = report.drift["replay_command"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT, env=env,
                          cwd=tmp_path)
    # the command's own diff: the replay still FAILs, so the lr error is a wrong step, not amplified noise
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith("FAIL comparison ranks=2 steps=3")
    replay = tracekit.diff(ref, str(tmp_path / "cand-replay"))
    assert replay.drift is None and replay.first_divergence.step == 1  # every step's own error, from step 1
    per_step = [s.max_abs_err for s in replay.summary if s.kind == "parameters" and s.step >= 1]
    assert max(per_step) < 2 * min(per_step)  # each step's error on its own: it does not grow
