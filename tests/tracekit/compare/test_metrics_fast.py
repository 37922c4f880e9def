"""The metrics' fast block route (metrics.FAST_PATH: max_rel from d / a, the elementwise margin
over the elements that can reach it) gives every field bit for bit as the plain route does."""

import math

import numpy as np
import pytest

from tracekit.compare import metrics as M
from tracekit.store.dtypes import to_numpy_values

BLOCK = 512  # several blocks per tensor, and a last partial one


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), widened back as the diff reads them."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return to_numpy_values(rounded, "bfloat16")


def _case(rng: np.random.Generator, dtype: str, shape: str, n: int):
    """(ref, cand) of one dtype with a candidate whose error has the given shape."""
    with np.errstate(all="ignore"):  # the "huge" case overflows on purpose
        return _make(rng, dtype, shape, n)


def _make(rng: np.random.Generator, dtype: str, shape: str, n: int):
    base = np.float64 if dtype == "float64" else np.float32
    e = base({"float16": 1e3, "bfloat16": 1e4}.get(dtype, 1.0))  # errors the narrow dtypes can hold
    ref = rng.standard_normal(n).astype(base) * base(10.0 ** rng.integers(-3, 4))
    if shape == "noise":  # relative rounding-like noise: the worst |d| where |ref| is large
        cand = ref * (1 + e * base(1e-6) * rng.standard_normal(n).astype(base))
    elif shape == "absolute":  # noise independent of the magnitude: many candidates near the max
        cand = ref + e * base(1e-5) * rng.standard_normal(n).astype(base)
    elif shape == "ties":  # errors of a few quantized sizes (exact in every dtype): the largest |d| repeats
        ref = rng.integers(-8, 8, n).astype(base) / 4
        d = rng.integers(-1, 2, n).astype(base) / 16
        d[rng.integers(0, n, 3)] = base(2 / 16) * rng.choice([-1, 1], 3)
        cand = ref + d
    elif shape == "boundary":  # around the tolerance: violations, margins near 1
        cand = ref + e * (base(1e-5) + base(1.3e-6) * np.abs(ref)) * rng.uniform(-1.2, 1.2, n).astype(base)
    elif shape == "tiny":  # subnormal differences and references, zeros
        ref = (ref * base(1e-38)).astype(base)
        cand = ref + (rng.integers(-3, 4, n) * np.finfo(base).smallest_subnormal).astype(base)
        ref[::7] = 0
    else:  # "huge": differences that overflow, equal zeros, sign flips
        ref = (ref * base(1e36)).astype(base)
        cand = -ref
        cand[::5] = ref[::5]
        ref[::11] = 0
    cand = cand.astype(base)
    if rng.random() < 0.5:  # NaN/Inf on either side, some of them matching
        for side in (ref, cand):
            k = rng.integers(0, n, 3)
            side[k] = rng.choice([np.nan, np.inf, -np.inf], 3)
        cand[k[:1]] = ref[k[:1]]
    if dtype == "float16":
        ref, cand = ref.astype(np.float16), cand.astype(np.float16)
    elif dtype == "bfloat16":
        ref, cand = _bf16(ref), _bf16(cand)
    return ref, cand


def _metrics(ref, cand, rtol, atol, equal_nan, rel_l2, fast: bool, monkeypatch) -> str:
    monkeypatch.setattr(M, "FAST_PATH", fast)
    acc = M.MetricsAccumulator(rtol, atol, equal_nan, rel_l2=rel_l2)
    n = ref.size
    cut = (n // 3) // BLOCK * BLOCK  # two accumulators merged, as the engine's units are
    acc.update(ref[:cut], cand[:cut])
    later = M.MetricsAccumulator(rtol, atol, equal_nan, rel_l2=rel_l2)
    later.update(ref[cut:], cand[cut:], offset=cut)
    m = acc.merge(later).result((n,))
    return repr(m) + repr(acc.max_rel) + repr(acc.elem_margin)  # repr: NaN equals NaN, -0.0 differs from 0.0


TOLS = [(1.3e-6, 1e-5), (1.3e-6, 1e-7), (1e-5, 1e-9), (0.0, 1e-5), (1.3e-6, 0.0), (1e-2, 1e-3), (0.0, 0.0), (1.6e-2, 1e-5)]


class _ScreenCounter:
    """numpy as metrics.py sees it, counting the candidate lists taken from the fast route's masks
    (so a test can tell that the screen applied, not only that the values agree)."""

    def __init__(self, masks: list):
        self.masks, self.screened = masks, 0

    def __getattr__(self, name):
        return getattr(np, name)

    def flatnonzero(self, x):
        if any(np.shares_memory(x, m) for m in self.masks):
            self.screened += 1
        return np.flatnonzero(x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["noise", "absolute", "ties", "boundary", "tiny", "huge"])
def test_fast_route_reports_what_the_plain_route_reports(dtype, shape, monkeypatch):
    monkeypatch.setattr(M, "BLOCK_ELEMENTS", BLOCK)
    monkeypatch.setattr(M, "SUB_ELEMENTS", BLOCK // 4)  # several sub-blocks per block: ties across them
    monkeypatch.setattr(M, "_local", type(M._local)())  # fresh buffers of the patched sizes
    masks = []
    scratch = M._sub_scratch

    def kept(dtype):
        got = scratch(dtype)
        masks.extend(got[1:])
        return got

    monkeypatch.setattr(M, "_sub_scratch", kept)
    counter = _ScreenCounter(masks)
    monkeypatch.setattr(M, "np", counter)
    rng = np.random.default_rng([7, len(dtype), len(shape)])
    for trial in range(12):
        n = int(rng.integers(1, 6 * BLOCK))
        ref, cand = _case(rng, dtype, shape, n)
        rtol, atol = TOLS[trial % len(TOLS)]
        args = (rtol, atol, bool(trial & 1), math.inf if trial % 3 else 1e-3)
        assert _metrics(ref, cand, *args, True, monkeypatch) == _metrics(ref, cand, *args, False, monkeypatch), (
            dtype, shape, trial)
    if shape in ("noise", "ties", "boundary"):
        assert counter.screened, "the screen never applied: the test would not see it"


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, bool])
def test_integer_blocks_are_unchanged_by_the_fast_route(dtype, monkeypatch):
    """Integer and bool data are judged on their exact difference: the plain route, either way."""
    monkeypatch.setattr(M, "BLOCK_ELEMENTS", BLOCK)
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype) if dtype is not bool else None
    for _ in range(5):
        n = int(rng.integers(1, 5 * BLOCK))
        if info is None:
            ref, cand = rng.random(n) < 0.5, rng.random(n) < 0.5
        else:
            ref = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
            cand = ref.copy()
            k = rng.integers(0, n, max(1, n // 10))
            cand[k] = rng.integers(info.min, info.max, k.size, dtype=dtype, endpoint=True)
        assert (_metrics(ref, cand, 0.0, 1.0, False, math.inf, True, monkeypatch)
                == _metrics(ref, cand, 0.0, 1.0, False, math.inf, False, monkeypatch))


def test_worst_element_tie_goes_to_the_first_index_on_the_fast_route(monkeypatch):
    monkeypatch.setattr(M, "BLOCK_ELEMENTS", BLOCK)
    ref = np.ones(5 * BLOCK, np.float32)
    cand = ref.copy()
    cand[[700, 1300, 2000]] += np.float32(2.0**-10)  # three equal largest errors, in three blocks
    m = M.compare_arrays(ref, cand, rtol=1e-2, atol=1e-2)
    assert m.worst.index == (700,) and m.violations == 0
    assert m.elem_margin == float(np.float32(2.0**-10) / (np.float32(1.0) * np.float32(1e-2) + np.float32(1e-2)))
