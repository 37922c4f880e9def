"""A peer dying mid-step costs no other rank a step it completed (issue 39): zero-code recording
runs no collective of its own, so rank 0 keeps every step whose optimizer.step() returned,
whatever point of the step its peer died at. The global loss is derived only for the steps both
ranks recorded, and equals the loss the script printed (its own all_reduce, then / world)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tracekit import open_store
from tests.paths import CLI_SCRIPTS

SCRIPT = os.path.join(CLI_SCRIPTS, "peer_death_train.py")
TIMEOUT_S = 240  # a hang becomes a failure

# point -> (rank 0's completed steps, rank 1's), rank 1 dying in step 2 of 3
EXPECTED = {
    "before_collective": ([1], [1]),
    "inside_collective": ([1], [1]),
    "after_backward": ([1, 2], [1]),  # the case that lost rank 0's step 2 to tracekit's loss all-reduce
    "after_step": ([1, 2], [1, 2]),
}


@pytest.mark.parametrize("point", list(EXPECTED))
def test_a_peer_dying_mid_step_costs_rank_0_no_completed_step(tmp_path, point):
    store = str(tmp_path / "s")
    # --monitor-interval 1: rank 0 fails on its own (gloo: peer gone) before torchrun stops it
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", store, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--monitor-interval=1", SCRIPT, "--die-at", "2", "--point", point]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0  # rank 1 died: the job failed
    stepped = {(int(r), int(s)) for r, s in re.findall(r"rank=(\d) step=(\d) stepped", result.stdout)}
    printed = {int(s): float(v) for r, s, v in re.findall(r"rank=(\d) step=(\d) loss=(\S+)", result.stdout) if r == "0"}
    want0, want1 = EXPECTED[point]
    assert sorted(s for r, s in stepped if r == 0) == want0, result.stdout
    s = open_store(store)
    r0, r1 = s.rank(0), s.rank(1)
    assert r0.completed_steps == want0 and r1.completed_steps == want1, result.stderr[-3000:]
    assert "zero-code recording failed" not in result.stderr
    both = sorted(set(want0) & set(want1))
    for view in (r0, r1):  # the global loss where both ranks' local losses are recorded, nowhere else
        assert view.steps("loss") == both
    for step in both:
        assert r0.read_bits("loss", step, "loss").tobytes() == r1.read_bits("loss", step, "loss").tobytes()
        if step in printed:
            assert r0.read("loss", step, "loss") == np.float32(printed[step]), step
    assert printed, result.stdout  # at least step 1's printed loss was checked
