"""--replay-from a reference store that lives in a bucket (moto on 127.0.0.1)."""

import numpy as np

from tracekit import open_store
from tests.recorders.test_replay import _run


def test_replay_from_a_bucket_store_is_exact_at_every_step(s3, tmp_path):
    ref_url = s3.url("runs/ref")
    ref = _run(ref_url)
    rep = _run(tmp_path / "rep", replay_from=ref_url)
    assert open_store(tmp_path / "rep").meta["replay_of"] == ref_url
    for step in ref.completed_steps:
        for t in ref.tensors("parameters"):
            np.testing.assert_array_equal(rep.read("parameters", step, t.name), ref.read("parameters", step, t.name))
