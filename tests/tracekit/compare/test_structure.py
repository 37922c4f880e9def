"""Structured-error fits (tracekit/compare/structure.py) on synthetic errors: a scale is found far
below the noise, noise alone is rounding-like, and one rank's scale is said to be that rank's."""

import numpy as np

from tracekit.compare.metrics import compare_arrays
from tracekit.compare.report import TensorResult
from tracekit.compare.structure import step_signature

RNG = np.random.default_rng(0)
REF = {f"w{i}": RNG.standard_normal(20_000).astype(np.float32) for i in range(3)}


def _results(kind, scale_by_rank, noise=2e-2, ranks=(0, 1)):
    out = []
    for rank in ranks:
        for i, (name, ref) in enumerate(REF.items()):
            rng = np.random.default_rng(100 * rank + i + 1)
            cand = ref * (1 + scale_by_rank.get(rank, 0.0)) + noise * np.abs(ref) * rng.standard_normal(ref.size)
            m = compare_arrays(ref, cand.astype(np.float32), rtol=1.6e-2, atol=1e-5)
            out.append(TensorResult(1, kind, rank, rank, name, "float32", ref.shape, m))
    return out


def test_a_scale_ten_times_below_the_noise_is_systematic_on_every_rank():
    sig, max_z, differs = step_signature(1, "deltas", _results("deltas", {0: 1e-3, 1: 1e-3}, noise=1e-2))
    assert sig is not None and differs and sig.all_ranks and sig.ranks == [0, 1]
    assert abs(sig.factor - 1.001) < 2e-4 and sig.z > 20
    assert sig.text.startswith("systematic: deltas = 1.00") and "a scale such as the learning rate" in sig.text


def test_noise_alone_is_rounding_like():
    sig, max_z, differs = step_signature(1, "gradients", _results("gradients", {}))
    assert sig is None and differs and max_z < 5


def test_one_ranks_scale_is_that_ranks_only():
    sig, _, _ = step_signature(1, "gradients", _results("gradients", {1: 1e-2}))
    assert sig is not None and sig.ranks == [1] and not sig.all_ranks and "on rank 1 only" in sig.text
    assert abs(sig.factor - 1.01) < 2e-3  # rank 1's own factor, not diluted by rank 0


def test_copies_of_one_tensor_on_many_ranks_are_not_more_evidence():
    # replicated gradients: 16 ranks holding the same noisy tensor must not add up to a signature
    # that one rank's copy does not show (z is taken over one rank's worth of elements)
    one = _results("gradients", {0: 2e-3}, ranks=(0,))
    many = [TensorResult(r.step, r.kind, rank, rank, r.tensor, r.dtype, r.shape, r.metrics) for rank in range(16) for r in one]
    z_one = step_signature(1, "gradients", one)[1]
    z_many = step_signature(1, "gradients", many)[1]
    assert abs(z_many - z_one) < 1e-6


def test_kinds_without_a_scale_meaning_are_not_fitted():
    sig, max_z, differs = step_signature(1, "parameters", _results("parameters", {0: 1e-2, 1: 1e-2}))
    assert sig is None and max_z == 0.0


def test_a_scale_within_a_few_float32_roundings_of_one_is_never_a_signature():
    # errors far below float32's resolution that correlate with the values (seen between two
    # layouts' gradients, 1e-8 relative): strongly significant, but no value can carry such a scale
    from tracekit.compare.structure import SCALE_FLOOR, Fit

    ref = REF["w0"].astype(np.float64)
    for k_minus_1, systematic in ((SCALE_FLOOR / 10, False), (SCALE_FLOOR * 10, True)):
        diff = k_minus_1 * ref + 0.3 * k_minus_1 * np.abs(ref) * np.random.default_rng(7).standard_normal(ref.size)
        fit = Fit()
        fit.add((float(ref @ ref), float(ref @ diff), float(diff @ diff)), ref.size)
        assert abs(fit.z()) > 20 and abs(fit.rho) > 0.05  # significant by z and rho alike
        assert fit.significant() is systematic
