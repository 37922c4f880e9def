"""Near matches (compare/near.py): a candidate computed in other arithmetic is never equal to any
reference value bit for bit, yet its stale values and swapped data are named when it lies within
the tensor's own bound of the reference at another step or rank and far closer to it than to its
own; noise and a genuine error of a slowly-changing tensor are not. Synthetic stores, bf16 bounds
(the norm rule alone: rel_l2 = 0.0625) with a candidate carrying 1% noise on every value."""

import math

import jsonschema
import numpy as np
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.compare import near
from tracekit.schemas import load
from tracekit.testing import write_store

STEPS = (1, 2, 3, 4)
RANKS = (0, 1)
SHAPE = (64, 32)


def _ref_values():
    rng = np.random.default_rng(7)
    # outputs differ per rank (each its own data); gradients are the same on every rank (all-reduced)
    outputs = {(r, s): rng.standard_normal(SHAPE).astype(np.float32) for r in RANKS for s in STEPS}
    grads = {s: rng.standard_normal(SHAPE).astype(np.float32) for s in STEPS}
    return outputs, grads


def _write(path, outputs, grads):
    data = {r: {s: {"outputs": {"output": outputs[(r, s)]}, "gradients": {"w": grads[(r, s)]}} for s in STEPS}
            for r in RANKS}
    return write_store(path, data)


def _noisy(x, rng, rel=1e-2):
    return (x + rel * np.abs(x) * rng.standard_normal(x.shape)).astype(np.float32)


def _pair(tmp_path, change_outputs=None, change_grads=None):
    """The reference, and a candidate = reference + 1% noise, where change_*(rank, step, ref values)
    may plant a fault (it returns the values the candidate holds before its noise)."""
    outputs, grads = _ref_values()
    ref = _write(tmp_path / "ref", outputs, {(r, s): grads[s] for r in RANKS for s in STEPS})
    rng = np.random.default_rng(11)
    co = {(r, s): _noisy((change_outputs or (lambda r, s, o: o[(r, s)]))(r, s, outputs), rng)
          for r in RANKS for s in STEPS}
    cg = {(r, s): _noisy((change_grads or (lambda r, s, g: g[s]))(r, s, grads), rng) for r in RANKS for s in STEPS}
    return ref, _write(tmp_path / "cand", co, cg)


def _matches(report):
    return [s for s in report.signatures if s.shape in ("stale", "swapped")]


def test_clean_noisy_candidate_passes_with_no_match(tmp_path):
    ref, cand = _pair(tmp_path)
    report = tracekit.diff(ref, cand, precision="bf16")
    assert report.passed and not report.signatures


def test_a_stale_gradient_computed_elsewhere_is_named_with_how_close(tmp_path):
    # every rank's gradients at step 3 are its step 2's (not refreshed), in the candidate's arithmetic
    ref, cand = _pair(tmp_path, change_grads=lambda r, s, g: g[2] if s == 3 else g[s])
    report = tracekit.diff(ref, cand, precision="bf16")
    assert not report.passed
    (sig,) = _matches(report)
    assert (sig.step, sig.kind, sig.shape, sig.source_step, sig.all_ranks) == (3, "gradients", "stale", 2, True)
    # 1% noise against a value ~1.4x its size away: the match is far closer than the own reference
    assert 5e-3 < sig.near["rel_l2_err"] < 2e-2 and sig.near["closer"] >= near.NEAR_RATIO
    assert "equal the reference's step 2 within their bounds (rel L2 err" in sig.text
    assert "x closer than to their own step's), from step 3" in sig.text
    doc = report.to_dict()
    jsonschema.validate(doc, load("diff-report"))
    assert doc["first_divergence"]["signature"]["near"]["closer"] >= near.NEAR_RATIO
    out = CliRunner().invoke(main, ["diff", ref, cand, "--precision", "bf16"])
    assert out.exit_code == 1
    assert "gradients: stale: gradients on tensor w, all ranks equal the reference's step 2 within" in out.output


def test_an_oracle_verdict_looks_for_near_matches_by_the_two_way_bound(tmp_path):
    ref, cand = _pair(tmp_path, change_grads=lambda r, s, g: g[2] if s == 3 else g[s])
    (sig,) = _matches(tracekit.diff(ref, cand, precision="bf16", oracle=ref))
    assert (sig.shape, sig.source_step) == ("stale", 2) and sig.near["closer"] >= near.NEAR_RATIO


def test_swapped_outputs_computed_elsewhere_are_named(tmp_path):
    ref, cand = _pair(tmp_path, change_outputs=lambda r, s, o: o[(1 - r, s)] if s == 2 else o[(r, s)])
    report = tracekit.diff(ref, cand, precision="bf16")
    (sig,) = _matches(report)
    assert (sig.step, sig.kind, sig.shape, sig.source_ranks) == (2, "outputs", "swapped", [[0, 1], [1, 0]])
    assert sig.near["closer"] >= near.NEAR_RATIO
    assert "rank 0 holds rank 1's, rank 1 holds rank 0's reference value within its bound (rel L2 err" in sig.text
    jsonschema.validate(report.to_dict(), load("diff-report"))


def test_an_exact_match_still_says_exactly(tmp_path):
    outputs, grads = _ref_values()
    ref = _write(tmp_path / "ref", outputs, {(r, s): grads[s] for r in RANKS for s in STEPS})
    cand = _write(tmp_path / "cand", outputs, {(r, s): grads[2 if s == 3 else s] for r in RANKS for s in STEPS})
    (sig,) = _matches(tracekit.diff(ref, cand, precision="bf16"))
    assert sig.near is None and "equal the reference's step 2 exactly" in sig.text


def test_noise_far_outside_the_bound_matches_nothing(tmp_path):
    def wild(r, s, g):  # errors of the values' own size, at every step
        return g[s] * (1 + np.random.default_rng(s).standard_normal(SHAPE))

    ref, cand = _pair(tmp_path, change_grads=wild)
    report = tracekit.diff(ref, cand, precision="bf16")
    assert not report.passed and _matches(report) == []


def _norm_margin(ref, cand, tol):
    floor = tol["atol"] * math.sqrt(ref.size)
    return float(np.linalg.norm(cand - ref) / (tol["rel_l2"] * (np.linalg.norm(ref) + floor)))


def _slowly_changing(tmp_path):
    """Gradients that move by a sixth of the bound per step; at step 3 the candidate carries a
    genuine error just over its bound, partly against the last step's change, so that it lies
    within its bound of the reference's step 2 while failing at step 3."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    u, v = (w / np.linalg.norm(w) for w in rng.standard_normal((2, *SHAPE)))
    bound = 0.0625 * float(np.linalg.norm(x))
    grads = {s: (x + (s - 1) * bound * (0.05 * v - 0.15 * u)).astype(np.float32) for s in STEPS}
    error = (1.1 * bound * u).astype(np.float32)
    ref = write_store(tmp_path / "ref", {r: {s: {"gradients": {"w": grads[s]}} for s in STEPS} for r in RANKS})
    cand = write_store(tmp_path / "cand", {r: {s: {"gradients": {"w": grads[s] + (error if s == 3 else 0)}}
                                               for s in STEPS} for r in RANKS})
    return ref, cand, grads, error


def test_a_genuine_error_of_a_slowly_changing_tensor_is_not_stale(tmp_path, monkeypatch):
    ref, cand, grads, error = _slowly_changing(tmp_path)
    report = tracekit.diff(ref, cand, precision="bf16")
    tol = report.tolerances[0]
    # the trap: failing at its own step, within the bound of the step before
    assert _norm_margin(grads[3], grads[3] + error, tol) > 1 > _norm_margin(grads[2], grads[3] + error, tol)
    assert not report.passed and _matches(report) == []
    # the ratio rule is what says no: without it, the step before would be taken
    monkeypatch.setattr(near, "NEAR_RATIO", 1.0)
    (sig,) = _matches(tracekit.diff(ref, cand, precision="bf16"))
    assert sig.shape == "stale" and sig.source_step in (1, 2) and sig.near["closer"] < 2


def test_no_near_match_is_looked_for_past_the_read_budget(tmp_path, monkeypatch):
    ref, cand = _pair(tmp_path, change_grads=lambda r, s, g: g[2] if s == 3 else g[s])
    monkeypatch.setattr(near, "READ_BUDGET", 64 * 32)  # the candidate's value alone: no reference value read
    report = tracekit.diff(ref, cand, precision="bf16")
    assert not report.passed and _matches(report) == []


def test_format_1_stores_are_not_looked_at(tmp_path):
    fmt = 1  # no content hashes, no objects to read a whole tensor from
    outputs, grads = _ref_values()
    data = lambda g: {r: {s: {"gradients": {"w": g(s)}} for s in STEPS} for r in RANKS}  # noqa: E731
    ref = write_store(tmp_path / "ref", data(lambda s: grads[s]), format_version=fmt)
    rng = np.random.default_rng(1)
    cand = write_store(tmp_path / "cand", data(lambda s: _noisy(grads[2 if s == 3 else s], rng)), format_version=fmt)
    report = tracekit.diff(ref, cand, precision="bf16")
    assert not report.passed and _matches(report) == []
