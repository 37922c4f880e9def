"""Issue 9: a rank's status says how it ended, through a real `tracekit record` of the sample.

finished only for a clean end; an exception -> failed with a one-line cause; a rank killed from
outside (SIGKILL) or gone without cleanup (os._exit) -> killed / died with its signal or exit
status, which the launcher persists in the root metadata. `tracekit show` and `tracekit diff` print it.
"""

import os
import subprocess
import sys

import pytest

from tests.e2e.samples.traced_layouts import traced_reference
from tests.launching import TORCHRUN_TIMEOUT, mode_args

from tests.paths import SAMPLES
from tracekit import open_store
from tests.cli.runner import cli


def record_crash(tmp_path, how: str, script: str) -> tuple[str, subprocess.CompletedProcess]:
    store = str(tmp_path / f"{script}-{how}")
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.join(SAMPLES, script, "train.py"), *mode_args("ddp"), "--steps", "3", "--fault", f"crash=1:2:{how}"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0, result.stderr[-3000:]
    return store, result


@pytest.mark.parametrize("how, script, status, cause", [
    ("raise", "plain", "failed", "RuntimeError: planted crash on rank 1 at step 2"),  # zero-code's exit hook
    ("raise", "tutorial", "failed", "RuntimeError: planted crash on rank 1 at step 2"),  # the Recorder's __exit__
    ("kill", "plain", "killed", "killed by SIGKILL"),
    ("exit", "tutorial", "died", "exit status 3 without closing its recording"),
])
def test_a_crashed_rank_is_not_finished(tmp_path, how, script, status, cause):
    store, _ = record_crash(tmp_path, how, script)
    s = open_store(store)
    assert s.finished  # the launcher finalized it
    r1 = s.rank(1)
    assert (r1.status, r1.cause) == (status, cause)
    if how == "raise":  # closed on the way out: step 1 flushed (a killed rank may lose its queued steps)
        assert r1.completed_steps == [1]
    final = s.meta["ranks"]["1"]
    assert final["status"] == status and final["cause"] == cause
    if how == "kill":
        assert final["exit_code"] == -9
    if how == "exit":
        assert final["exit_code"] == 3
    # the peer lost its partner mid-collective, or was stopped by torchrun: not finished either
    assert s.rank(0).status in ("failed", "terminated", "killed", "died")

    code, out = cli("show", store)
    assert code == 0
    assert f"rank 1 {status}: {cause}" in out
    code, out = cli("diff", "--allow-missing", store, store)
    assert f"rank 1 {status}: {cause}" in out
    assert "missing" not in out.splitlines()[-1]  # a store against itself lacks nothing


def test_a_clean_run_is_finished_without_a_cause(recorded_sample):
    store = traced_reference(recorded_sample, "ddp")  # the plain sample's shared recording
    s = open_store(store)
    for r in s.ranks:
        assert (s.rank(r).status, s.rank(r).cause) == ("finished", None)
        assert s.meta["ranks"][str(r)]["exit_code"] is None
    code, out = cli("diff", store, store)
    assert code == 0 and "finished" not in out and " failed" not in out
