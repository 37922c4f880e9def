"""The precision context of a rank: the arithmetic its recorded tensors passed through.

A float32 gradient may have been computed in bfloat16 (autocast, an FSDP2 MixedPrecisionPolicy):
the stored dtype does not say so, this does. The recorder fills it (recorders/precision.py), the
store keeps it in the rank metadata under PRECISION_KEY, the diff derives its bounds from it
(tracekit/compare/precision.py). Plain JSON values only; no torch here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tracekit.errors import StoreError

PRECISION_KEY = "precision"  # in a rank group's attributes

# The flags that change how float32 math is done (names as torch.backends spells them).
FLAG_NAMES = ("cuda_matmul_allow_tf32", "cudnn_allow_tf32", "cudnn_enabled", "cudnn_deterministic",
              "cudnn_benchmark", "deterministic_algorithms", "cuda_matmul_allow_bf16_reduction",
              "cuda_matmul_allow_fp16_reduction")
POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype")  # FsdpPolicy's fields


@dataclass(frozen=True)
class FsdpPolicy:
    """One module's FSDP2 MixedPrecisionPolicy (`$defs/precision` fsdp): None where it leaves a dtype alone."""

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None


@dataclass(frozen=True)
class PrecisionContext:
    """What one rank computed in. `autocast`: device type -> dtype of every autocast region seen
    around a forward (an empty dict: forwards seen, none under autocast; None: no forward was seen
    outside a compiled region, so autocast is unknown). `fsdp`: module path -> FSDP2 policy
    ({param_dtype, reduce_dtype, output_dtype}; None where the policy leaves a dtype alone).
    `compiled`: region name -> {backend, mode}."""

    autocast: dict[str, str] | None = None
    fsdp: dict[str, dict[str, str | None]] = field(default_factory=dict)
    matmul_precision: str | None = None  # torch.get_float32_matmul_precision()
    flags: dict[str, bool] = field(default_factory=dict)
    compiled: dict[str, dict[str, str | None]] = field(default_factory=dict)
    device: str | None = None
    backend: str | None = None

    def to_attrs(self) -> dict:
        return asdict(self)

    @property
    def policies(self) -> dict[str, FsdpPolicy]:
        """module path -> its FSDP2 policy, typed (`fsdp` holds them as stored)."""
        return {m: FsdpPolicy(**p) for m, p in self.fsdp.items()}

    @property
    def cuda_tf32_matmuls(self) -> bool:
        """torch.backends.cuda.matmul.allow_tf32 was on."""
        return bool(self.flags.get("cuda_matmul_allow_tf32"))

    @classmethod
    def from_attrs(cls, value, where: str) -> "PrecisionContext":
        """Parse a rank's stored context; a damaged or hostile one is one StoreError naming the place."""

        def bad(what: str):
            return StoreError(f"{where}: malformed precision context: {what} (damaged store?)")

        if not isinstance(value, dict):
            raise bad("not an object")
        autocast = value.get("autocast")
        if autocast is not None and not _str_map(autocast):
            raise bad("autocast")
        fsdp = value.get("fsdp") or {}
        if not isinstance(fsdp, dict) or not all(
                isinstance(k, str) and isinstance(p, dict) and set(p) <= set(POLICY_FIELDS)
                and all(v is None or isinstance(v, str) for v in p.values()) for k, p in fsdp.items()):
            raise bad("fsdp")
        flags = value.get("flags") or {}
        if not isinstance(flags, dict) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in flags.items()):
            raise bad("flags")
        compiled = value.get("compiled") or {}
        if not isinstance(compiled, dict) or not all(
                isinstance(k, str) and isinstance(c, dict) and all(v is None or isinstance(v, str) for v in c.values())
                for k, c in compiled.items()):
            raise bad("compiled")
        for name in ("matmul_precision", "device", "backend"):
            if value.get(name) is not None and not isinstance(value[name], str):
                raise bad(name)
        return cls(autocast=dict(autocast) if autocast is not None else None,
                   fsdp={k: {f: p.get(f) for f in POLICY_FIELDS} for k, p in fsdp.items()},
                   matmul_precision=value.get("matmul_precision"), flags=dict(flags),
                   compiled={k: dict(c) for k, c in compiled.items()},
                   device=value.get("device"), backend=value.get("backend"))

    def lines(self) -> list[str]:
        """Short human lines, one per fact (tracekit show, the diff header)."""
        if self.autocast is None:
            autocast = "unknown (no forward seen outside a compiled region)"
        else:
            autocast = ", ".join(f"{d} {t}" for d, t in sorted(self.autocast.items())) or "off"
        out = [f"autocast: {autocast}"]
        policies = _grouped({k: ", ".join(f"{f}={p[f]}" for f in POLICY_FIELDS if p.get(f)) or "full precision"
                             for k, p in self.fsdp.items()})
        out.append("fsdp mixed precision: " + ("; ".join(f"{v} ({m})" for v, m in policies) or "none"))
        out.append(f"float32 matmul precision: {self.matmul_precision or 'unknown'}")
        on = [k for k in FLAG_NAMES if self.flags.get(k)]
        out.append("flags on: " + (", ".join(on) or "none"))
        regions = _grouped({k: " ".join(f"{f}={v}" for f, v in c.items() if v) for k, c in self.compiled.items()})
        out.append("compiled: " + ("; ".join(f"{v} ({m})" for v, m in regions) or "none"))
        out.append(f"device: {self.device or 'unknown'}, backend: {self.backend or 'none'}")
        return out


def _str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _grouped(by_module: dict[str, str]) -> list[tuple[str, str]]:
    """{module: text} -> [(text, 'm1, m2' or 'N modules')]: equal policies said once."""
    groups: dict[str, list[str]] = {}
    for module, text in by_module.items():
        groups.setdefault(text, []).append(module or "(root)")
    return [(text, ", ".join(ms) if len(ms) <= 3 else f"{len(ms)} modules") for text, ms in groups.items()]


def rank_precision(attrs: dict, where: str) -> PrecisionContext | None:
    """The context a rank recorded, or None (recorded before tracekit kept it, or the rank died first)."""
    value = attrs.get(PRECISION_KEY)
    return None if value is None else PrecisionContext.from_attrs(value, where)
