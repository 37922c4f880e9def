"""A NaN that every rank holds alike (a gathered FSDP shard, an all-reduced gradient) is one NaN
that spread, not one per rank: the NaN/Inf line says so and counts it once; NaNs that differ
between ranks stay counted per rank."""

import json

import jsonschema
import numpy as np

import tracekit
from tracekit.compare.render import render
from tracekit.schemas import load
from tracekit.testing import write_store


def _stores(tmp_path, nan_on):
    """Two ranks, one step; the candidate's gradient has a NaN at [0, 0] on the ranks in nan_on."""
    g = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    ref = {r: {1: {"gradients": {"w": g}}} for r in range(4)}
    cand = {}
    for r in range(4):
        x = g.copy()
        if r in nan_on:
            x[0, 0] = np.nan
        cand[r] = {1: {"gradients": {"w": x}}}
    return write_store(tmp_path / "ref", ref), write_store(tmp_path / "cand", cand)


def test_a_nan_held_alike_by_every_rank_is_counted_once_and_said_to_have_spread(tmp_path):
    report = tracekit.diff(*_stores(tmp_path, nan_on={0, 1, 2, 3}))
    s = next(s for s in report.summary if s.kind == "gradients")
    assert (s.cand_nonfinite, s.cand_nonfinite_once, s.alike_ranks) == (4, 1, (0, 1, 2, 3))
    assert ("step 1 gradients: 0 in ref, 4 in cand, 4 mismatched (per rank: ranks 0-3 hold the same tensor "
            "alike, gathered or replicated: 1 counted once, spread to them, not 4 origins)") in render(report)
    jsonschema.validate(json.loads(json.dumps(report.to_dict())), load("diff-report"))


def test_a_nan_on_one_rank_only_is_counted_as_it_is(tmp_path):
    report = tracekit.diff(*_stores(tmp_path, nan_on={2}))
    s = next(s for s in report.summary if s.kind == "gradients")
    assert (s.cand_nonfinite, s.cand_nonfinite_once, s.alike_ranks) == (1, 1, ())
    assert "step 1 gradients: 0 in ref, 1 in cand, 1 mismatched\n" in render(report) + "\n"
