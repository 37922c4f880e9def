"""Reduction lengths in the default norm bound (compare/reduction.py, docs/DIFF.md): n is derived
from the stores' shapes and layout; a reduction longer than the 4096 terms the bound assumed
widens it, a shorter one never tightens it."""

import json

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.schemas import load
from tracekit.compare.tolerances import ASSUMED_TERMS, NORM_DEFAULTS, Tolerances, norm_default
from tracekit.testing import write_store

RANKS = 2
HIDDEN = 16


def _stores(tmp_path, tokens: int, grad_error: float, name: str):
    """ref and cand of a 2-rank DDP-like run whose outputs hold `tokens` rows per rank; cand's
    weight gradient is off by `grad_error` relative L2 (noise, not a scale: no signature)."""
    rng = np.random.default_rng(7)
    out = rng.standard_normal((tokens, HIDDEN)).astype(np.float32)
    w = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)
    g = (1e-2 * rng.standard_normal((HIDDEN, HIDDEN))).astype(np.float32)  # errors stay inside atol: the norm rule decides
    noise = rng.standard_normal(g.shape)
    bad = (g + grad_error * np.linalg.norm(g) * noise / np.linalg.norm(noise)).astype(np.float32)

    def data(grad):
        return {r: {1: {"outputs": {"out": out}, "gradients": {"w": grad}, "parameters": {"w": w}}}
                for r in range(RANKS)}

    return (write_store(tmp_path / f"{name}-ref", data(g)), write_store(tmp_path / f"{name}-cand", data(bad)))


def _tolerance(report, kind):
    (t,) = [t for t in report.to_dict()["tolerances"] if t["kind"] == kind]
    return t


def test_a_short_reduction_keeps_the_bound_every_float32_verdict_was_made_with():
    for dtype in ("float32", "bfloat16", "float64"):
        for n in (None, 1, 512, ASSUMED_TERMS):
            assert norm_default(dtype, n) == NORM_DEFAULTS[dtype]  # exactly: no margin moves
        assert norm_default(dtype, 4 * ASSUMED_TERMS) > NORM_DEFAULTS[dtype]
    # four times the terms: twice the reductions' term, 2 sqrt(n) u32 (float32: 128 u32 -> 256 u32)
    assert norm_default("float32", 4 * ASSUMED_TERMS) == pytest.approx((8 + 256) * 2.0**-24)
    # an explicit bound wins over the derived one, as over any default
    assert Tolerances(kinds={"gradients": (1e-5, 1e-6, 1e-3)}).resolve("gradients", "float32", 10**6).rel_l2 == 1e-3


def test_gradients_sum_over_local_tokens_times_dp_and_outputs_over_the_hidden_size(tmp_path):
    ref, cand = _stores(tmp_path, 64, 0.0, "short")
    report = tracekit.diff(ref, cand)
    grads, outs = _tolerance(report, "gradients"), _tolerance(report, "outputs")
    assert (grads["terms"], grads["terms_from"]) == (64 * RANKS, f"64 local tokens x dp degree {RANKS}")
    assert (outs["terms"], outs["terms_from"]) == (HIDDEN, f"hidden size {HIDDEN}")
    assert "terms" not in _tolerance(report, "parameters")  # no reduction of its own
    assert grads["rel_l2"] == NORM_DEFAULTS["float32"]


def test_a_long_reduction_widens_the_float32_bound_and_decides_the_verdict(tmp_path):
    # 1.2e-5 relative L2: outside float32's 8.1e-6 (n <= 4096), inside 8u + 2 sqrt(16384) u32 = 1.6e-5
    short = tracekit.diff(*_stores(tmp_path, 64, 1.2e-5, "short"), kinds=["gradients"], structure=False)
    long = tracekit.diff(*_stores(tmp_path, 8192, 1.2e-5, "long"), kinds=["gradients"], structure=False)
    assert _tolerance(long, "gradients")["terms"] == 8192 * RANKS
    assert not short.passed and long.passed
    assert _tolerance(long, "gradients")["rel_l2"] > _tolerance(short, "gradients")["rel_l2"]


def test_a_long_reduction_widens_the_bf16_bound_and_the_cli_shows_n(tmp_path):
    short, long = _stores(tmp_path, 64, 0.0, "short"), _stores(tmp_path, 8192, 0.0, "long")
    bounds = {}
    for name, (ref, cand) in (("short", short), ("long", long)):
        result = CliRunner().invoke(main, ["diff", "--precision", "bf16", "--json", ref, cand])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        jsonschema.validate(doc, load("diff-report"))
        (g,) = [t for t in doc["tolerances"] if t["kind"] == "gradients"]
        bounds[name] = g["rel_l2"]
        text = CliRunner().invoke(main, ["diff", "--precision", "bf16", ref, cand]).output.splitlines()
        start = text.index("Margin per kind (worst tensor over all steps: error / bound, at most 1 passes):")
        assert text[start + 1].split() == ["kind", "margin", "step", "terms", "worst", "tensor"]
        rows = {line.split()[0]: line.split()[3] for line in text[start + 3:start + 6] if line.strip()}
        assert rows["gradients"] == str(g["terms"]) and rows["outputs"] == str(HIDDEN) and rows["parameters"] == "-"
    assert bounds["long"] > bounds["short"] >= 2 * NORM_DEFAULTS["bfloat16"]  # the doubled gradient bound, wider
