"""The precision rule of a comparison: the lowest precision either run computed in.

Each rank records its precision context (tracekit/store/precision.py). A float32 tensor whose
computation passed through bfloat16 (autocast, an FSDP2 MixedPrecisionPolicy) carries bfloat16
rounding, however it is stored; the default tolerances then follow the compute dtype, not the
storage dtype (tolerances.py, docs/DIFF.md "Bounds from the arithmetic"). Pure float32 pairs get
no rule: today's float32 defaults, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.errors import UsageError

# --precision values -> the dtype whose tolerance defaults apply (tf32: 10 mantissa bits like
# float16, so float16's row; see tolerances.UNIT_ROUNDOFF). "fp32" switches any rule off.
PRECISIONS = {"fp32": None, "tf32": "tf32", "fp16": "float16", "bf16": "bfloat16"}
PRECISION_CHOICES = ("auto", *PRECISIONS)
_COMPUTE = {"bfloat16": "bfloat16", "float16": "float16"}  # low-precision dtypes a context can name
_ROUNDOFF = {None: 2.0**-24, "tf32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@dataclass
class PrecisionRule:
    """What the comparison assumed and why: `compute` is the dtype whose defaults apply to wider
    stored tensors (None: the stored dtype's, as for any float32 pair)."""

    compute: str | None
    source: str  # "context" | "--precision" | "unknown"
    reasons: list[str] = field(default_factory=list)  # "cand: autocast cpu bfloat16", ...
    contexts: dict = field(default_factory=dict)  # "ref"/"cand" -> {"ranks": [...], "context": attrs or None}
    differs: list[str] = field(default_factory=list)  # facts of the context that differ between the sides

    @property
    def text(self) -> str:
        """The rule in one line, for the report header."""
        if self.source == "--precision":
            return f"--precision: {self.compute or 'float32'} defaults for wider stored tensors"
        if self.compute is None:
            if self.source == "unknown":
                return "stored dtype (no precision context recorded on " + ", ".join(self.reasons) + ")"
            return "stored dtype (both sides computed in float32)"
        return f"{self.compute} compute defaults for float32 tensors ({'; '.join(self.reasons)})"

    def to_dict(self) -> dict:
        return {"compute": self.compute, "source": self.source, "reasons": self.reasons, "rule": self.text,
                "contexts": self.contexts, "differs": self.differs}


def _lowest(a: str | None, b: str | None) -> str | None:
    return a if _ROUNDOFF[a] >= _ROUNDOFF[b] else b


def context_compute(ctx) -> tuple[str | None, list[str]]:
    """The lowest precision one rank's context (a PrecisionContext) says its forward or reductions ran in."""
    low, why = None, []
    for device, dtype in sorted((ctx.autocast or {}).items()):
        if dtype in _COMPUTE:
            low = _lowest(low, _COMPUTE[dtype])
            why.append(f"autocast {device} {dtype}")
    for f in ("param_dtype", "reduce_dtype"):
        dtypes = sorted({getattr(p, f) for p in ctx.policies.values() if getattr(p, f) in _COMPUTE})
        for dtype in dtypes:
            low = _lowest(low, _COMPUTE[dtype])
            why.append(f"fsdp {f}={dtype}")
    on_cuda = (ctx.device or "").startswith("cuda")
    if ctx.matmul_precision == "medium":  # bfloat16 matmuls allowed, on any device that has them
        low = _lowest(low, "bfloat16")
        why.append("float32 matmul precision medium")
    elif on_cuda and (ctx.matmul_precision == "high" or ctx.cuda_tf32_matmuls):
        low = _lowest(low, "tf32")
        why.append("tf32 matmuls")
    return low, why


def _side(catalog) -> tuple[list, list[int]]:
    """[(rank, PrecisionContext or None)] of a StoreCatalog, and the ranks without one."""
    out = [(r, rc.view.precision) for r, rc in sorted(catalog.ranks.items())]
    return out, [r for r, c in out if c is None]


def _facts(ctx) -> dict:
    return {line.partition(":")[0]: line.partition(": ")[2] for line in ctx.lines()}


def derive(refc, candc, precision: str = "auto") -> PrecisionRule:
    """The rule for a comparison of two StoreCatalogs, or the one `--precision` forces."""
    if precision not in PRECISION_CHOICES:
        raise UsageError(f"--precision must be one of {', '.join(PRECISION_CHOICES)}, not {precision!r}")
    sides = {"ref": _side(refc), "cand": _side(candc)}
    contexts, facts = {}, {}
    for name, (ranks, _missing) in sides.items():
        groups: dict[str, list[int]] = {}
        values = {}
        for r, ctx in ranks:
            key = repr(ctx.to_attrs() if ctx is not None else None)
            groups.setdefault(key, []).append(r)
            values[key] = ctx
        contexts[name] = [{"ranks": rs, "context": values[k].to_attrs() if values[k] is not None else None}
                          for k, rs in groups.items()]
        known = [values[k] for k in groups if values[k] is not None]
        facts[name] = _facts(known[0]) if len(known) == 1 and len(groups) == 1 else None
    differs = []
    if facts["ref"] is not None and facts["cand"] is not None:
        differs = [k for k in facts["ref"] if facts["ref"][k] != facts["cand"].get(k)]
    if precision != "auto":
        return PrecisionRule(PRECISIONS[precision], "--precision", [], contexts, differs)
    low, why, unknown = None, [], []
    for name, (ranks, missing) in sides.items():
        if missing:
            unknown.append(f"{name} rank(s) {', '.join(map(str, missing))}")
        for _r, ctx in ranks:
            if ctx is None:
                continue
            c, reasons = context_compute(ctx)
            low = _lowest(low, c)
            why += [f"{name}: {w}" for w in reasons if f"{name}: {w}" not in why]
    if low is None and unknown:
        return PrecisionRule(None, "unknown", unknown, contexts, differs)
    return PrecisionRule(low, "context", why, contexts, differs)
