"""Permuted or transposed rows and the place of NaN/Inf (compare/rows.py, patterns.row_signatures)
on synthetic matrices: named where the candidate's rows are the reference's moved, never for noise
or for other rows of the same norms, and never for a tensor that passes."""

import numpy as np

from tracekit.compare import rows
from tracekit.compare.metrics import compare_arrays
from tracekit.compare.report import TensorResult
from tracekit.compare.signatures import step_shapes

RNG = np.random.default_rng(7)
REF = {"w0": RNG.standard_normal((64, 32)).astype(np.float32), "w1": RNG.standard_normal((32, 32)).astype(np.float32)}
RTOL, ATOL = 1.6e-2, 1e-5


def _results(change, noise=1e-4, kind="outputs"):
    out = []
    for rank in (0, 1):
        for i, (name, ref) in enumerate(REF.items()):
            rng = np.random.default_rng(100 * rank + i)
            cand = (change(rank, name, ref) * (1 + noise * rng.standard_normal(ref.shape))).astype(np.float32)
            m = compare_arrays(ref, cand, rtol=RTOL, atol=ATOL, rel_l2=5e-2)
            r = TensorResult(1, kind, rank, rank, name, "float32", ref.shape, m)
            if rows.wanted(ref.shape, m.passed, m.nonfinite):
                r.layout = rows.layout(ref, cand, RTOL, ATOL)
            out.append(r)
    return out


def _sigs(change, **kw):
    return step_shapes(1, kw.get("kind", "outputs"), _results(change, **kw))[0]


def test_rolled_rows_are_named_with_an_example_row():
    sigs = _sigs(lambda r, n, ref: np.roll(ref, 1, axis=0) if (r, n) == (1, "w0") else ref)
    assert [(s.shape, s.ranks, s.tensor) for s in sigs] == [("permuted rows", [1], "w0")]
    assert sigs[0].text.startswith("permuted rows: outputs rows match the reference's in another order on tensor w0, "
                                   "rank 1 only (e.g. rank 1 w0: row 0 = ref row 63; 64 rows moved)")
    assert sigs[0].to_dict()["shape"] == "permuted rows"


def test_a_square_matrix_transposed_is_named_transposed():
    sigs = _sigs(lambda r, n, ref: ref.T if n == "w1" else ref)
    assert [(s.shape, s.all_ranks, s.tensor) for s in sigs] == [("transposed", True, "w1")]
    assert sigs[0].text.startswith("transposed: outputs equal the reference's transpose on tensor w1, all ranks")


def test_noise_and_other_rows_of_the_same_norms_are_not_permutations():
    for noise in (0.05, 0.5):  # fails its bounds, rows in place and moved alike
        rs = _results(lambda r, n, ref: ref, noise=noise)
        assert not all(r.passed for r in rs) and all(r.layout is None for r in rs), noise
        assert not {s.shape for s in step_shapes(1, "outputs", rs)[0]} & {"permuted rows", "transposed"}

    def other_rows(rank, name, ref):  # new random rows, each scaled to a reference row's norm
        new = np.random.default_rng(5).standard_normal(ref.shape)
        return (new / np.linalg.norm(new, axis=1, keepdims=True) * np.linalg.norm(ref, axis=1, keepdims=True))[::-1]

    rs = _results(other_rows)
    assert all(not r.passed and r.layout is None for r in rs)


def test_a_permutation_inside_the_bounds_is_not_read_again():
    ref = REF["w0"]
    assert rows.wanted(ref.shape, False, 0) and not rows.wanted(ref.shape, True, 0)
    assert not rows.wanted((4096 * 2, 4), False, 0) and not rows.wanted((1, 64), False, 0)
    assert not rows.wanted((64,), False, 0)  # a vector has no rows to move


def test_where_the_nonfinite_values_are():
    def put(where):
        def change(rank, name, ref):
            out = ref.copy()
            if (rank, name) == (0, "w0"):
                out[where] = np.nan
            return out
        return change

    for where, text in ((np.s_[3], "whole row 3"), (np.s_[:, 5], "whole column 5"),
                        (np.s_[2, 7], "one element (row 2, column 7)"), (np.s_[[1, 4], [0, 9]], "2 scattered elements")):
        sig = _sigs(put(where))[0]
        assert sig.shape == "nonfinite" and f"(rank 0 w0: {text})" in sig.text, (text, sig.text)
    every = _sigs(put(np.s_[:]))[0]
    assert "every element of tensor w0, rank 0 only" in every.text and "(rank 0" not in every.text
