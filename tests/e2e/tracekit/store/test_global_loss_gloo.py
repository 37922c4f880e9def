"""tracekit's derived global loss adds the ranks' losses in the order gloo's all_reduce does
(docs/ZEROCODE.md): checked against gloo itself at 3 ranks (the samples' tests cover 2 and 4)."""

import os
import subprocess
import sys

from tests.paths import CLI_SCRIPTS

SCRIPT = os.path.join(CLI_SCRIPTS, "gloo_sum_order.py")


def test_the_derived_mean_is_gloos_all_reduce_bit_for_bit_at_3_ranks():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3", SCRIPT, "500"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "derived 500 of 500" in result.stdout, result.stdout
