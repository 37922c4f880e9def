"""Which tolerance applies: per-dtype defaults, the override order, --tol and TOML config parsing."""

import os

import numpy as np
import pytest

import tracekit
from tracekit.compare.tolerances import DTYPE_DEFAULTS, NORM_DEFAULTS, Tolerances, load_config, parse_tol_option
from tracekit.errors import UsageError
from tracekit.testing import write_store


def test_defaults_are_torch_assert_close_table():
    t = Tolerances()
    assert (t.resolve("gradients", "float32").rtol, t.resolve("gradients", "float32").atol) == (1.3e-6, 1e-5)
    assert DTYPE_DEFAULTS["bfloat16"] == (1.6e-2, 1e-5)
    assert DTYPE_DEFAULTS["float16"] == (1e-3, 1e-5)
    assert DTYPE_DEFAULTS["float64"] == (1e-7, 1e-7)
    params = t.resolve("parameters", "float32")
    assert (params.rtol, params.atol, params.source) == (1.3e-6, 1e-7, "parameters float32 default")
    assert t.resolve("parameters", "bfloat16").atol == 1e-5  # no exception for bfloat16
    for dtype in ("int64", "int32", "uint8", "bool"):
        exact = t.resolve("outputs", dtype)
        assert (exact.rtol, exact.atol) == (0, 0)


def test_precedence_most_specific_first():
    t = Tolerances(rtol=1e-4, kinds={"loss": (1e-3, None)}, config_rtol=5e-5, config_atol=5e-6,
                   config_kinds={"loss": (None, 2e-7), "deltas": (9e-1, 9e-1)}, config_dtypes={"bfloat16": (3e-2, None)})
    loss = t.resolve("loss", "float32")
    assert (loss.rtol, loss.atol) == (1e-3, 2e-7)
    assert loss.source == "rtol: --tol loss, atol: config kind.loss"
    grads = t.resolve("gradients", "bfloat16")
    assert (grads.rtol, grads.atol) == (1e-4, 5e-6)  # global CLI beats config global, which beats dtype
    assert t.resolve("deltas", "float32").rtol == 9e-1
    # the user's per-dtype setting beats the built-in parameters exception
    assert Tolerances(config_dtypes={"float32": (None, 1e-5)}).resolve("parameters", "float32").atol == 1e-5
    assert Tolerances(atol=1e-5).resolve("parameters", "float32").atol == 1e-5
    only_dtype = Tolerances(config_dtypes={"bfloat16": (3e-2, None)}).resolve("outputs", "bfloat16")
    assert (only_dtype.rtol, only_dtype.atol) == (3e-2, 1e-5)
    exact = Tolerances(rtol=1, kinds={"loss": (1, 1)}, exact=True).resolve("loss", "float32")
    assert (exact.rtol, exact.atol, exact.source) == (0, 0, "--exact")


def test_parse_tol_option():
    assert parse_tol_option("gradients=1e-5,1e-6") == ("gradients", (1e-5, 1e-6))
    assert parse_tol_option(" my_kind = 0 , 0 ") == ("my_kind", (0.0, 0.0))
    for bad in ("gradients", "gradients=1e-5", "=1,2", "loss=a,b", "loss=-1,0", "loss=nan,0"):
        with pytest.raises(UsageError):
            parse_tol_option(bad)


def test_load_config(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text('rtol = 1e-5\nequal_nan = true\noracle_factor = 4\n[dtype.bfloat16]\nrtol = 2e-2\n'
                   '[kind.loss]\nrtol = 1e-4\natol = 1e-7\n')
    got = load_config(str(cfg))
    assert got["equal_nan"] is True and got["oracle_factor"] == 4.0
    t = Tolerances(**got["tolerances"])
    assert t.resolve("loss", "float32").rtol == 1e-4 and t.resolve("outputs", "bfloat16").rtol == 1e-5
    for text, msg in [("rtol = 'x'", "must be a number"), ("rtl = 1", "unknown key"), ("[kind.loss]\nrtl = 1", "rtol, atol and/or rel_l2"),
                      ("rtol = [", "not valid TOML"), ("equal_nan = 1", "true or false")]:
        cfg.write_text(text)
        with pytest.raises(UsageError, match=msg):
            load_config(str(cfg))
    with pytest.raises(UsageError, match="cannot read it"):
        load_config(str(tmp_path / "none.toml"))


def test_bfloat16_tensors_use_their_own_defaults(tmp_path):
    torch = pytest.importorskip("torch")
    x = torch.linspace(1, 2, 64, dtype=torch.bfloat16)
    y = x.clone()
    y[3] = x[3] * 1.01  # ~1 bfloat16 ulp: within 1.6e-2
    ref = write_store(tmp_path / "a", {0: {1: {"outputs": {"x": x}}}})
    cand = write_store(tmp_path / "b", {0: {1: {"outputs": {"x": y}}}})
    report = tracekit.diff(ref, cand)
    assert report.passed and report.tolerances == [
        {"kind": "outputs", "dtype": "bfloat16", "rtol": 1.6e-2, "atol": 1e-5, "rel_l2": NORM_DEFAULTS["bfloat16"],
         "source": "bfloat16 default"}]
    assert not tracekit.diff(ref, cand, exact=True).passed


def test_all_zero_rows_compare(tmp_path):
    # zarr skips chunks equal to the fill value unless told otherwise, and a skipped chunk would
    # look like a deleted one (an error): the writer keeps them, and all-zero rows compare normally.
    z = {0: {1: {"loss": {"loss": np.float32(0)}, "deltas": {"w": np.zeros(5, np.float32)}}}}
    ref = write_store(tmp_path / "a", z, format_version=1)
    assert os.path.isfile(os.path.join(ref, "rank_0", "loss", "float32", "c", "0", "0"))
    assert tracekit.diff(ref, write_store(tmp_path / "b", z, format_version=1), exact=True).passed
    assert tracekit.diff(write_store(tmp_path / "c", z), write_store(tmp_path / "d", z), exact=True).passed


def test_tolerance_for_a_kind_no_store_recorded_is_a_usage_error(tmp_path):
    a = write_store(tmp_path / "a", {0: {1: {"gradients": {"w": np.ones(2, np.float32)}}}})
    with pytest.raises(UsageError, match=r"^--tol gradient: no store recorded this kind \(recorded: gradients\)$"):
        tracekit.diff(a, a, tol={"gradient": (0.0, 0.0)})
    cfg = tmp_path / "t.toml"
    cfg.write_text("[kind.gradient]\natol = 0\n")
    with pytest.raises(UsageError, match=r"^config \[kind.gradient\]: no store recorded this kind"):
        tracekit.diff(a, a, config=str(cfg))
    assert tracekit.diff(a, a, tol={"gradients": (0.0, 0.0)}).passed


def test_one_table_says_which_dtype_is_coarser():
    # UNIT_ROUNDOFF orders every real float dtype, float8 included; the stored-width pairing
    # (compare/alignment.py) and the precision rule (defaults_dtype) both read it
    from tracekit.compare.alignment import TensorPair
    from tracekit.compare.tolerances import UNIT_ROUNDOFF, coarser_dtype, defaults_dtype
    from tracekit.store import TensorInfo

    widths = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
    assert sorted(widths, key=UNIT_ROUNDOFF.get) == widths
    for i, a in enumerate(widths):
        for b in widths[i:]:
            assert coarser_dtype(a, b) == coarser_dtype(b, a) == b
            assert defaults_dtype(a, b) == b and defaults_dtype(b, a) == b
    assert coarser_dtype("complex64", "bfloat16") == "complex64" and coarser_dtype("int32", "float16") == "int32"
    assert defaults_dtype("float32", None) == "float32" and defaults_dtype("complex64", "bfloat16") == "complex64"
    def info(dtype):
        return TensorInfo("w", dtype, (4,), dtype, 0, 4)

    assert TensorPair("w", info("float32"), info("float8_e5m2")).dtype == "float8_e5m2"
    assert TensorPair("w", info("bfloat16"), info("float16")).dtype == "bfloat16"


def test_under_a_rule_storage_no_coarser_than_the_compute_dtype_drops_the_elementwise_bound():
    # issue 35: whether a value carries the rule's chain of low-precision ops does not depend on the
    # width it was stored in; a coarser storage (float8) still rounds more than the chain, elementwise
    rule = Tolerances(compute="bfloat16")
    for stored in ("float32", "bfloat16", "float16"):
        out, grad = rule.resolve("outputs", stored), rule.resolve("gradients", stored)
        assert not out.elementwise and grad.rel_l2 == pytest.approx(2 * out.rel_l2), stored
    assert rule.resolve("outputs", "float8_e4m3fn").elementwise
    assert Tolerances().resolve("outputs", "bfloat16").elementwise  # no rule: the stored dtype's, as before
    assert rule.resolve("outputs", "int64").elementwise  # integers stay exact
    assert Tolerances(compute="bfloat16", kinds={"outputs": (1e-2, 1e-3)}).resolve("outputs", "bfloat16").elementwise
