"""The one registry of recorded kinds: adding a kind means adding one row to KIND_TABLE.

Recorder, diff, inspect, interchange and replay read it; none of them lists kinds itself.
"""

from __future__ import annotations

from dataclasses import dataclass

# parameters hold step 0: the initial parameters, before the first optimizer step.
INITIAL_STEP = 0


@dataclass(frozen=True)
class Kind:
    """One kind of recorded data.

    order: position in compute order within a step (the diff reports the first divergence in this
      order). default: recorded unless the user edits the kinds. first_step: the first step that
      holds it (INITIAL_STEP for the initial parameters, else 1). layout: how its tensors relate
      across ranks: "replicated" (the same on every data-parallel replica of a full-tensor
      recording), "per_rank" (depends on the rank's data shard: outputs, local loss), "varies"
      (shapes may differ between layouts, so a tensor is compared only where shapes agree).
    tolerance: the tolerance class the diff resolves per dtype (see compare/tolerances.py);
      "parameter" tightens atol because parameters move by tiny updates; "delta" has no norm rule
      (p_after - p_before cancels, so its noise is an ulp of the parameter, not of the delta).
    """

    name: str
    order: int
    default: bool
    first_step: int = 1
    layout: str = "replicated"
    tolerance: str = "value"


KIND_TABLE: tuple[Kind, ...] = (
    Kind("outputs", 0, True, layout="per_rank"),
    Kind("loss", 1, True),
    Kind("local_loss", 2, False, layout="per_rank"),
    Kind("gradients", 3, True),
    Kind("parameters", 4, True, first_step=INITIAL_STEP, tolerance="parameter"),
    Kind("deltas", 5, True, tolerance="delta"),
    Kind("optimizer_state", 6, False, layout="varies"),
)

BY_NAME: dict[str, Kind] = {k.name: k for k in KIND_TABLE}
KINDS: tuple[str, ...] = tuple(k.name for k in KIND_TABLE)  # compute order
DEFAULT_KINDS: tuple[str, ...] = tuple(k.name for k in KIND_TABLE if k.default)
LAYOUT_DEPENDENT_KINDS = frozenset(k.name for k in KIND_TABLE if k.layout == "per_rank")
REPLICATED_KINDS = frozenset(k.name for k in KIND_TABLE if k.layout == "replicated")
LOSS_KINDS = ("loss", "local_loss")


@dataclass(frozen=True)
class TraceKind:
    """One kind of event stream (`tracekit record --trace NAME`), recorded only for the chosen
    steps, under the rank's traces group (store/traces.py), and compared event by event
    (compare/traces.py, compare/rootcause.py) with the tolerance that `tolerance` names
    (`--tol traces=...` overrides it).

    order: coarse to fine; what: the one line `tracekit record --help` shows for it."""

    name: str
    order: int
    what: str
    tolerance: str = "traces"


TRACE_TABLE: tuple[TraceKind, ...] = (
    TraceKind("modules", 0, "every module's forward output and backward gradient-output"),
    TraceKind("ops", 1, "every dispatched aten op with its inputs, outputs and scalar arguments"),
)

TRACE_LEVELS: tuple[str, ...] = tuple(t.name for t in TRACE_TABLE)
TRACE_BY_NAME: dict[str, TraceKind] = {t.name: t for t in TRACE_TABLE}


def kind_order(kind: str) -> int:
    """Position in compute order; kinds unknown to this version sort after the known ones."""
    k = BY_NAME.get(kind)
    return k.order if k is not None else len(KIND_TABLE)


def sort_kinds(kinds) -> list[str]:
    """Kinds in compute order, unknown ones last by name."""
    return sorted(kinds, key=lambda k: (kind_order(k), k))


def tolerance_class(kind: str) -> str:
    k = BY_NAME.get(kind)
    return k.tolerance if k is not None else "value"


def has_step(kind: str, step: int) -> bool:
    """Whether `kind` can hold `step` (only parameters hold the initial step 0)."""
    k = BY_NAME.get(kind)
    return step >= (k.first_step if k is not None else 1)
