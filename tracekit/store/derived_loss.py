"""The global loss of a store whose ranks recorded only their local losses (zero-code recording).

global_loss.py has the rule; this module reads its inputs from a store, and at finalize writes
what it derives as each rank's `loss` kind, so that every reader (diff, show, xarray, loss) finds
the loss where a Recorder-made store keeps it. A store left unfinalized gets the same values from
`derived_losses` when read.
"""

from __future__ import annotations

import numpy as np

from tracekit.store.dtypes import storage_dtype
from tracekit.store.global_loss import SOURCE_KIND, derivation_line, derivation_of, derive
from tracekit.store.summaries import scalar_value

LOSS_KIND = "loss"


def _value(view, step: int, info) -> np.ndarray:
    """A rank's local loss at a step, as a 0-d value of its dtype (bfloat16: its float32 value)."""
    dtype = np.float32 if info.dtype == "bfloat16" else storage_dtype(info.dtype)
    if info.keeps_bytes:
        v = view.read(SOURCE_KIND, step, info.name).reshape(-1)[0]
    else:  # --full without it: a one-element tensor's value is in its summary, exactly
        v = scalar_value(view.summaries(SOURCE_KIND, step)[info.name])
    return np.asarray(v, dtype=dtype)


def derived_losses(store) -> tuple[dict[int, dict[int, np.ndarray]], dict[int, str], dict[int, str]]:
    """({rank: {step: global loss}}, {rank: why it has none}, {rank: the loss's logical dtype}) for
    the ranks whose loss is to be derived (their group's `loss_derivation`); empty for other stores."""
    reductions, local, dtypes, coords = {}, {}, {}, {}
    for r in store.ranks:
        view = store.rank(r)
        coords[r] = view.coords
        reduction = derivation_of(view.attrs)
        if reduction is None:
            continue
        reductions[r] = reduction
        if SOURCE_KIND not in view.kinds:
            continue
        tensors = view.tensors(SOURCE_KIND)
        if len(tensors) != 1 or tensors[0].numel != 1:
            continue  # not a scalar loss: nothing to derive from (the rank is named in `why`)
        info = tensors[0]
        dtypes[r] = info.dtype
        local[r] = {s: _value(view, s, info) for s in view.steps(SOURCE_KIND)}
    if not reductions:
        return {}, {}, {}
    if len(set(reductions.values())) > 1:
        why = "the ranks disagree on how their losses combine (loss_derivation)"
        return {}, {r: why for r in reductions}, dtypes
    derived, why = derive(local, coords, next(iter(reductions.values())), dtypes)
    derived = {r: v for r, v in derived.items() if r in reductions}
    return derived, {r: w for r, w in why.items() if r in reductions}, dtypes


def loss_derivation_line(store) -> str | None:
    """How the store's global loss follows from the ranks' local losses, for the record line and
    show ('global loss = sum over dp ranks (TorchTitan pre-divides by global tokens)'); None when no
    rank's loss is derived. Ranks that disagree are named as such: no loss is derived then."""
    lines = {line for r in store.ranks if (line := derivation_line(store.rank(r).attrs)) is not None}
    if len(lines) > 1:
        return "global loss: not derived, the ranks disagree on how their losses combine (loss_derivation)"
    return next(iter(lines), None)


def _bits(value: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # the value is a bfloat16's float32 widening: its top 16 bits
        return (np.asarray(value, dtype=np.float32).reshape(1).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(value, dtype=storage_dtype(dtype)).reshape(1)


def write_derived_losses(location, store) -> dict[int, str]:
    """Write each deriving rank's global loss as its `loss` kind (finalize: no rank writes any more).

    Returns {rank: why it has no derived loss} for the ranks that asked for one and got none.
    """
    from tracekit.store.writer import TensorData, add_kind, remove_kind

    derived, why, dtypes = derived_losses(store)
    asked = (store.meta.get("record_config") or {}).get("kinds")
    for r, steps in derived.items():
        if LOSS_KIND in store.rank(r).kinds or not steps:
            continue  # a loss the rank recorded itself stays as it is
        dtype = dtypes[r]
        rows = [(s, [TensorData(LOSS_KIND, dtype, (), _bits(v, dtype))]) for s, v in sorted(steps.items())]
        add_kind(location, r, LOSS_KIND, rows)
        # Local losses recorded only to derive the loss from go once every one of them has served:
        # the store then holds the kinds that were asked for (a diff against a Recorder-made store
        # finds the same kinds). Kept where a step got no global loss: they are all there is of it.
        if asked is not None and SOURCE_KIND not in asked and sorted(steps) == store.rank(r).steps(SOURCE_KIND):
            remove_kind(location, r, SOURCE_KIND)
    return why
