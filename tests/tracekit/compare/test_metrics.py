"""The closeness rule and metrics of tracekit.compare.metrics, against numpy and torch."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tracekit
from tracekit.compare import metrics as M
from tracekit.compare import compare_arrays


def _pairs(dtype, allow_nonfinite):
    elems = st.floats(width=np.dtype(dtype).itemsize * 8, allow_nan=allow_nonfinite, allow_infinity=allow_nonfinite,
                      min_value=None if allow_nonfinite else -1e6, max_value=None if allow_nonfinite else 1e6)
    n = st.integers(1, 40)
    return n.flatmap(lambda k: st.tuples(hnp.arrays(dtype, k, elements=elems), hnp.arrays(dtype, k, elements=elems)))


def _perturbed(dtype):
    """Reference values, and candidates at a distance comparable with the tolerance (the boundary matters)."""
    base = hnp.arrays(dtype, st.integers(1, 40), elements=st.floats(-100, 100, width=np.dtype(dtype).itemsize * 8))
    scale = st.sampled_from([0.0, 1e-8, 1e-6, 1e-5, 3e-5, 1e-3])
    return st.tuples(base, scale, st.integers(0, 2**32 - 1)).map(
        lambda t: (t[0], (t[0] + np.random.default_rng(t[2]).standard_normal(t[0].shape) * t[1] * (1 + np.abs(t[0]))).astype(dtype)))


tols = st.tuples(st.sampled_from([0.0, 1e-7, 1.3e-6, 1e-5, 1e-3]), st.sampled_from([0.0, 1e-7, 1e-5, 1e-3]))


@settings(max_examples=300, deadline=None)
@given(pair=st.one_of(_perturbed(np.float32), _perturbed(np.float64), _pairs(np.float32, True), _pairs(np.float64, True)),
       tol=tols, equal_nan=st.booleans())
def test_violations_match_numpy_isclose_and_torch_assert_close(pair, tol, equal_nan):
    ref, cand = pair
    rtol, atol = tol
    m = compare_arrays(ref, cand, rtol=rtol, atol=atol, equal_nan=equal_nan)
    close = np.isclose(cand, ref, rtol=rtol, atol=atol, equal_nan=equal_nan)
    # numpy calls a finite value close to an infinity when atol/rtol cover it; torch and tracekit never do
    close &= ~(np.isinf(ref) | np.isinf(cand)) | (ref == cand)
    assert m.violations == int((~close).sum())
    try:
        torch.testing.assert_close(torch.from_numpy(cand), torch.from_numpy(ref), rtol=rtol, atol=atol, equal_nan=equal_nan)
        torch_passed = True
    except AssertionError:
        torch_passed = False
    assert m.passed == torch_passed


@settings(max_examples=200, deadline=None)
@given(pair=st.one_of(_perturbed(np.float32), _perturbed(np.float64)), tol=tols)
def test_metrics_match_float64_reference(pair, tol):
    ref, cand = pair
    m = compare_arrays(ref, cand, rtol=tol[0], atol=tol[1])
    a, b = ref.astype(np.float64), cand.astype(np.float64)
    d = np.abs(b - a)
    assert m.numel == ref.size
    assert m.max_abs_err == pytest.approx(d.max(), rel=1e-6, abs=0)
    with np.errstate(all="ignore"):
        rel = np.where(d == 0, 0.0, d / np.abs(a))
    assert m.max_rel_err == pytest.approx(rel.max(), rel=1e-6)
    na, nd, nb = np.linalg.norm(a), np.linalg.norm(b - a), np.linalg.norm(b)
    if np.any((a != 0) & (np.abs(a) < 1e-150)):
        return  # float64 squares below 1e-300 lose digits to underflow: numpy's norms are no reference there
    expected_l2 = nd / na if na else (0.0 if nd == 0 else math.inf)
    assert m.rel_l2_err == pytest.approx(expected_l2, rel=1e-4, abs=1e-12)
    expected_cos = float(a @ b / (na * nb)) if na and nb else (1.0 if nd == 0 else 0.0)
    assert m.cosine == pytest.approx(expected_cos, abs=1e-6)
    assert m.violation_fraction == m.violations / m.numel
    # the worst element is a real element with both values as recorded
    w = m.worst
    assert ref[w.index] == w.ref and cand[w.index] == w.cand
    if m.violations:
        assert not np.isclose(cand[w.index], ref[w.index], rtol=tol[0], atol=tol[1])


def test_cosine_keeps_its_digits_near_one():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(100_000)
    b = a + rng.standard_normal(a.size) * 1e-7
    m = compare_arrays(a, b, rtol=0, atol=0)
    exact = 1 - (a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))  # float64 reference, ~1e-14
    assert 1 - m.cosine == pytest.approx(exact, rel=1e-2)


@pytest.mark.parametrize("block", [7, 1000, 1 << 15])
def test_blocks_and_merges_give_the_same_metrics(block, monkeypatch):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((50, 41)).astype(np.float32)
    cand = ref + (rng.standard_normal(ref.shape) * 1e-5).astype(np.float32)
    cand[3, 7] = np.nan
    whole = compare_arrays(ref, cand, rtol=1.3e-6, atol=1e-5)
    monkeypatch.setattr(M, "BLOCK_ELEMENTS", block)
    flat_r, flat_c = ref.reshape(-1), cand.reshape(-1)
    first = M.MetricsAccumulator(1.3e-6, 1e-5)
    first.update(flat_r[:1000], flat_c[:1000], offset=0)
    second = M.MetricsAccumulator(1.3e-6, 1e-5)
    second.update(flat_r[1000:], flat_c[1000:], offset=1000)
    merged = first.merge(second).result(ref.shape)
    assert merged.violations == whole.violations > 1
    assert merged.nonfinite == whole.nonfinite == 1
    assert merged.worst.index == whole.worst.index == (3, 7) and math.isnan(merged.worst.cand)
    assert merged.worst.ref == whole.worst.ref
    assert merged.max_abs_err == whole.max_abs_err
    assert merged.rel_l2_err == pytest.approx(whole.rel_l2_err, rel=1e-5)


def test_nonfinite_rules():
    ref = np.array([1.0, np.nan, np.inf, np.inf, 2.0, np.nan], dtype=np.float32)
    cand = np.array([np.nan, np.nan, np.inf, -np.inf, np.inf, 3.0], dtype=np.float32)
    m = compare_arrays(ref, cand, rtol=1, atol=1e30)  # huge tolerances: only the NaN/Inf rules can fail
    # NaN where ref is finite; NaN==NaN without equal_nan; +inf vs -inf; inf where ref is finite; NaN ref vs number
    assert (m.violations, m.nonfinite) == (5, 5)
    assert m.worst.index == (0,) and math.isnan(m.worst.cand)
    m = compare_arrays(ref, cand, rtol=1, atol=1e30, equal_nan=True)
    assert m.violations == 4
    # errors are over the elements finite on both sides: here there is none, so no error is 0
    assert m.compared == 0
    assert (m.max_abs_err, m.max_rel_err, m.rel_l2_err, m.cosine) == (None, None, None, None)
    assert (m.counts.ref_nan, m.counts.ref_inf, m.counts.cand_nan, m.counts.cand_inf) == (2, 2, 2, 3)


def test_all_nan_candidate_is_not_reported_identical():
    """Issue 9: a candidate tensor that is all NaN read as max abs 0 and cosine 1."""
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    cand = np.full_like(ref, np.nan)
    m = compare_arrays(ref, cand, rtol=1.3e-6, atol=1e-5, rel_l2=8e-6)
    assert not m.passed and m.violations == m.nonfinite == 64
    assert m.compared == 0 and m.cosine is None and m.max_abs_err is None and m.rel_l2_err is None
    assert m.margin == math.inf and m.margin_rule == "nonfinite"
    d = m.to_dict()
    assert d["cosine"] is None and d["max_abs_err"] is None
    assert d["nonfinite_counts"] == {"ref_nan": 0, "ref_inf": 0, "cand_nan": 64, "cand_inf": 0}


def test_candidate_only_nan_is_a_violation_unless_paired():
    ref = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    cand = np.array([1.0, np.nan, np.nan], dtype=np.float32)
    # element 2: NaN only in the candidate -> always out, even with equal_nan and huge tolerances
    m = compare_arrays(ref, cand, rtol=1e9, atol=1e9, equal_nan=True)
    assert (m.violations, m.nonfinite) == (1, 1)
    assert m.compared == 1 and m.max_abs_err == 0.0 and m.cosine == 1.0  # the one comparable element
    # element 1 (NaN on both sides) is paired only with equal_nan
    assert compare_arrays(ref, cand, rtol=1e9, atol=1e9).violations == 2
    assert compare_arrays(ref[:2], cand[:2], rtol=0, atol=0, equal_nan=True).passed


def test_exact_and_integers():
    ref = np.array([1, 2, 3], dtype=np.int64)
    assert compare_arrays(ref, ref.copy(), rtol=0, atol=0).passed
    m = compare_arrays(ref, np.array([1, 2, 4]), rtol=0, atol=0)
    assert (m.violations, m.max_abs_err, m.worst.index) == (1, 1.0, (2,))
    b = np.array([True, False])
    assert compare_arrays(b, ~b, rtol=0, atol=0).violations == 2
    z = np.zeros(4, np.float32)
    m = compare_arrays(z, z, rtol=0, atol=0)
    assert (m.cosine, m.rel_l2_err, m.max_rel_err) == (1.0, 0.0, 0.0)
    m = compare_arrays(z, z + 1, rtol=0, atol=0)
    assert (m.cosine, m.rel_l2_err, m.max_rel_err) == (0.0, math.inf, math.inf)


def test_torch_tensors_and_bfloat16_are_accepted():
    a = torch.linspace(-2, 2, 100, dtype=torch.bfloat16)
    b = a.clone()
    b[10] = b[10] * 1.1
    m = compare_arrays(a, b, rtol=1.6e-2, atol=1e-5)
    assert m.violations == 1 and m.worst.index == (10,)


def test_oracle_rule_and_both_errors():
    oracle = np.array([1.0, 1.0, 1.0, 1.0])
    ref = np.array([1.0 + 1e-6, 1.0 + 1e-6, 1.0, 1.0], dtype=np.float32).astype(np.float64)
    # within 3x the reference's own error; 10x it; equal to the oracle; off where the reference is exact
    cand = np.array([1.0 + 2e-6, 1.0 + 1e-5, 1.0, 1.0 + 1e-6])
    m = compare_arrays(ref.astype(np.float32), cand.astype(np.float32), rtol=0, atol=0, oracle=oracle)
    assert m.oracle.factor == 3.0
    assert m.violations == 2
    assert m.worst.index == (1,)
    assert m.worst.oracle == 1.0
    assert m.worst.cand_oracle_err == pytest.approx(1e-5, rel=0.1)
    assert m.worst.ref_oracle_err == pytest.approx(1e-6, rel=0.2)
    assert m.oracle.cand_max_err == pytest.approx(1e-5, rel=0.1) and m.oracle.ref_max_err == pytest.approx(1e-6, rel=0.2)
    # atol is added to the bound; a larger factor lets the second element through
    assert compare_arrays(ref, cand, rtol=0, atol=2e-6, oracle=oracle).violations == 1
    assert compare_arrays(ref, cand, rtol=0, atol=2e-6, oracle=oracle, oracle_factor=20).violations == 0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        compare_arrays(np.zeros(3), np.zeros(4), rtol=0, atol=0)


def test_json_safe_numbers():
    m = compare_arrays(np.zeros(2, np.float32), np.array([0, 1], np.float32), rtol=0, atol=0)
    d = m.to_dict()
    assert d["max_rel_err"] == "inf" and d["rel_l2_err"] == "inf" and d["passed"] is False


@pytest.mark.parametrize("dtype, ref, cand", [
    (np.int64, 2**53 + 1, 2**53),  # one apart, equal once in float64
    (np.int64, -(2**63), 2**63 - 1),  # the difference overflows int64
    (np.uint64, 2**64 - 1, 2**64 - 2),
])
def test_64_bit_integers_compare_exactly(dtype, ref, cand):
    m = compare_arrays(np.array([7, ref], dtype), np.array([7, cand], dtype), rtol=0, atol=0)
    assert (m.passed, m.violations, m.nonfinite) == (False, 1, 0)
    assert m.worst.index == (1,) and (m.worst.ref, m.worst.cand) == (ref, cand)  # every digit kept
    assert m.max_abs_err == float(abs(cand - ref)) and m.worst.abs_err == float(abs(cand - ref))
    assert compare_arrays(np.array([ref], dtype), np.array([ref], dtype), rtol=0, atol=0).passed


def test_integer_tolerances_use_the_exact_difference():
    big = 2**53
    ref = np.array([big, big, 100], np.int64)
    cand = np.array([big + 1, big + 2, 101], np.int64)
    assert compare_arrays(ref, cand, rtol=0, atol=1).violations == 1  # big + 2 only
    assert compare_arrays(ref, cand, rtol=0, atol=2).passed
    # 2**53 + 3 rounds to 2**53 + 4 in float64: the exact difference, 3, is within atol=3
    assert compare_arrays(np.int64([big]), np.int64([big + 3]), rtol=0, atol=3).passed
    assert compare_arrays(np.int64([big]), np.int64([big + 3]), rtol=0, atol=2.9).violations == 1
    assert compare_arrays(np.int32([100]), np.int32([111]), rtol=0.1, atol=0).violations == 1
    assert compare_arrays(np.int32([100]), np.int32([110]), rtol=0.1, atol=0).passed


def test_int64_beyond_2_53_fails_the_diff(tmp_path):
    from tracekit.testing import write_store

    a = write_store(tmp_path / "a", {0: {1: {"outputs": {"ids": np.array([2**53 + 1], np.int64)}}}})
    b = write_store(tmp_path / "b", {0: {1: {"outputs": {"ids": np.array([2**53], np.int64)}}}})
    report = tracekit.diff(a, b)
    assert report.status == "fail" and report.first_divergence.worst.ref == 2**53 + 1


def test_complex_relative_error_warns_nothing():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ComplexWarning would mean the |ref| buffer was complex
        m = compare_arrays(np.array([1 + 1j, 2], np.complex64), np.array([1 + 2j, 2], np.complex64), rtol=0, atol=0)
    assert m.violations == 1 and m.max_rel_err == pytest.approx(1 / abs(1 + 1j), rel=1e-6)
