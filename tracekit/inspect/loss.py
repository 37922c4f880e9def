"""The loss per step of one or more runs, side by side, with the difference to the first run."""

from __future__ import annotations

import math
import os

from tracekit.errors import StoreError, UsageError
from tracekit.store import open_store
from tracekit.store.derived_loss import derived_losses
from tracekit.store.kinds import LOSS_KINDS
from tracekit.store.summaries import scalar_value

# The global loss is what the training reports and what runs are compared on; a store recorded
# without it still has each rank's local loss, which is better than nothing.
DERIVED = "loss derived from local_loss"  # the kind column of an unfinalized zero-code store


def run_losses(path) -> tuple[str, dict[int, float]]:
    """(kind used, {step: loss}) for one store: per step, the lowest rank that completed it.

    The global loss is the same on every rank, so one rank speaks for the run; taking the lowest
    rank that has the step keeps a run whose rank 0 died early readable.
    """
    store = open_store(path)
    derived = _derived(store)
    if derived:
        return DERIVED, derived
    for kind in LOSS_KINDS:
        holders = [r for r in store.ranks if kind in store.rank(r).kinds]
        if holders:
            break
    else:
        raise StoreError(f"{path} holds no loss (no {' or '.join(LOSS_KINDS)} data)")
    out: dict[int, float] = {}
    for r in holders:
        view = store.rank(r)
        tensors = view.tensors(kind)
        info = next((t for t in tensors if t.name == kind), tensors[0])
        if info.numel != 1:
            raise StoreError(f"{path}: the {kind} tensor {info.name!r} has {info.numel} elements, not one")
        for step in view.steps(kind):
            if step not in out:
                if info.keeps_bytes:
                    out[step] = float(view.read(kind, step, info.name).reshape(-1)[0])
                else:  # summary only (--full): a one-element tensor's value is in its summary, exactly
                    out[step] = scalar_value(view.summaries(kind, step)[info.name])
    return kind, dict(sorted(out.items()))


def _derived(store) -> dict[int, float]:
    """A zero-code store its launcher never finalized has its ranks' local losses but no `loss`:
    the global loss derived from them as finalize would (store/derived_loss.py), lowest rank first."""
    if any("loss" in store.rank(r).kinds for r in store.ranks):
        return {}
    out: dict[int, float] = {}
    for _, steps in sorted(derived_losses(store)[0].items()):
        for step, value in steps.items():
            out.setdefault(step, float(value))
    return dict(sorted(out.items()))


def run_labels(paths) -> list[str]:
    """Short unique column names: the store folder names, made unique by their position."""
    names = [os.path.basename(os.path.normpath(os.fspath(p))) or os.fspath(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{n}#{i}" for i, n in enumerate(names)]


def _rel(a: float, b: float) -> float | None:
    if b == 0:
        return 0.0 if a == b else math.inf
    return abs(a - b) / abs(b)


def loss_table(paths) -> dict:
    """{'runs': [...], 'columns': [...], 'rows': [{step, <run>: loss, abs_diff[run], rel_diff[run]}]}.

    Rows are the union of steps; a run without a step has None there. Differences are to the
    first run: abs = |run - first|, rel = abs / |first|.
    """
    if not paths:
        raise UsageError("give at least one store")
    labels = run_labels(paths)
    runs = []
    for label, path in zip(labels, paths):
        kind, losses = run_losses(path)
        runs.append({"name": label, "path": os.fspath(path), "kind": kind, "loss": losses})
    steps = sorted(set().union(*(r["loss"] for r in runs)))
    first = runs[0]
    rows = []
    for s in steps:
        row = {"step": s}
        for r in runs:
            row[r["name"]] = r["loss"].get(s)
        base = first["loss"].get(s)
        for r in runs[1:]:
            v = r["loss"].get(s)
            ok = v is not None and base is not None
            row[f"abs_diff[{r['name']}]"] = abs(v - base) if ok else None
            row[f"rel_diff[{r['name']}]"] = _rel(v, base) if ok else None
        rows.append(row)
    columns = ["step", *[r["name"] for r in runs]]
    for r in runs[1:]:
        columns += [f"abs_diff[{r['name']}]", f"rel_diff[{r['name']}]"]
    return {
        "runs": [{k: r[k] for k in ("name", "path", "kind")} for r in runs],
        "columns": columns,
        "rows": rows,
    }
