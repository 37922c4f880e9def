"""Alignment modes (rank, coords, global), structural problems, and the three-way verdict."""

import numpy as np
import pytest
from tests.tracekit.compare.test_faults import train

import tracekit
from tracekit.errors import UsageError
from tracekit.testing import write_store


def test_global_2_ranks_against_4_ranks_passes(tmp_path):
    ref = write_store(tmp_path / "ddp2", train(world=2))
    cand = write_store(tmp_path / "ddp4", train(world=4))
    report = tracekit.diff(ref, cand, align="global", details="all")
    assert report.status == "pass", report.structural
    assert report.summary_line == "PASS comparison ranks=4 steps=6"
    (nc,) = report.not_comparable
    assert nc.kind == "outputs" and "data-parallel" in nc.reason
    assert {r.kind for r in report.results} == {"loss", "gradients", "parameters", "deltas"}
    assert {r.rank for r in report.results} == {0, 1, 2, 3} and {r.ref_rank for r in report.results} == {0}
    assert report.to_dict()["not_comparable"][0]["kind"] == "outputs"
    # by rank, the same pair is unusable: ranks 2-3 exist on one side only, outputs differ in shape
    by_rank = tracekit.diff(ref, cand)
    assert by_rank.status == "error"
    problems = {(p.problem, p.side) for p in by_rank.structural}
    assert ("missing_rank", "ref") in problems and ("shape_mismatch", None) in problems


def test_global_catches_a_fault_on_every_candidate_rank(tmp_path):
    ref = write_store(tmp_path / "ddp2", train(world=2))
    cand = write_store(tmp_path / "ddp4", train(world=4, lr_scale=1.01))
    d = tracekit.diff(ref, cand, align="global").first_divergence
    assert (d.step, d.kind, d.ranks) == (1, "parameters", [0, 1, 2, 3])


def test_global_compares_outputs_when_the_data_layout_matches(tmp_path):
    ref = write_store(tmp_path / "a", train(world=2))
    cand = write_store(tmp_path / "b", train(world=2))
    report = tracekit.diff(ref, cand, align="global", details="all")
    assert report.passed and report.not_comparable == []
    outs = {(r.rank, r.ref_rank) for r in report.results if r.kind == "outputs"}
    assert outs == {(0, 0), (1, 1)}  # paired by data-parallel rank


def _mesh_run(order):
    """4 ranks on a (dp=2, tp=2) mesh; rank r of this run sits at mesh position order[r]."""
    data, coords = {}, {}
    for r, pos in enumerate(order):
        dp, tp = divmod(pos, 2)
        out = np.full((2, 3), 10.0 * pos, np.float32) + np.arange(6, dtype=np.float32).reshape(2, 3)
        data[r] = {1: {"outputs": {"out": out}, "loss": {"loss": np.float32(0.5)},
                       "gradients": {"w": np.full(4, 1.0 + pos, np.float32)}}}
        coords[r] = {"rank": r, "world_size": 4, "dp_degree": 2, "dp_rank": dp, "tp_degree": 2, "tp_rank": tp,
                     "meshes": [{"dim_names": ["dp", "tp"], "shape": [2, 2], "coordinate": [dp, tp]}]}
    return data, coords


def test_coords_alignment_with_permuted_rank_order(tmp_path):
    ref = write_store(tmp_path / "ref", *_mesh_run([0, 1, 2, 3])[:1], coords=_mesh_run([0, 1, 2, 3])[1])
    data, coords = _mesh_run([2, 0, 3, 1])
    cand = write_store(tmp_path / "cand", data, coords=coords)
    assert tracekit.diff(ref, cand).first_divergence.kind == "outputs"
    report = tracekit.diff(ref, cand, align="coords", details="all")
    assert report.passed and report.summary_line == "PASS comparison ranks=4 steps=1"
    assert {(r.rank, r.ref_rank) for r in report.results} == {(0, 2), (1, 0), (2, 3), (3, 1)}


def test_coords_alignment_without_coordinates_or_with_duplicates(tmp_path):
    data = {0: {1: {"loss": {"loss": np.float32(1)}}}, 1: {1: {"loss": {"loss": np.float32(1)}}}}
    bare = write_store(tmp_path / "bare", data, coords={0: {"rank": 0}, 1: {"rank": 1}})
    with pytest.raises(UsageError, match="has no mesh coordinates"):
        tracekit.diff(bare, bare, align="coords")
    dup = write_store(tmp_path / "dup", data, coords={r: {"rank": r, "dp_rank": 0, "tp_rank": 0} for r in (0, 1)})
    with pytest.raises(UsageError, match="ranks 0 and 1 have the same coordinates"):
        tracekit.diff(dup, dup, align="coords")


def test_structural_problems_are_listed_and_allow_missing_compares_the_rest(tmp_path):
    f = np.float32
    ref = write_store(tmp_path / "ref", {
        0: {1: {"loss": {"loss": f(1)}, "gradients": {"a": np.ones(3, f), "b": np.ones(2, f), "c": np.ones(2, f), "d": np.ones(2, f)},
                "deltas": {"a": np.ones(3, f)}}},
        1: {1: {"loss": {"loss": f(1)}}}})
    cand = write_store(tmp_path / "cand", {
        0: {1: {"loss": {"loss": f(1)}, "gradients": {"a": np.ones(3, f), "b": np.ones(3, f), "c": np.ones(2, np.int64),
                                                      "e": np.ones(1, f)}}}})
    report = tracekit.diff(ref, cand)
    assert report.status == "error" and report.exit_code == 2
    found = {(p.problem, p.side, p.tensor) for p in report.structural}
    assert found == {("missing_rank", "cand", None), ("missing_kind", "cand", None), ("missing_tensor", "cand", "d"),
                     ("missing_tensor", "ref", "e"), ("shape_mismatch", None, "b"), ("dtype_mismatch", None, "c")}
    msgs = " | ".join(p.message for p in report.structural)
    assert "cand lacks rank 1" in msgs and "dtype float32 in ref, int64 in cand" in msgs
    common = tracekit.diff(ref, cand, allow_missing=True, details="all")
    assert common.status == "pass"
    assert {(r.kind, r.tensor) for r in common.results} == {("loss", "loss"), ("gradients", "a")}
    assert len(common.to_dict()["skipped"]) == 6


def test_kinds_option(tmp_path):
    ref = write_store(tmp_path / "ref", train(steps=1))
    cand = write_store(tmp_path / "cand", train(steps=1, lr_scale=1.01))  # the update is off, nothing before it
    assert not tracekit.diff(ref, cand).passed
    report = tracekit.diff(ref, cand, kinds=["outputs", "loss", "gradients"])
    assert report.passed and {s.kind for s in report.summary} == {"outputs", "loss", "gradients"}
    with pytest.raises(UsageError, match="no store has activations"):
        tracekit.diff(ref, cand, kinds=["activations"])


def test_oracle_three_way_verdict(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(500, 1000, size=64)  # float32 ulp here is ~6e-5, above the default atol
    oracle = write_store(tmp_path / "oracle", {0: {1: {"parameters": {"w": x}}}})  # float64
    ref = write_store(tmp_path / "ref", {0: {1: {"parameters": {"w": x.astype(np.float32)}}}})
    same = write_store(tmp_path / "same", {0: {1: {"parameters": {"w": x.astype(np.float32)}}}})
    far = x.astype(np.float32)
    far[5] += np.float32(0.01)  # ~100x further from the oracle than float32 rounding
    far = write_store(tmp_path / "far", {0: {1: {"parameters": {"w": far}}}})
    assert tracekit.diff(ref, same, oracle=oracle).passed
    report = tracekit.diff(ref, far, oracle=oracle)
    d = report.first_divergence
    assert d.worst.index == (5,) and d.metrics.violations == 1
    assert d.worst.oracle == x[5]
    assert d.worst.cand_oracle_err > 3 * d.worst.ref_oracle_err
    assert d.metrics.oracle.cand_max_err > d.metrics.oracle.ref_max_err > 0
    assert report.options["oracle_factor"] == 3.0 and report.oracle["path"] == oracle
    # an oracle missing the step is a structural problem of the oracle
    short = write_store(tmp_path / "short", {0: {2: {"parameters": {"w": x}}}})
    bad = tracekit.diff(ref, far, oracle=short)
    assert bad.status == "error" and any(p.side == "oracle" for p in bad.structural)


def test_floats_stored_in_other_widths_are_compared_under_the_coarser_widths_bounds(tmp_path):
    """An accelerator's bfloat16 output against a CPU reference's float32 one: a pair to compare, not a
    structural problem; the bounds are bfloat16's, so a 10% error fails and bfloat16 rounding passes."""
    import torch

    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    f = np.float32

    def pair(name, cand_output):
        ref = write_store(tmp_path / name / "ref", {0: {1: {"loss": {"loss": f(1)}, "outputs": {"output": x}}}})
        cand = write_store(tmp_path / name / "cand", {0: {1: {"loss": {"loss": f(1)}, "outputs": {"output": cand_output}}}})
        return tracekit.diff(ref, cand, details="all")

    rounded = pair("rounded", x.to(torch.bfloat16))
    assert rounded.status == "pass" and not rounded.structural
    assert [p.problem for p in rounded.mixed_dtypes] == ["dtype_differs"]
    assert "float32 in ref, bfloat16 in cand" in rounded.mixed_dtypes[0].message
    assert {r.dtype for r in rounded.results if r.kind == "outputs"} == {"bfloat16"}
    assert rounded.to_dict()["mixed_dtypes"][0]["tensor"] == "output"
    scaled = pair("scaled", (x * 1.1).to(torch.bfloat16))
    assert scaled.status == "fail" and scaled.first_divergence.kind == "outputs"
    # a float64 reference against float32 is the same case, judged under float32's bounds
    wide = pair("wide", x.double().float().numpy().astype(np.float64))
    assert wide.status == "pass"
