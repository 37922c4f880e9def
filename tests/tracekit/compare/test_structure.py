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


# ---- the compute dtype's own bias (under a precision rule) ----

U_BF16 = 2.0 ** -8


def _biased(kind, scale_by_rank, noise=6e-3):
    """A bf16 forward's error as seen against float32: noise of 6e-3 relative (TorchTitan's logits)
    and a small rescale per rank."""
    return _results(kind, scale_by_rank, noise=noise)


def test_a_bf16_like_bias_of_the_outputs_on_every_rank_is_rounding_like():
    from tracekit.compare.structure import bias_floor

    rs = _biased("outputs", {0: 0.23 * U_BF16, 1: 0.21 * U_BF16})  # k = 1.0009 / 1.0008, as measured
    sig, max_z, _ = step_signature(1, "outputs", rs)  # float32: no floor, a signature
    assert sig is not None and sig.all_ranks and max_z > 20
    biases = []
    sig, max_z_rule, _ = step_signature(1, "outputs", rs, bias_floor("outputs", "bfloat16"), biases)
    assert sig is None and max_z_rule == max_z  # the fit is as strong: only its reading changes
    assert len(biases) == 1 and biases[0].shape == "scale" and abs(biases[0].size - 0.22 * U_BF16) < 0.05 * U_BF16
    assert biases[0].floor == U_BF16


def test_a_gradient_bias_is_rounding_like_and_a_scale_above_the_unit_roundoff_is_not():
    from tracekit.compare.structure import bias_floor

    floor = bias_floor("gradients", "bfloat16")
    assert floor == U_BF16
    assert step_signature(1, "gradients", _biased("gradients", {0: 5e-4, 1: 5e-4}), floor)[0] is None
    sig = step_signature(1, "gradients", _biased("gradients", {0: 1e-2, 1: 1e-2}), floor)[0]
    assert sig is not None and sig.all_ranks and abs(sig.factor - 1.01) < 2e-3


def test_an_lr_like_scale_of_the_deltas_stays_flagged_under_a_bf16_rule():
    from tracekit.compare.structure import bias_floor

    floor = bias_floor("deltas", "bfloat16")
    assert floor == 0.0  # the optimizer's float32 update keeps its sensitivity
    sig = step_signature(1, "deltas", _results("deltas", {0: 1e-3, 1: 1e-3}, noise=1e-2), floor)[0]
    assert sig is not None and abs(sig.factor - 1.001) < 2e-4


def test_one_ranks_scale_or_opposite_scales_are_no_bias_of_the_arithmetic():
    # every rank runs the same arithmetic: its bias has one sign on all of them; rank 1's own 1e-3
    # gradient scale (the tutorial's grad_scale fault, k = 1.00086) must stay flagged under bf16
    from tracekit.compare.structure import bias_floor

    floor = bias_floor("gradients", "bfloat16")
    sig = step_signature(1, "gradients", _biased("gradients", {1: 1e-3}), floor)[0]
    assert sig is not None and sig.ranks == [1] and not sig.all_ranks
    # a scale up on one rank and down on the other (one rank's shard scaled, then clipped to a norm)
    sig = step_signature(1, "gradients", _biased("gradients", {0: -1e-3, 1: 2e-3}), floor)[0]
    assert sig is not None


def test_an_all_rank_shift_under_the_unit_roundoff_is_the_same_bias():
    from tracekit.compare.structure import bias_floor, shift_signature

    def shifted(c):
        out = []
        for rank in (0, 1):
            for i, (name, ref) in enumerate(REF.items()):
                rng = np.random.default_rng(100 * rank + i + 1)
                cand = ref + c + 6e-3 * np.abs(ref) * rng.standard_normal(ref.size)
                m = compare_arrays(ref, cand.astype(np.float32), rtol=1.6e-2, atol=1e-5)
                out.append(TensorResult(1, "outputs", rank, rank, name, "float32", ref.shape, m))
        return out

    floor = bias_floor("outputs", "bfloat16")
    assert shift_signature(1, "outputs", shifted(1e-3)) is not None  # float32
    biases = []
    assert shift_signature(1, "outputs", shifted(1e-3), floor, biases) is None and biases[0].shape == "shift"
    assert shift_signature(1, "outputs", shifted(2e-2), floor) is not None


def test_in_float32_nothing_changes():
    from tracekit.compare.structure import bias_floor

    assert {bias_floor(k, None) for k in ("outputs", "gradients", "deltas", "parameters")} == {0.0}
    for kind, scale in (("outputs", {0: 1e-3, 1: 1e-3}), ("gradients", {1: 1e-3}), ("deltas", {0: 1e-3, 1: 1e-3})):
        rs = _biased(kind, scale)
        a, b = step_signature(1, kind, rs), step_signature(1, kind, rs, bias_floor(kind, None), [])
        assert a[0] is not None and a[0].text == b[0].text and a[1:] == b[1:]
