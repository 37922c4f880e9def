"""diff()'s options as one typed value (compare/options.DiffOptions): the same report as keywords."""

import json

import numpy as np
import pytest

import tracekit
from tracekit.compare.options import DiffOptions
from tracekit.testing import write_store


def _pair(tmp_path):
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    ref = write_store(tmp_path / "ref", {r: {1: {"parameters": {"w": w}}} for r in range(2)})
    cand = write_store(tmp_path / "cand", {r: {1: {"parameters": {"w": w + np.float32(1e-3 * (r + 1))}}} for r in range(2)})
    return ref, cand


def _json(report) -> str:
    d = report.to_dict()
    d.pop("stats", None)
    return json.dumps(d, sort_keys=True, default=str)


def test_options_and_keywords_give_the_same_report(tmp_path):
    ref, cand = _pair(tmp_path)
    by_keywords = tracekit.diff(ref, cand, rtol=1e-4, atol=1e-4, details="all")
    by_options = tracekit.diff(ref, cand, DiffOptions(rtol=1e-4, atol=1e-4, details="all"))
    assert not by_options.passed
    assert _json(by_options) == _json(by_keywords)
    # a keyword overrides the options' field
    assert tracekit.diff(ref, cand, DiffOptions(details="all"), details="violations").options["details"] == "violations"


def test_an_unknown_option_is_refused(tmp_path):
    ref, cand = _pair(tmp_path)
    with pytest.raises(TypeError, match="rtoll"):
        tracekit.diff(ref, cand, rtoll=1e-3)
