"""What a comparison can be asked for, importable without the engine: the CLI builds --help from it."""

from dataclasses import dataclass
from typing import Callable

from tracekit.compare.precision import PRECISION_CHOICES
from tracekit.compare.tolerances import DEFAULT_ORACLE_FACTOR

# rank: by rank and step; coords: by mesh coordinates; global: layout-free, full tensors per step
ALIGN_MODES = ("rank", "coords", "global")



@dataclass(frozen=True)
class DiffOptions:
    """Everything tracekit.diff() can be asked for besides the two stores (its docstring says what
    each does). diff(ref, cand, options) takes one; diff(ref, cand, rtol=...) builds one from the
    keywords, over `options` where both are given."""

    align: str = "rank"
    rtol: float | None = None
    atol: float | None = None
    rel_l2: float | None = None
    tol: object = None  # {"KIND": (rtol, atol[, rel_l2])} or ["KIND=RTOL,ATOL", ...]
    exact: bool = False
    equal_nan: bool | None = None
    config: str | None = None
    tolerances: object = None  # a ready compare.tolerances.Tolerances (the four above then unused)
    kinds: list[str] | None = None
    allow_missing: bool = False
    fail_fast: bool = False
    oracle: object = None  # a store path or an opened RunStore
    oracle_factor: float | None = None
    details: str = "violations"
    jobs: int | None = None
    progress: Callable[[int, int], None] | None = None
    workers: int | None = None
    scheduler: str | None = None
    trust_index: bool = True
    precision: str = "auto"
    structure: bool = True


__all__ = ["ALIGN_MODES", "DEFAULT_ORACLE_FACTOR", "DiffOptions", "PRECISION_CHOICES"]
