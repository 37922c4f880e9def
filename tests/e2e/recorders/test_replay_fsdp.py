"""Replay under real torchrun with FSDP2 (2 ranks): the reference's full tensors resharded to each rank."""

import os
import subprocess
import sys

import numpy as np

from tracekit import open_store
from tests.paths import REPO

ROOT = REPO
TRAIN = os.path.join(ROOT, "samples", "replay", "train.py")
STEPS = 3


def _record(out, *extra, train_args=()):
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "-o", str(out), "--kinds", "+optimizer_state", *extra,
           "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", TRAIN,
           "--parallelism", "fsdp", "--steps", str(STEPS), *train_args]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return open_store(out)


def test_fsdp_replay_restarts_each_step_from_the_reference_shards(tmp_path):
    ref = _record(tmp_path / "ref")
    # A candidate with another learning rate: free-running, its parameters and so its gradients
    # leave the reference after step 1; replayed, every step starts from the reference's exact
    # state, so its gradients must equal the reference's bit for bit at every step, on every rank.
    rep = _record(tmp_path / "rep", "--replay-from", str(tmp_path / "ref"), train_args=("--lr", "0.02"))
    assert rep.meta["replay_of"] == str(tmp_path / "ref")
    assert rep.ranks == ref.ranks == [0, 1]
    for r in rep.ranks:
        a, b = ref.rank(r), rep.rank(r)
        assert b.attrs["replay"]["replayed_steps"] == list(range(1, STEPS + 1))
        assert b.coords["meshes"][0]["dim_names"] == ["dp"]  # the parameters really were FSDP2 DTensors
        names = [t.name for t in a.tensors("parameters")]
        for name in names:
            assert np.array_equal(b.read_bits("parameters", 0, name), a.read_bits("parameters", 0, name))
            for step in range(1, STEPS + 1):
                assert np.array_equal(b.read_bits("gradients", step, name), a.read_bits("gradients", step, name)), (r, step, name)
        # and the candidate's own update really differs (twice the learning rate); deltas are
        # differences of float32 parameters of size < 0.1, so they carry rounding of ~1e-8
        d_ref, d_rep = a.read("deltas", 1, names[0]), b.read("deltas", 1, names[0])
        assert np.allclose(d_rep, 2 * d_ref, rtol=0, atol=2e-8) and np.abs(d_rep - d_ref).max() > 1e-7
        # momentum restored from the reference's gathered state: step 2's update is lr * (0.9 m1 + g2)
        m1 = a.read("optimizer_state", 1, names[0] + ".momentum_buffer")
        g2 = a.read("gradients", 2, names[0])
        assert np.allclose(b.read("deltas", 2, names[0]), -0.02 * (0.9 * m1 + g2), rtol=0, atol=2e-8)
