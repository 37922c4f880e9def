"""Issue 9: a rank's status says how it ended, through a real `tracekit record` of the sample.

finished only for a clean end; an exception -> failed with a one-line cause; a rank killed from
outside (SIGKILL) or gone without cleanup (os._exit) -> killed / died with its signal or exit
status, which the launcher persists in the root metadata. `tracekit show` and `tracekit diff` print it.
(The plain sample's rank SIGKILLed under torchrun is tests/e2e/cli/test_objstore_cli.py's killed rank,
whose launch checks the same of a store in a bucket: the status comes from the launcher and
torchrun's report, wherever the store is.)

A raise is the rank's own exit path (zero-code's exit hook, the Recorder's __exit__): a world of one
shows it, started as torchrun starts a worker but without its agent or a peer to pay for. A kill and
an exit are known only from torchrun's failure report, so they run under torchrun at 2 ranks, where
the peer that lost its partner is checked too.
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


# a world of one as torchrun starts a worker (port 0: no peer looks for its store)
ONE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}


def record_crash(tmp_path, how: str, script: str, world: int) -> tuple[str, subprocess.CompletedProcess]:
    store = str(tmp_path / f"{script}-{how}")
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"] if world > 1 else []
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, "--", sys.executable, *launch,
           os.path.join(SAMPLES, script, "train.py"), *mode_args("ddp"), "--steps", "3",
           "--fault", f"crash={world - 1}:2:{how}"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(ONE if world == 1 else {})})
    assert result.returncode != 0, result.stderr[-3000:]
    return store, result


# the crashing rank is the world's last: rank 0 of a world of one, rank 1 of two
@pytest.mark.parametrize("how, script, world, status, cause", [
    ("raise", "plain", 1, "failed", "RuntimeError: planted crash on rank 0 at step 2"),  # zero-code's exit hook
    ("raise", "tutorial", 1, "failed", "RuntimeError: planted crash on rank 0 at step 2"),  # the Recorder's __exit__
    ("exit", "tutorial", 2, "died", "exit status 3 without closing its recording"),
])
def test_a_crashed_rank_is_not_finished(tmp_path, how, script, world, status, cause):
    store, _ = record_crash(tmp_path, how, script, world)
    s = open_store(store)
    assert s.finished  # the launcher finalized it
    rank = world - 1
    assert s.ranks == list(range(world))
    crashed = s.rank(rank)
    assert (crashed.status, crashed.cause) == (status, cause)
    if how == "raise":  # closed on the way out: step 1 flushed (a killed rank may lose its queued steps)
        assert crashed.completed_steps == [1]
    final = s.meta["ranks"][str(rank)]
    assert final["status"] == status and final["cause"] == cause
    if how == "exit":
        assert final["exit_code"] == 3
    if world > 1:  # the peer lost its partner mid-collective, or was stopped by torchrun: not finished either
        assert s.rank(0).status in ("failed", "terminated", "killed", "died")

    code, out = cli("show", store)
    assert code == 0
    assert f"rank {rank} {status}: {cause}" in out
    code, out = cli("diff", "--allow-missing", store, store)
    assert f"rank {rank} {status}: {cause}" in out
    assert "missing" not in out.splitlines()[-1]  # a store against itself lacks nothing


def test_a_clean_run_is_finished_without_a_cause(recorded_sample):
    store = traced_reference(recorded_sample, "ddp")  # the plain sample's shared recording
    s = open_store(store)
    for r in s.ranks:
        assert (s.rank(r).status, s.rank(r).cause) == ("finished", None)
        assert s.meta["ranks"][str(r)]["exit_code"] is None
    code, out = cli("diff", store, store)
    assert code == 0 and "finished" not in out and " failed" not in out
