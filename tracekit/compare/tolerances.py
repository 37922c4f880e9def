"""Which (rtol, atol, rel_l2) applies to a tensor: built-in defaults per dtype, overridden by the user.

rtol/atol are the elementwise rule, rel_l2 the bound of the norm rule (metrics.py); each of the
three resolves on its own through the same layers.

Resolution, most specific first (documented in docs/DIFF.md):
  --exact > per-kind (--tol KIND=..., then the config file's [kind.KIND])
          > global (--rtol/--atol, then the config file's top-level rtol/atol)
          > per-dtype (the config file's [dtype.DTYPE], then KIND_DEFAULTS for a few
            (kind, dtype) pairs, then DTYPE_DEFAULTS).
rtol, atol and rel_l2 resolve independently, so `--rtol 1e-4` keeps each dtype's default atol and rel_l2.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field

from tracekit.errors import UsageError
from tracekit.small_file import read_small_text
from tracekit.store.kinds import tolerance_class

# (rtol, atol). The float rows are torch.testing.assert_close's table; float8 has no torch default,
# so it gets twice its machine epsilon (the bfloat16 row is also ~2 eps). Integers and bool are exact.
DTYPE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
    "float8_e4m3fn": (2.5e-1, 1e-5),
    "float8_e5m2": (5e-1, 1e-5),
    "complex128": (1e-7, 1e-7),
    "complex64": (1.3e-6, 1e-5),
}
EXACT = (0.0, 0.0)  # every other dtype: int*, uint*, bool

# Built-in exceptions by (tolerance class of the kind, see tracekit/store/kinds.py; dtype). Parameters move by lr * grad per step (~1e-5 in the
# reference workloads), so the float32 atol of 1e-5 would hide an update that is 1% off (~1e-7
# to 1e-6 per element) until it shows in the next step's outputs. Parameter rounding noise is
# about one ulp (below 1e-8 for |p| < 0.1), so 1e-7 keeps a wide margin while the update stays
# visible at the step where it goes wrong. (Deltas cannot do the same: p_after - p_before
# cancels, so their noise is an ulp of the parameter, not of the delta.)
KIND_DEFAULTS: dict[tuple[str, str], tuple[float, float]] = {
    ("parameter", "float32"): (1.3e-6, 1e-7),
    ("parameter", "float64"): (1e-7, 1e-9),
}

# The norm rule's default bound, ||cand - ref|| <= rel_l2 * (||ref|| + atol * sqrt(n)), per dtype.
# Derived in docs/DIFF.md from the unit roundoff u of the stored dtype and of the float32
# accumulation (u32 = 2**-24): rel_l2 = 8 * u + 128 * u32. The first term covers the final roundings
# of a chain of ops stored in the dtype (both runs round each result, a difference of up to 2u per
# op, over a few ops), the second the reordered float32 reductions (sqrt(n) * kappa * u32 with n up
# to 4096 terms and a condition number kappa of 2). float64 data accumulates in float64.
_U32 = 2.0**-24
NORM_DEFAULTS: dict[str, float] = {
    "float64": 136 * 2.0**-53,  # 1.5e-14
    "complex128": 136 * 2.0**-53,
    "float32": 136 * _U32,  # 8.1e-6
    "complex64": 136 * _U32,
    "bfloat16": 8 * 2.0**-8 + 128 * _U32,  # 3.1e-2
    "float16": 8 * 2.0**-11 + 128 * _U32,  # 3.9e-3
    "float8_e4m3fn": 8 * 2.0**-4 + 128 * _U32,  # 0.5
    "float8_e5m2": 8 * 2.0**-3 + 128 * _U32,  # 1.0
}
# Deltas have no norm rule: p_after - p_before cancels, so their rounding noise is an ulp of the
# parameter, not of the delta, and no bound scaled by the delta's own norm holds. The parameters
# kind of the same step carries the check (and its norm rule).
NORM_KIND_DEFAULTS: dict[str, float] = {"delta": math.inf}  # by tolerance class (tracekit/store/kinds.py)

# Unit roundoff of the dtypes a tensor can be stored or computed in (tf32: 10 mantissa bits, as
# float16; its rows below are float16's): the one table of which dtype is coarser. A float32 tensor
# whose computation passed through a coarser dtype (the precision rule, compare/precision.py) gets
# that dtype's defaults, and a tensor stored in two float widths is judged under the coarser one's
# (compare/alignment.py).
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53, "complex128": 2.0**-53, "float32": _U32, "complex64": _U32,
    "tf32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3,  # 3 and 2 mantissa bits
}
DTYPE_DEFAULTS["tf32"] = DTYPE_DEFAULTS["float16"]
NORM_DEFAULTS["tf32"] = NORM_DEFAULTS["float16"]

# The reductions' term above assumes this many terms. Where the stores say how many a tensor's
# reductions summed (compare/reduction.py), a longer reduction widens it to 2 sqrt(n) u_acc; a
# shorter one keeps it: a bound never gets tighter than the one every float32 verdict was made with.
ASSUMED_TERMS = 4096
_U_ACC = {"float64": 2.0**-53, "complex128": 2.0**-53}  # everything else accumulates in float32


def norm_default(dtype: str, terms: int | None) -> float:
    """The norm rule's built-in bound for `dtype`: 8u + 2 sqrt(max(terms, 4096)) u_acc."""
    bound = NORM_DEFAULTS.get(dtype, math.inf)
    if terms is None or terms <= ASSUMED_TERMS or math.isinf(bound):
        return bound  # exactly today's value: float32 margins do not move
    return bound + 2 * (math.sqrt(terms) - math.sqrt(ASSUMED_TERMS)) * _U_ACC.get(dtype, _U32)


def real_float(dtype: str) -> bool:
    """A real floating dtype of UNIT_ROUNDOFF (complex ones have no coarser or finer width here)."""
    return dtype in UNIT_ROUNDOFF and not dtype.startswith("complex")


def coarser_dtype(a: str, b: str) -> str:
    """Of two real float dtypes, the one with the larger unit roundoff; `a` where they round alike
    or either is not a real float dtype."""
    if not (real_float(a) and real_float(b)):
        return a
    return b if UNIT_ROUNDOFF[b] > UNIT_ROUNDOFF[a] else a


def defaults_dtype(stored: str, compute: str | None) -> str:
    """The dtype whose defaults apply: the stored one, or the compute dtype where that is coarser."""
    return stored if compute is None else coarser_dtype(stored, compute)


# The three-way verdict: a candidate element may be this many times further from the float64
# oracle than the reference is (the dynamo accuracy minifier uses 2-3x on RMSE; we apply it per element).
DEFAULT_ORACLE_FACTOR = 3.0


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str = "default"  # where it came from, shown in reports
    rel_l2: float = math.inf  # the norm rule's bound; inf: no norm rule
    elementwise: bool = True  # False: finite elements are judged by the norm rule alone (precision rule)
    terms: int | None = None  # the reduction length derived for the tensor (reduction.py); None: not known


def _check_value(name: str, value, where: str) -> float:
    if isinstance(value, bool):  # TOML's `rtol = true` is not 1.0: a boolean is not a number
        raise UsageError(f"{where}: {name} must be a number, not {str(value).lower()}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {name} must be a number, not {value!r}") from None
    if name == "rel_l2" and v == math.inf:  # no norm rule: the elementwise rule still gates (DIFF.md)
        return v
    if not math.isfinite(v) or v < 0:  # an infinite rtol/atol would pass everything: a gate that cannot fail
        raise UsageError(f"{where}: {name} must be a finite, non-negative number, not {value!r}")
    return v


@dataclass
class Tolerances:
    """Everything the user said about tolerances; `.resolve(kind, dtype)` gives the one that applies."""

    rtol: float | None = None  # global, all kinds and dtypes
    atol: float | None = None
    # --tol: kind -> (rtol, atol) or (rtol, atol, rel_l2)
    kinds: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    config_rtol: float | None = None
    config_atol: float | None = None
    config_kinds: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    config_dtypes: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    exact: bool = False
    rel_l2: float | None = None  # global norm bound (--rel-l2)
    config_rel_l2: float | None = None
    # the precision rule (compare/precision.py): the dtype the computation passed through, whose
    # defaults replace a finer stored dtype's; None: the stored dtype's (any float32 pair)
    compute: str | None = None

    def __post_init__(self):
        if self.rtol is not None:
            self.rtol = _check_value("rtol", self.rtol, "--rtol")
        if self.atol is not None:
            self.atol = _check_value("atol", self.atol, "--atol")
        if self.rel_l2 is not None:
            self.rel_l2 = _check_value("rel_l2", self.rel_l2, "--rel-l2")
        self.kinds = {
            k: tuple(None if x is None else _check_value(n, x, f"tolerance of {k}") for n, x in zip(TOL_NAMES, v))
            for k, v in self.kinds.items()
        }

    def resolve(self, kind: str, dtype: str, terms: int | None = None) -> Tolerance:
        """`terms`: how many terms the tensor's reductions summed (reduction.py), which widens the
        default norm bound beyond ASSUMED_TERMS."""
        if self.exact:
            return Tolerance(0.0, 0.0, "--exact", math.inf, terms=terms)  # equal values: no norm rule can add anything
        eff = defaults_dtype(dtype, self.compute)
        chained = self._chained(dtype)
        builtin = KIND_DEFAULTS.get((tolerance_class(kind), eff))
        default = DTYPE_DEFAULTS.get(eff, EXACT)
        norm = NORM_KIND_DEFAULTS.get(tolerance_class(kind), norm_default(eff, terms))
        label = f"{self.compute} compute, {dtype} stored," if chained else dtype

        def three(t):
            t = tuple(t or ())
            return t + (None,) * (3 - len(t))

        # candidates in precedence order: (rtol, atol, rel_l2, label)
        layers = [
            (*three(self.kinds.get(kind)), f"--tol {kind}"),
            (*three(self.config_kinds.get(kind)), f"config kind.{kind}"),
            (self.rtol, self.atol, self.rel_l2, "--rtol/--atol/--rel-l2"),
            (self.config_rtol, self.config_atol, self.config_rel_l2, "config"),
            (*three(self.config_dtypes.get(dtype)), f"config dtype.{dtype}"),
            (*three(builtin), f"{kind} {label} default"),
            (*default, norm, f"{label} default"),
        ]
        rtol = next((r, src) for r, _, _, src in layers if r is not None)
        atol = next((a, src) for _, a, _, src in layers if a is not None)
        rel_l2 = next((n, src) for _, _, n, src in layers if n is not None)
        source = rtol[1] if rtol[1] == atol[1] else f"rtol: {rtol[1]}, atol: {atol[1]}"
        bound = rel_l2[0]
        if rel_l2[1].endswith(" default"):
            # Never tighter than the elementwise rtol: whoever allows a relative error rtol per element
            # allows it for the tensor as a whole (--tol loss=2e-3,0 lets a 1e-3 loss error pass).
            bound = max(bound, rtol[0])
        else:
            source += f", rel_l2: {rel_l2[1]}"  # a built-in rel_l2 goes without saying
        # Computed in a coarser dtype than stored: a sum's rounding is relative to its terms, not to
        # its value, so an element near zero (cancellation) can be off by far more than rtol of it.
        # No elementwise bound follows from the dtype: the norm rule alone judges finite elements.
        # Deltas have no norm rule and no elementwise bound either: under Adam an element whose tiny
        # gradient changed sign in the low precision moves by about 2 x lr against the reference
        # (TorchTitan's debug model, fp32 vs bf16 FSDP2: 0.2-0.6% of elements, 50-80 x rtol). They
        # are judged by NaN/Inf and by the structure fit; the parameters carry the magnitude check.
        # A tensor stored in the compute dtype itself (TorchTitan's bfloat16 logits under a bfloat16
        # FSDP2 policy) went through the same chain: its storage rounding is the least of it.
        lowered = chained and rtol[1].endswith(" default") and atol[1].endswith(" default")
        elementwise = not (lowered and (not math.isinf(bound) or tolerance_class(kind) == "delta"))
        if chained and kind == "gradients" and rel_l2[1].endswith(" default"):
            # a gradient passes through the forward's chain of low-precision ops and then the
            # backward's, each rounding at u: twice the chain a forward output passes through
            bound *= 2
        return Tolerance(rtol[0], atol[0], source, bound, elementwise, terms)

    def _chained(self, dtype: str) -> bool:
        """Whether a tensor stored in `dtype` carries the rounding of the rule's whole chain of
        low-precision ops, not one rounding into its storage: a rule applies and the stored dtype is
        no coarser than the compute dtype (float32 or bfloat16 values of a bfloat16 forward). A
        coarser storage (float8 under bfloat16) is judged by its own dtype, elementwise, as before."""
        return (self.compute is not None and real_float(dtype)
                and UNIT_ROUNDOFF[dtype] <= UNIT_ROUNDOFF[self.compute])

    def to_dict(self) -> dict:
        return {
            "compute": self.compute,
            "exact": self.exact, "rtol": self.rtol, "atol": self.atol, "rel_l2": self.rel_l2,
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "config": {"rtol": self.config_rtol, "atol": self.config_atol, "rel_l2": self.config_rel_l2,
                       "kinds": {k: list(v) for k, v in self.config_kinds.items()},
                       "dtypes": {k: list(v) for k, v in self.config_dtypes.items()}},
        }


TOL_NAMES = ("rtol", "atol", "rel_l2")


def parse_tol_option(text: str) -> tuple[str, tuple[float, ...]]:
    """'gradients=1e-5,1e-6' -> ('gradients', (1e-5, 1e-6)); a third value is the norm bound rel_l2
    ('inf' switches the norm rule off)."""
    kind, sep, values = text.partition("=")
    parts = values.split(",")
    if not sep or not kind.strip() or len(parts) not in (2, 3):
        raise UsageError(f"--tol {text!r}: expected KIND=RTOL,ATOL[,REL_L2], e.g. --tol gradients=1e-5,1e-6")
    kind = kind.strip()
    where = f"--tol {text}"
    return kind, tuple(_check_value(n, p.strip(), where) for n, p in zip(TOL_NAMES, parts))


# A tolerance file is a few lines; anything larger is not one (and /dev/zero would never end).
MAX_CONFIG_BYTES = 1 << 20
# Keys the config file may hold at its top level besides the tables.
CONFIG_KEYS = {"rtol", "atol", "rel_l2", "equal_nan", "oracle_factor", "kind", "dtype"}


def _pair(table, where: str) -> tuple[float | None, ...]:
    if not isinstance(table, dict) or set(table) - set(TOL_NAMES):
        raise UsageError(f"{where}: expected a table with rtol, atol and/or rel_l2")
    return tuple(None if table.get(n) is None else _check_value(n, table[n], where) for n in TOL_NAMES)


def _check_dtype_name(name: str, where: str) -> None:
    """A table for a dtype that does not exist is a typo ([dtype.flaot32]): applying to nothing, it
    would let a tightened gate pass unnoticed."""
    from tracekit.store.dtypes import storage_dtype

    try:
        storage_dtype(name)
    except ValueError:
        known = ", ".join(sorted(set(DTYPE_DEFAULTS) | {"int64", "int32", "int16", "int8", "uint8", "bool"}))
        raise UsageError(f"{where}: unknown dtype {name!r} (known: {known}, ...)") from None


def load_config(path: str) -> dict:
    """Read a TOML tolerance file into keyword arguments for Tolerances plus equal_nan/oracle_factor.

    rtol = 1e-5            # all kinds and dtypes
    atol = 1e-6
    rel_l2 = 1e-4          # the norm rule's bound (inf: elementwise rule only)
    equal_nan = false
    oracle_factor = 3.0
    [dtype.bfloat16]       # replaces the built-in default of that dtype
    rtol = 2e-2
    [kind.loss]            # one kind, every dtype
    rtol = 1e-4
    atol = 1e-7
    """
    try:
        doc = tomllib.loads(read_small_text(path, "--config", MAX_CONFIG_BYTES))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not valid TOML ({e})") from None
    unknown = set(doc) - CONFIG_KEYS
    if unknown:
        raise UsageError(f"--config {path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(CONFIG_KEYS))}")
    out: dict = {}
    for n in TOL_NAMES:
        if n in doc:
            out[f"config_{n}"] = _check_value(n, doc[n], f"--config {path}")
    for table, key in (("kind", "config_kinds"), ("dtype", "config_dtypes")):
        sub = doc.get(table, {})
        if not isinstance(sub, dict):
            raise UsageError(f"--config {path}: [{table}] must be a table of tables")
        out[key] = {name: _pair(v, f"--config {path} [{table}.{name}]") for name, v in sub.items()}
    for name in out.get("config_dtypes", {}):
        _check_dtype_name(name, f"--config {path} [dtype.{name}]")
    extra = {}
    if "equal_nan" in doc:
        if not isinstance(doc["equal_nan"], bool):
            raise UsageError(f"--config {path}: equal_nan must be true or false")
        extra["equal_nan"] = doc["equal_nan"]
    if "oracle_factor" in doc:
        extra["oracle_factor"] = _check_value("oracle_factor", doc["oracle_factor"], f"--config {path}")
    return {"tolerances": out, **extra}
