"""The shapes beyond the scale (compare/structure.py, compare/patterns.py) on synthetic errors:
a constant shift, a sign flip (of a kind or of one tensor), one rank only and NaN/Inf patterns are
named, and noise alone, however large, is none of them."""

import numpy as np

from tracekit.compare.signatures import step_shapes
from tracekit.compare.metrics import compare_arrays
from tracekit.compare.report import TensorResult

RNG = np.random.default_rng(1)
REF = {f"w{i}": (RNG.standard_normal(20_000) + 0.3).astype(np.float32) for i in range(3)}


def _results(kind, change=lambda rank, name, ref: ref, noise=2e-2, ranks=(0, 1)):
    out = []
    for rank in ranks:
        for i, (name, ref) in enumerate(REF.items()):
            rng = np.random.default_rng(1000 + 100 * rank + i)
            cand = change(rank, name, ref) + noise * np.abs(ref) * rng.standard_normal(ref.size)
            m = compare_arrays(ref, cand.astype(np.float32), rtol=1.6e-2, atol=1e-5, rel_l2=5e-2)
            out.append(TensorResult(1, kind, rank, rank, name, "float32", ref.shape, m))
    return out


def _shapes(kind, results):
    return [s.shape for s in step_shapes(1, kind, results)[0]]


def test_noise_alone_has_no_shape_in_any_kind():
    for kind in ("outputs", "gradients", "deltas", "parameters"):
        for noise in (1e-6, 2e-2, 0.5):
            assert _shapes(kind, _results(kind, noise=noise)) == [], (kind, noise)


def test_a_constant_shift_below_the_noise_is_systematic():
    sigs = step_shapes(1, "outputs", _results("outputs", lambda r, n, ref: ref + 2e-3))[0]
    assert [s.shape for s in sigs] == ["shift"]
    s = sigs[0]
    assert s.all_ranks and abs(s.offset - 2e-3) < 5e-4 and s.z > 20
    assert "outputs = reference +0.00" in s.text and "a constant shift" in s.text
    # the same shift, much smaller than the float32 values can carry, is not
    assert _shapes("outputs", _results("outputs", lambda r, n, ref: ref + 1e-9, noise=0)) == []


def test_a_scale_of_values_with_a_mean_is_a_scale_not_a_shift():
    sigs = step_shapes(1, "gradients", _results("gradients", lambda r, n, ref: ref * 1.002))[0]
    assert [s.shape for s in sigs] == ["scale"]


def test_a_sign_flip_of_the_kind_and_of_one_tensor():
    sigs = step_shapes(1, "deltas", _results("deltas", lambda r, n, ref: -ref))[0]
    assert [s.shape for s in sigs] == ["sign flip"] and "a sign flip of the update" in sigs[0].text
    one = step_shapes(1, "gradients", _results("gradients", lambda r, n, ref: -ref if n == "w1" else ref))[0]
    assert [(s.shape, s.tensor, s.tensors) for s in one] == [("sign flip", "w1", 1)]
    assert one[0].text.startswith("systematic: gradients = -1.000") and "tensor w1, all ranks" in one[0].text


def test_one_tensors_shift_is_named_though_the_kind_pooled_shows_none():
    sigs = step_shapes(1, "outputs", _results("outputs", lambda r, n, ref: ref + 0.05 if n == "w2" else ref, noise=0))[0]
    assert [(s.shape, s.tensor) for s in sigs] == [("shift", "w2")]


def test_one_rank_only_in_a_replicated_kind_is_a_signature_even_inside_the_bounds():
    def rank1(rank, name, ref):
        return ref + (1e-4 * RNG.standard_normal(ref.size) * np.abs(ref) if rank == 1 else 0)

    rs = _results("gradients", rank1, noise=0)
    assert all(r.passed for r in rs)
    sigs = step_shapes(1, "gradients", rs)[0]
    assert [(s.shape, s.ranks) for s in sigs] == [("one rank", [1])]
    assert "differ on rank 1 only" in sigs[0].text and "replicas disagree" in sigs[0].text
    # outputs may legitimately differ on one rank: named only where they fail
    assert _shapes("outputs", _results("outputs", rank1, noise=0)) == []
    # every rank differing is no one rank's
    assert _shapes("gradients", _results("gradients", noise=1e-4)) == []


def test_nonfinite_pattern_names_rank_tensor_and_extent():
    def nan_all(rank, name, ref):
        return np.full_like(ref, np.nan) if (rank, name) == (1, "w0") else ref

    sigs = step_shapes(1, "gradients", _results("gradients", nan_all, noise=0))[0]
    assert sigs[0].shape == "nonfinite" and sigs[0].ranks == [1] and sigs[0].tensor == "w0"
    assert "every element of tensor w0, rank 1 only" in sigs[0].text

    def one_inf(rank, name, ref):
        out = ref.copy()
        out[5] = np.inf
        return out

    sig = step_shapes(1, "outputs", _results("outputs", one_inf, noise=0))[0][0]
    assert sig.shape == "nonfinite" and sig.all_ranks and "6 elements of 3 tensors (w0, ...), all ranks" in sig.text


def test_exact_matches_are_not_looked_for_across_layouts():
    # --align global pairs are not one rank's tensors against another rank's: no stale/swapped search
    from tracekit.compare.signatures import matcher

    assert matcher(None, [], "global") is None and matcher(None, [], "rank") is not None
