"""Closeness and error metrics of one (reference, candidate) pair of arrays.

The closeness rule is torch.isclose's, evaluated in the same arithmetic (float32 for float32,
bfloat16 and float16 data; float64 for float64 data; integer and bool data on their exact integer
difference, since float64 cannot tell int64 values above 2**53 apart), so a tensor passes here
exactly when torch.testing.assert_close(cand, ref, rtol=rtol, atol=atol) passes:

    close = (cand == ref)                                   # equal values, equal infinities
          | (equal_nan and both NaN)
          | (both finite and |cand - ref| <= atol + rtol * |ref|)

With a float64 oracle (the three-way verdict) an element instead passes when

    |cand - oracle| <= factor * |ref - oracle| + atol       (all finite)   or cand == oracle,

and a NaN or Inf in the candidate where the reference is finite is a violation either way.

On top of the elementwise rule, the tensor as a whole must pass the norm rule (scale-aware: it
follows the tensor's own magnitude, where a fixed atol can be larger than the tensor itself):

    ||cand - ref|| <= rel_l2 * (||ref|| + atol * sqrt(n))                     (no oracle)
    ||cand - oracle|| <= factor * ||ref - oracle|| + rel_l2 * (||oracle|| + atol * sqrt(n))

over the n elements finite on every side (rel_l2 = inf switches it off). The derivation of the
default rel_l2 per dtype is in docs/DIFF.md. `margin` is how close the tensor came to failing:
the larger of max(|cand - ref| / (atol + rtol * |ref|)) and the norm rule's lhs / rhs; a tensor
passes when it is at most 1 (and no NaN/Inf mismatches).

`compare_arrays` is the public entry point; `MetricsAccumulator` computes the same thing over
consecutive blocks of a flat tensor (the diff engine feeds it chunk by chunk, so memory stays
bounded whatever the tensor size) and accumulators of neighbouring blocks merge. A finite real
block takes a fast route (MetricsAccumulator._fast_pass) that gives the same values bit for bit
with fewer passes over memory: tests/tracekit/compare/test_metrics_fast.py compares the two.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import asdict, dataclass

import numpy as np

# Elements per inner block (measured best at 2^18 on a 2 MiB-L2 / 32 MiB-L3 machine;
# bench/bench_diff.py). The sums behind rel_l2 and the cosine are taken block by block (BLAS), so
# the block size is part of their rounding: another size changes their last bits. The fast route
# works inside a block in smaller sub-blocks (SUB_ELEMENTS), which leaves the sums as they are.
BLOCK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class WorstElement:
    """The element furthest out: the first non-finite mismatch, else the largest error among the
    violating elements, else the largest error overall."""

    index: tuple[int, ...]
    ref: float
    cand: float
    abs_err: float  # |cand - ref|
    oracle: float | None = None
    cand_oracle_err: float | None = None  # |cand - oracle|
    ref_oracle_err: float | None = None  # |ref - oracle|

    def to_dict(self) -> dict:
        return {k: (list(v) if k == "index" else _num(v)) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class OracleMetrics:
    factor: float
    cand_max_err: float  # max |cand - oracle| over finite elements
    ref_max_err: float  # max |ref - oracle|
    cand_rms_err: float  # root mean square of cand - oracle
    ref_rms_err: float

    def to_dict(self) -> dict:
        return {k: _num(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class NonFinite:
    """NaN and Inf counts of each side of a tensor pair (only reported where some side has one)."""

    ref_nan: int = 0
    ref_inf: int = 0
    cand_nan: int = 0
    cand_inf: int = 0

    def __bool__(self) -> bool:
        return bool(self.ref_nan or self.ref_inf or self.cand_nan or self.cand_inf)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TensorMetrics:
    """Metrics of one tensor pair. Errors are over the `compared` elements, those finite on both
    sides; NaN/Inf mismatches are counted in `violations` and `nonfinite` instead. Where no
    element is comparable the error metrics are None (shown as n/a), never 0 or a cosine of 1."""

    numel: int
    rtol: float
    atol: float
    violations: int  # elements outside tolerance
    nonfinite: int  # of which NaN/Inf mismatches
    max_abs_err: float | None  # max |cand - ref|
    max_rel_err: float | None  # max |cand - ref| / |ref| (inf where ref is 0 and cand is not)
    rel_l2_err: float | None  # ||cand - ref|| / ||ref||
    cosine: float | None  # cosine similarity of cand and ref (1 for two zero tensors)
    worst: WorstElement | None
    oracle: OracleMetrics | None = None
    rel_l2: float = math.inf  # the norm rule's bound (inf: no norm rule)
    norm_failed: bool = False  # the tensor as a whole is outside the norm rule
    elem_margin: float | None = None  # max |cand - ref| / (atol + rtol |ref|) (oracle: its rule's ratio)
    norm_margin: float | None = None  # the norm rule's lhs / rhs
    compared: int = 0  # elements finite on every side
    counts: NonFinite = NonFinite()
    # (sum ref^2, sum ref*(cand-ref), sum (cand-ref)^2, sum (cand-ref)) over the compared elements:
    # what the structured-error fits of compare/structure.py pool over tensors and ranks (None: not known)
    fit: tuple[float, float, float, float] | None = None
    # a sharded tensor's fit sums per shard region: ((owner rank, (the four sums above, elements)), ...)
    regions: tuple | None = None

    @property
    def passed(self) -> bool:
        return self.violations == 0 and not self.norm_failed

    @property
    def margin(self) -> float | None:
        """Error over bound of the closer rule (<= 1 passes); inf for a NaN/Inf mismatch, None
        when nothing was comparable."""
        if self.nonfinite:
            return math.inf
        ms = [m for m in (self.elem_margin, self.norm_margin) if m is not None]
        return max(ms) if ms else None

    @property
    def margin_rule(self) -> str:
        """Which rule the margin comes from: 'elementwise', 'norm' or 'nonfinite'."""
        if self.nonfinite:
            return "nonfinite"
        if self.norm_margin is not None and (self.elem_margin is None or self.norm_margin > self.elem_margin):
            return "norm"
        return "elementwise"

    @property
    def violation_fraction(self) -> float:
        return self.violations / self.numel if self.numel else 0.0

    def to_dict(self) -> dict:
        return {
            "numel": self.numel, "rtol": self.rtol, "atol": self.atol, "passed": self.passed,
            "violations": self.violations, "violation_fraction": self.violation_fraction,
            "nonfinite": self.nonfinite, "max_abs_err": _num(self.max_abs_err),
            "max_rel_err": _num(self.max_rel_err), "rel_l2_err": _num(self.rel_l2_err),
            "cosine": _num(self.cosine), "compared": self.compared,
            "nonfinite_counts": self.counts.to_dict() if self.counts else None,
            "rel_l2": _num(self.rel_l2), "norm_failed": self.norm_failed,
            "margin": _num(self.margin), "margin_rule": self.margin_rule if self.margin is not None else None,
            "worst": self.worst.to_dict() if self.worst else None,
            "oracle": self.oracle.to_dict() if self.oracle else None,
        }


def _num(x):
    """JSON has no inf/nan: they become the strings 'inf', '-inf', 'nan'."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The arithmetic a dtype is compared in (torch's opmath): float32 for float32 and narrower
    floats, float64 for float64 and every integer/bool (for the metrics; their closeness is decided
    on the exact integer difference, see _int_abs_diff), complex as is."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return dtype
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


_local = threading.local()
# The block route that skips passes whose results it can get otherwise (max_rel from d / a, the
# margin over the elements that can reach it): the same values bit for bit. Tests switch it off
# to compare against the plain route.
FAST_PATH = True
# Sums of float32 squares below this have lost digits to underflow (float32's smallest normal is ~1.2e-38).
_F32_TINY = 1e-30


def _scratch(dtype: np.dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two work arrays of this thread, reused block after block: fresh memory costs page faults."""
    key = np.dtype(dtype).str
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    got = bufs.get(key)
    if got is None or got[0].size < n:
        got = bufs[key] = tuple(np.empty(max(n, BLOCK_ELEMENTS), dtype) for _ in range(2))
    return got[0][:n], got[1][:n]


# Elements per sub-block of the fast route: its arrays (two inputs, |d|, d / a, two masks) stay in
# a 2 MiB L2 cache while worked on.
SUB_ELEMENTS = 1 << 16


def _sub_scratch(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fast route's sub-block buffers of this thread: quotients and two masks."""
    key = "sub" + np.dtype(dtype).str
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    got = bufs.get(key)
    if got is None:
        got = bufs[key] = (np.empty(SUB_ELEMENTS, dtype), np.empty(SUB_ELEMENTS, bool), np.empty(SUB_ELEMENTS, bool))
    return got


# The elementwise margin of a sub-block is taken over the elements that can hold it while at most
# 1/this of them can; above it, every element's ratio is computed.
_SCREEN_MAX_FRACTION = 8
# Below this a screen's threshold (or atol) is too close to float underflow for its rounding argument.
_SCREEN_MIN = 1e-30


def _int_abs_diff(ra: np.ndarray, rb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|rb - ra| exactly, rb < ra) for integer/bool arrays: uint64 (object for int64 mixed with uint64)."""
    ct = np.result_type(ra.dtype, rb.dtype)
    if ct.kind in "iub":
        wide = np.dtype(np.int64 if ct.kind == "i" else np.uint64)
        x, y = ra.astype(wide, copy=False), rb.astype(wide, copy=False)
        # hi - lo lies in [0, 2**64): computed modulo 2**64 in uint64 it is exact, even where int64 would overflow
        ad = np.maximum(x, y).astype(np.uint64) - np.minimum(x, y).astype(np.uint64)
        return ad, y < x
    x, y = ra.astype(object), rb.astype(object)  # int64 against uint64: Python ints are exact
    return np.abs(y - x), y < x


def _int_violations(ad_exact: np.ndarray, absa: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """|cand - ref| > atol + rtol * |ref| with the integer difference compared exactly (floor of the bound)."""
    bound = np.floor(atol + rtol * absa)
    if ad_exact.dtype == object:
        return (ad_exact > bound).astype(bool)  # Python int against float compares exactly
    huge = ~(bound < 2.0**64)  # no uint64 difference exceeds this bound (inf included)
    return (ad_exact > np.where(huge, 0, bound).astype(np.uint64)) & ~huge


def _ones(dtype: np.dtype, n: int) -> np.ndarray:
    """n ones of this thread, reused: a sum as a BLAS dot with ones takes about half of np.sum's time."""
    key = "ones" + np.dtype(dtype).str
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    got = bufs.get(key)
    if got is None or got.size < n:
        got = bufs[key] = np.ones(max(n, BLOCK_ELEMENTS), dtype)
    return got[:n]


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.vdot(x, y).real) if x.dtype.kind == "c" else float(np.dot(x, y))


class MetricsAccumulator:
    """Metrics of a flat tensor fed block by block, in order (`update(ref, cand, oracle, offset)`)."""

    def __init__(self, rtol: float, atol: float, equal_nan: bool = False, oracle_factor: float | None = None,
                 rel_l2: float = math.inf, elementwise: bool = True):
        self.rtol, self.atol, self.equal_nan = float(rtol), float(atol), bool(equal_nan)
        self.rel_l2 = float(rel_l2)
        # False: the norm rule alone judges finite elements (the precision rule: a low-precision sum
        # errs relative to its terms, not to its own value, so no elementwise bound follows from the
        # compute dtype; docs/DIFF.md); NaN/Inf mismatches still count
        self.elementwise = bool(elementwise)
        self.oracle_factor = None if oracle_factor is None else float(oracle_factor)
        self.n = 0
        self.n_fin = 0  # elements finite on every side
        self.nan_inf = [0, 0, 0, 0]  # ref NaN, ref Inf, cand NaN, cand Inf
        self.elem_margin = 0.0
        self.violations = 0
        self.nonfinite = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.ss_ref = 0.0  # sum ref^2        (finite pairs)
        self.dot_ref_diff = 0.0  # sum ref*(cand-ref)
        self.ss_diff = 0.0  # sum (cand-ref)^2
        self.sum_diff = 0.0  # sum (cand-ref): the constant-shift fit (compare/structure.py)
        self.regions = None  # per shard region: set by compare/pieces.py merged()
        # worst: (category, error, flat index, ref, cand, oracle); category 2 = non-finite mismatch,
        # 1 = violation, 0 = within tolerance. Ties keep the earlier element.
        self.worst: tuple | None = None
        self.o_cand_max = 0.0
        self.o_ref_max = 0.0
        self.o_cand_ss = 0.0
        self.o_ref_ss = 0.0
        self.o_ss = 0.0  # sum oracle^2
        self.o_n = 0

    # ---- feeding -------------------------------------------------------------------------
    def update(self, ref, cand, oracle=None, offset: int = 0) -> None:
        """Add the elements [offset, offset + len) of the flat tensor."""
        ref = np.asarray(ref).reshape(-1)
        cand = np.asarray(cand).reshape(-1)
        if ref.shape != cand.shape:
            raise ValueError(f"shape mismatch: ref {ref.shape} vs cand {cand.shape}")
        if (oracle is None) != (self.oracle_factor is None):
            raise ValueError("pass an oracle block exactly when the accumulator has an oracle_factor")
        if oracle is not None:
            oracle = np.asarray(oracle).reshape(-1)
            if oracle.shape != ref.shape:
                raise ValueError(f"shape mismatch: ref {ref.shape} vs oracle {oracle.shape}")
        wd = np.result_type(work_dtype(ref.dtype), work_dtype(cand.dtype))
        exact = oracle is None and ref.dtype.kind in "iub" and cand.dtype.kind in "iub"
        with np.errstate(all="ignore"):  # inf/nan arise on purpose (x/0, overflow) and are handled
            for s in range(0, ref.size, BLOCK_ELEMENTS):
                e = min(s + BLOCK_ELEMENTS, ref.size)
                a = ref[s:e].astype(wd, copy=False)
                b = cand[s:e].astype(wd, copy=False)
                o = None if oracle is None else oracle[s:e].astype(np.float64, copy=False)
                self._block(a, b, o, offset + s, (ref[s:e], cand[s:e]) if exact else None)
        self.n += ref.size

    def _offer_worst(self, cat: int, err: float, index: int, ref: float, cand: float, oracle=None) -> None:
        # ties go to the lower flat index, whatever the order blocks arrive in (pieces of a
        # sharded tensor are not consecutive in flat order)
        w = self.worst
        if w is None or (cat, err) > w[:2] or ((cat, err) == w[:2] and index < w[2]):
            self.worst = (cat, err, index, ref, cand, oracle)

    def fit_sums(self) -> tuple:
        """(sum ref^2, sum ref*(cand-ref), sum (cand-ref)^2, sum (cand-ref), elements finite on every side)."""
        return (self.ss_ref, self.dot_ref_diff, self.ss_diff, self.sum_diff, self.n_fin)

    def relocate(self, index_of) -> "MetricsAccumulator":
        """Renumber the worst element: fed as a piece of a larger tensor with flat indices local
        to the piece, `index_of(local)` gives its flat index in the whole tensor."""
        if self.worst is not None:
            w = self.worst
            self.worst = (w[0], w[1], int(index_of(w[2])), *w[3:])
        return self

    def _block(self, a: np.ndarray, b: np.ndarray, o: np.ndarray | None, base: int, native=None) -> None:
        """native: the (ref, cand) integer/bool blocks, judged on their exact difference."""
        s1, s2 = _scratch(a.dtype, a.size)
        if native is not None:
            ad_exact, neg = _int_abs_diff(*native)
            d = s1
            d[...] = ad_exact  # the exact difference, rounded once (b - a in float64 may cancel to 0)
            np.negative(d, out=d, where=neg)
            val = lambda k: (native[0][k].item(), native[1][k].item())  # noqa: E731
        else:
            d = np.subtract(b, a, out=s1)
            val = lambda k: (a[k].item(), b[k].item())  # noqa: E731
        ss_d = _dot(d, d)
        idxmap = None
        if not math.isfinite(ss_d):
            # Slow path, rare: some element is NaN/Inf (or the squares overflow).
            fin = np.isfinite(a) & np.isfinite(b)
            if o is not None:
                fin &= np.isfinite(o)
            if not fin.all():
                for i, (side, test) in enumerate(((a, np.isnan), (a, np.isinf), (b, np.isnan), (b, np.isinf))):
                    self.nan_inf[i] += int(np.count_nonzero(test(side)))
                self._nonfinite(a, b, o, ~fin, base)
                idxmap = np.flatnonzero(fin)
                a, b, d = a[idxmap], b[idxmap], d[idxmap]
                o = None if o is None else o[idxmap]
            ss_d = _dot(d, d)
        if a.size == 0:
            return
        self.n_fin += a.size
        ss_a = _dot(a, a)
        dot_ad = _dot(a, d)
        sum_d = _dot(d, _ones(d.dtype, d.size)) if ss_d else 0.0  # before the fast route turns d into |d|
        # a real block judged by the float rule takes the fast route (FAST_PATH; the same values,
        # fewer passes over memory). ss_d == 0 (d is zero, or its squares underflow): the plain one.
        fast = (FAST_PATH and native is None and o is None and a.dtype.kind == "f" and s2.size == a.size
                and ss_d != 0)
        if fast:
            i, mad, q_max, m_fast = self._fast_pass(a, d, ss_a)  # d is |d| afterwards
            ad = d
        else:
            q_max = m_fast = None
            ad = np.abs(d) if d.dtype.kind == "c" else np.abs(d, out=d)
            i = int(ad.argmax())
            mad = float(ad[i])
        if a.dtype == np.float32 and not (_F32_TINY <= ss_a < math.inf and math.isfinite(dot_ad)
                                          and (_F32_TINY <= ss_d < math.inf or (ss_d == 0 and mad == 0))):
            # float32 squares that overflow or underflow (|x| beyond ~1e19 or below ~1e-19): the
            # sums in float64. The closeness decision below stays in float32, where an
            # overflowing difference is inf and so a violation, as in torch.isclose.
            a64 = a.astype(np.float64)
            d64 = b.astype(np.float64) - a64
            ss_a, dot_ad, ss_d = _dot(a64, a64), _dot(a64, d64), _dot(d64, d64)
            sum_d = float(d64.sum())
        self.ss_ref += ss_a
        self.sum_diff += sum_d
        self.dot_ref_diff += dot_ad
        self.ss_diff += ss_d

        # a real buffer: |complex| into a complex one would warn when reduced below
        real = a.dtype.kind != "c" and s2.size == a.size
        if mad > 0:  # an identical block has no relative error: skip the division
            if q_max is not None:
                max_rel = q_max
            else:
                absa = np.abs(a, out=s2) if real else np.abs(a)
                rel = np.divide(ad, absa, out=absa)  # 0/0 -> nan (ignored by fmax), x/0 -> inf
                max_rel = float(np.fmax.reduce(rel))
            if math.isinf(max_rel) and a.dtype == np.float32:
                # x / tiny overflows float32 (|ref| subnormal): the quotient in float64, on this rare path
                max_rel = float(np.fmax.reduce(ad.astype(np.float64) / np.abs(a.astype(np.float64))))
            if not math.isnan(max_rel):
                self.max_rel = max(self.max_rel, max_rel)
        if mad > self.max_abs:
            self.max_abs = mad

        def glob(k: int) -> int:
            return base + (int(idxmap[k]) if idxmap is not None else k)

        if o is not None:
            self._oracle_block(a, b, o, glob, base)
            return
        w = ad.dtype.type
        atol = w(self.atol)
        nv = 0
        if native is not None:
            viol = _int_violations(ad_exact, np.abs(a), self.rtol, self.atol)
            nv = int(np.count_nonzero(viol))
            self._margin_of(ad, np.abs(a) * self.rtol + self.atol, nv)
        elif mad > 0:
            def bound() -> np.ndarray:  # atol + rtol |a|
                tol = np.abs(a, out=s2) if real else np.abs(a)
                tol *= w(self.rtol)
                tol += atol
                return tol

            m = m_fast
            if m is None:
                ratio = np.divide(ad, bound(), out=s2 if real else None)  # 0/0 (equal under an exact rule) is nan: ignored
                m = float(np.fmax.reduce(ratio)) if ratio.size else 0.0
            if math.isnan(m):
                m = 0.0
            # A violation (ad > bound) has a quotient >= 1, division rounding being monotone, so a
            # block whose largest quotient is below 1 has none: the common case skips the count
            # (and so needs no second buffer for the bound). Not below atol either: the bound
            # is never below atol.
            if mad > atol and m >= 1.0:
                viol = ad > bound()
                nv = int(np.count_nonzero(viol))
            if nv:
                m = max(m, 1.0 + 2**-20)  # a violation is above the bound even where the ratio rounds to 1
            self.elem_margin = max(self.elem_margin, m)
        if nv:
            self.violations += nv
            j = np.flatnonzero(viol)
            k = int(j[np.argmax(ad[j])])
            self._offer_worst(1, float(ad[k]), glob(k), *val(k))
            return
        self._offer_worst(0, mad, glob(i), *val(i))

    def _fast_pass(self, a: np.ndarray, d: np.ndarray, ss_a: float) -> tuple[int, float, float, float | None]:
        """(i, max |d|, max_rel, elementwise margin or None) of a finite real block, d = b - a
        turned into |d| in place: what the plain route computes, bit for bit, in sub-blocks of
        SUB_ELEMENTS that stay in the CPU's L2 cache while they are worked on (the block's
        arrays do not fit there; each plain pass went out to memory).

        i is the first position of the largest |d| (argmax per sub-block, a tie going to the
        earlier sub-block). max_rel is max |d / a|, equal to |d| / |a| bit for bit (IEEE division
        rounds the magnitude, the sign apart): no pass for |a|; 0/0 is NaN, ignored as fmax does.

        The margin, max |d| / (atol + rtol |a|), is divided out only where it can be reached
        (None where the screens do not apply: the caller makes the full pass). Every bound is at
        least atol (a rounded sum of atol and a non-negative term), and at least rtol |a| (1 - 2u)
        while atol is a normal number, so an element's ratio is at most |d| / atol and at most
        about |d / a| / rtol, rounding being monotone. Given any ratio m_lb already reached (the
        largest-|d| element of each sub-block so far), an element with |d| < m_lb atol (1 - 2^-20)
        or |d / a| < m_lb rtol (1 - 2^-20) is below m_lb by more than the roundings (2^-20
        against a few 2^-24) and cannot hold the maximum: the elements past the screen are
        divided with the same float operations as the full pass (the whole sub-block where the
        screen leaves more than 1/_SCREEN_MAX_FRACTION of it). The screen on the larger term of
        the bound goes first, the other one only where the first leaves too many."""
        w = d.dtype.type
        rtol, atol = w(self.rtol), w(self.atol)
        screen = _SCREEN_MIN <= atol < math.inf and 0 <= rtol < math.inf
        atol_first = float(atol) ** 2 * a.size >= float(rtol) ** 2 * ss_a  # (in the mean square)
        n = a.size
        qbuf, mask1, mask2 = _sub_scratch(d.dtype)
        best, i = -1.0, 0
        q_max = math.nan
        m = -math.inf
        m_lb = 0.0  # a margin ratio some element reaches
        for s in range(0, n, SUB_ELEMENTS):
            e = min(n, s + SUB_ELEMENTS)
            k = e - s
            ds, as_ = d[s:e], a[s:e]
            q = np.abs(np.divide(ds, as_, out=qbuf[:k]), out=qbuf[:k])  # 0/0 -> nan, x/0 -> inf
            qm = float(np.fmax.reduce(q))
            if not math.isnan(qm) and not qm <= q_max:  # fmax: NaN only where every quotient is NaN
                q_max = qm
            ad = np.abs(ds, out=ds)
            j = int(ad.argmax())
            v = float(ad[j])
            if v > best:
                best, i = v, s + j
            if not screen:
                continue
            r = float(ad[j] / (np.abs(as_[j]) * rtol + atol))  # numpy scalars: the full pass's float ops
            if r > m_lb:
                m_lb = r
            idx = None
            if _SCREEN_MIN <= m_lb < math.inf:
                tests = [(ad, float(atol)), (q, float(rtol))]
                if not atol_first:
                    tests.reverse()
                mask = None
                for x, scale in tests:
                    t64 = m_lb * scale * (1.0 - 2.0**-20)
                    if not t64 >= _SCREEN_MIN:
                        continue  # near underflow the rounding argument does not hold
                    t = w(t64)
                    if t > t64:  # rounded up to the work dtype: the next one down
                        t = np.nextafter(t, w(0))
                    got = np.greater_equal(x, t, out=(mask1 if mask is None else mask2)[:k])
                    mask = got if mask is None else np.logical_and(mask, got, out=mask)
                    got = np.flatnonzero(mask)
                    if got.size * _SCREEN_MAX_FRACTION <= k:
                        idx = got
                        break
            sel = slice(None) if idx is None else idx
            tol = np.abs(as_[sel])
            tol *= rtol
            tol += atol
            ratio = np.divide(ad[sel], tol, out=tol)
            if ratio.size:
                m = max(m, float(np.fmax.reduce(ratio)))
        return i, best, q_max, (m if screen else None)

    def _margin_of(self, ad: np.ndarray, tol: np.ndarray, nv: int) -> None:
        """Fold max(ad / tol) into the elementwise margin (tol may be overwritten)."""
        if tol.dtype.kind in "iub" or tol.dtype != ad.dtype:
            tol = tol.astype(ad.dtype)
        ratio = np.divide(ad, tol, out=tol)  # 0/0 (equal under an exact rule) is nan: ignored
        m = float(np.fmax.reduce(ratio)) if ratio.size else 0.0
        if math.isnan(m):
            m = 0.0
        if nv:
            m = max(m, 1.0 + 2**-20)  # a violation is above the bound even where the ratio rounds to 1
        self.elem_margin = max(self.elem_margin, m)

    def _nonfinite(self, a, b, o, mask, base) -> None:
        """Positions where some side is NaN/Inf: equal infinities (and NaNs with equal_nan) pass."""
        idx = np.flatnonzero(mask)
        an, bn = a[idx], b[idx]
        target = an if o is None else o[idx]
        ok = bn == target
        if self.equal_nan:
            ok |= np.isnan(bn) & np.isnan(target)
        ok &= ~(~np.isfinite(bn) & np.isfinite(an))  # a NaN/Inf the reference does not have: always out
        bad = idx[~ok]
        if bad.size:
            self.violations += bad.size
            self.nonfinite += bad.size
            k = int(bad[0])
            self._offer_worst(2, 0.0, base + k, a[k].item(), b[k].item(), None if o is None else o[k].item())

    def _oracle_block(self, a, b, o, glob, base) -> None:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ec = np.abs(b64 - o)
        er = np.abs(a64 - o)
        self.o_cand_ss += _dot(ec, ec)
        self.o_ref_ss += _dot(er, er)
        self.o_ss += _dot(o, o)
        self.o_n += a.size
        self.o_cand_max = max(self.o_cand_max, float(ec.max()))
        self.o_ref_max = max(self.o_ref_max, float(er.max()))
        bound = self.oracle_factor * er + self.atol
        viol = ~((ec <= bound) | (b64 == o))
        nv = int(np.count_nonzero(viol))
        self._margin_of(np.where(b64 == o, 0.0, ec), bound, nv)
        if nv:
            self.violations += nv
            j = np.flatnonzero(viol)
            k = int(j[np.argmax(ec[j])])
            cat = 1
        else:
            k = int(np.argmax(ec))
            cat = 0
        self._offer_worst(cat, float(ec[k]), glob(k), a[k].item(), b[k].item(), o[k].item())

    # ---- combining -----------------------------------------------------------------------
    def merge(self, later: "MetricsAccumulator") -> "MetricsAccumulator":
        """Fold in the accumulator of a later block range of the same tensor."""
        self.n += later.n
        self.n_fin += later.n_fin
        self.nan_inf = [x + y for x, y in zip(self.nan_inf, later.nan_inf)]
        self.elem_margin = max(self.elem_margin, later.elem_margin)
        self.violations += later.violations
        self.nonfinite += later.nonfinite
        self.max_abs = max(self.max_abs, later.max_abs)
        self.max_rel = max(self.max_rel, later.max_rel)
        self.ss_ref += later.ss_ref
        self.dot_ref_diff += later.dot_ref_diff
        self.ss_diff += later.ss_diff
        self.sum_diff += later.sum_diff
        if later.worst is not None:
            self._offer_worst(*later.worst)
        self.o_cand_max = max(self.o_cand_max, later.o_cand_max)
        self.o_ref_max = max(self.o_ref_max, later.o_ref_max)
        self.o_cand_ss += later.o_cand_ss
        self.o_ref_ss += later.o_ref_ss
        self.o_ss += later.o_ss
        self.o_n += later.o_n
        return self

    def result(self, shape: tuple[int, ...] | None = None) -> TensorMetrics:
        shape = (self.n,) if shape is None else tuple(shape)
        ss_a, dad, ss_d = self.ss_ref, self.dot_ref_diff, self.ss_diff
        if ss_a > 0:
            rel_l2 = math.sqrt(ss_d) / math.sqrt(ss_a)  # the quotient of the squares can overflow
            # cos = a.b / (|a||b|) with b = a + d, written in x = a.d/|a|^2, y = |d|^2/|a|^2 so that
            # 1 - cos (~ (y - x^2)/2) keeps its digits instead of cancelling against |a|^2.
            x, y = dad / ss_a, ss_d / ss_a
            nb2 = 1.0 + 2.0 * x + y
            if math.isfinite(nb2):
                cosine = (1.0 + x) / math.sqrt(nb2) if nb2 > 0 else 0.0
            else:  # |ref| far below |cand - ref| (x, y overflow): the plain formula, in norms
                ss_b = ss_a + 2.0 * dad + ss_d
                cosine = (ss_a + dad) / (math.sqrt(ss_a) * math.sqrt(ss_b)) if ss_b > 0 else 0.0
            cosine = max(-1.0, min(1.0, cosine))
        else:
            rel_l2 = 0.0 if ss_d == 0 else math.inf
            cosine = 1.0 if ss_d == 0 else 0.0
        worst = None
        if self.worst is not None:
            cat, err, flat, r, c, o = self.worst
            index = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
            worst = WorstElement(
                index, _scalar(r), _scalar(c), float(abs(c - r)),
                None if o is None else float(o),
                None if o is None else float(abs(c - o)), None if o is None else float(abs(r - o)),
            )
        oracle = None
        if self.oracle_factor is not None:
            n = max(self.o_n, 1)
            oracle = OracleMetrics(self.oracle_factor, self.o_cand_max, self.o_ref_max,
                                   math.sqrt(self.o_cand_ss / n), math.sqrt(self.o_ref_ss / n))
        norm_margin = self._norm_margin()
        norm_failed = norm_margin is not None and norm_margin > 1.0
        counts = NonFinite(*self.nan_inf)
        violations, elem_margin = self._scaled_elementwise()
        if self.n_fin == 0:  # nothing comparable: no error is 0 and no cosine is 1
            return TensorMetrics(self.n, self.rtol, self.atol, self.violations, self.nonfinite, None, None, None,
                                 None, worst, oracle if self.o_n else None, self.rel_l2, False, None, None, 0, counts)
        return TensorMetrics(self.n, self.rtol, self.atol, violations, self.nonfinite, self.max_abs,
                             self.max_rel, rel_l2, cosine, worst, oracle, self.rel_l2, norm_failed,
                             elem_margin, norm_margin, self.n_fin, counts,
                             (self.ss_ref, self.dot_ref_diff, self.ss_diff, self.sum_diff), self.regions)

    def _scaled_elementwise(self) -> tuple[int, float]:
        """(violations, elementwise margin); without the elementwise rule only NaN/Inf mismatches count."""
        if self.elementwise or self.oracle_factor is not None:
            return self.violations, self.elem_margin
        return self.nonfinite, (self.elem_margin if self.nonfinite else 0.0)

    def _norm_margin(self) -> float | None:
        """lhs / rhs of the norm rule over the finite elements (None: no rule or nothing to judge)."""
        if self.n_fin == 0 or math.isinf(self.rel_l2):
            return None
        floor = self.atol * math.sqrt(self.n_fin)  # magnitudes below atol count as atol: see docs/DIFF.md
        if self.oracle_factor is not None:
            lhs = math.sqrt(self.o_cand_ss)
            rhs = self.oracle_factor * math.sqrt(self.o_ref_ss) + self.rel_l2 * (math.sqrt(self.o_ss) + floor)
        else:
            lhs = math.sqrt(self.ss_diff)
            rhs = self.rel_l2 * (math.sqrt(self.ss_ref) + floor)
        if lhs == 0:
            return 0.0
        return lhs / rhs if rhs > 0 else math.inf


@functools.lru_cache(maxsize=4096)
def identical_metrics(numel: int, rtol: float, atol: float, rel_l2: float = math.inf) -> TensorMetrics:
    """The metrics of two equal, all-finite tensors of `numel` elements, known without reading them
    (format 2 stores: equal content hashes). No error anywhere; the worst element is not known.
    One frozen value per size and tolerances, shared: a hash-decided diff asks for it per tensor
    entry, and building each took ~40 us (0.2 of the 0.6 s that two identical 4-rank FSDP stores
    of 4,800 entries took to diff)."""
    acc = MetricsAccumulator(rtol, atol, rel_l2=rel_l2)
    acc.n = acc.n_fin = int(numel)
    return acc.result()


def _scalar(v):
    if isinstance(v, complex):
        return abs(v)  # JSON has no complex numbers; the magnitude is what the errors are about
    if isinstance(v, int) and not isinstance(v, bool):
        return v  # an integer as recorded: float would round int64 values above 2**53
    return float(v)


def compare_arrays(ref, cand, *, rtol: float, atol: float, equal_nan: bool = False, oracle=None,
                   oracle_factor: float | None = None, rel_l2: float = math.inf) -> TensorMetrics:
    """Metrics of one (ref, cand) pair with the given tolerances.

    rel_l2: the norm rule's bound (default inf: elementwise only, as torch.testing.assert_close).

    ref, cand (and oracle): array-likes of the same shape (numpy arrays, or torch tensors: those
    are moved to the CPU and bfloat16/float8 widened to float32). With `oracle`, elements are
    judged by the three-way rule and `oracle_factor` defaults to DEFAULT_ORACLE_FACTOR.
    Returns TensorMetrics; nothing is raised for violations (check `.passed`).
    """
    ref, cand = _as_numpy(ref), _as_numpy(cand)
    if ref.shape != cand.shape:
        raise ValueError(f"shape mismatch: ref {ref.shape} vs cand {cand.shape}")
    if oracle is not None:
        from tracekit.compare.tolerances import DEFAULT_ORACLE_FACTOR

        oracle = _as_numpy(oracle)
        oracle_factor = DEFAULT_ORACLE_FACTOR if oracle_factor is None else oracle_factor
    else:
        oracle_factor = None
    acc = MetricsAccumulator(rtol, atol, equal_nan, oracle_factor, rel_l2)
    acc.update(ref, cand, oracle)
    return acc.result(ref.shape)


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if not x.dtype.is_complex and x.is_floating_point() and x.element_size() < 4:
            x = x.float()
        return x.numpy()
    return np.asarray(x)
