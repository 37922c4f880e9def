"""The report's replay section: a candidate's accumulated error against its replayed (local) error.

CAND ran freely from its own state; REPLAY (`tracekit record --replay-from REF`) restarted every
step from REF's state. Per step, the largest |parameter - REF parameter| over all ranks and
tensors: growing in CAND but flat in REPLAY means a small per-step error compounding; a spike in
REPLAY is a step that computes something wrong. See docs/REPLAY.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.store import RunStore, open_store
from tracekit.store.location import same_store

KIND = "parameters"


@dataclass(frozen=True)
class StepErrors:
    step: int
    accumulated: float  # max |cand - ref| after the step (nan: not recorded on both sides)
    local: float  # max |replay - ref| after the step


def _max_abs_err(ref: RunStore, other: RunStore, step: int) -> float:
    worst = np.nan
    for r in sorted(set(ref.ranks) & set(other.ranks)):
        a, b = ref.rank(r), other.rank(r)
        if KIND not in a.kinds or KIND not in b.kinds or step not in a.steps(KIND) or step not in b.steps(KIND):
            continue
        x, y = a.read_kind(KIND, step), b.read_kind(KIND, step)
        for name in x.keys() & y.keys():
            if x[name].shape == y[name].shape and x[name].size:
                d = float(np.max(np.abs(y[name].astype(np.float64) - x[name].astype(np.float64))))
                worst = d if np.isnan(worst) else max(worst, d)
    return worst


def replay_errors(ref, cand, replay) -> tuple[list[StepErrors], list[str]]:
    """Per step (from 1): accumulated and local parameter error; and notes about the stores."""
    ref, cand, replay = (s if isinstance(s, RunStore) else open_store(s) for s in (ref, cand, replay))
    notes = []
    of = replay.run_meta.replay_of or next(
        (replay.rank(r).meta.replay_of for r in replay.ranks if replay.rank(r).meta.replay_of), None)
    if of is None:
        notes.append(f"{replay.path} does not record being a replay (no replay_of); its errors may not be local.")
    elif not same_store(of, ref.path):
        notes.append(f"{replay.path} is a replay of {of}, not of the reference {ref.path}.")
    steps = sorted({s for st in (cand, replay) for r in st.ranks if KIND in st.rank(r).kinds
                    for s in st.rank(r).steps(KIND) if s > 0})
    rows = [StepErrors(s, _max_abs_err(ref, cand, s), _max_abs_err(ref, replay, s)) for s in steps]
    return [r for r in rows if not (np.isnan(r.accumulated) and np.isnan(r.local))], notes


def plot(rows: list[StepErrors], figure, png) -> bytes:
    """Both errors per step, log scale. figure/png: the report's plots._figure and plots._png."""
    fig = figure(8, 3.6)
    ax = fig.add_subplot()
    steps = [r.step for r in rows]
    for values, style, label, color in (([r.accumulated for r in rows], "o-", "accumulated (candidate)", "#ef6c00"),
                                        ([r.local for r in rows], "s-", "local (replay)", "#1565c0")):
        shown = np.array([v if v > 0 else np.nan for v in values], dtype=float)
        ax.plot(steps, shown, style, label=label, color=color)
    if any(v > 0 for r in rows for v in (r.accumulated, r.local)):
        ax.set_yscale("log")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("max |param - ref param|")
    ax.legend()
    ax.grid(alpha=0.3)
    return png(fig)


def section(ref, cand, replay, plots=None) -> str:
    """The HTML section (plots: the tracekit.report.plots module, or None for the table only)."""
    from tracekit.report.html import e, fmt, img, table

    rows, notes = replay_errors(ref, cand, replay)
    out = ["<h2>Replay: local against accumulated error</h2>",
           f"<p class='note'>Replay store <code>{e(replay)}</code>: each step restarted from the reference's "
           "state, so its error is that step's own. Growing accumulated error with flat local error: a small "
           "per-step error compounding; a local spike: a step that computes something wrong.</p>",
           *[f"<p class='warn'>{e(n)}</p>" for n in notes]]
    if not rows:
        return "".join(out) + "<p class='note'>No parameters recorded on both sides to compare.</p>"
    if plots is not None:
        out.append(img(plot(rows, plots._figure, plots._png), "accumulated and local parameter error per step"))
    body = [[r.step, fmt(r.accumulated), fmt(r.local),
             fmt(r.accumulated / r.local) if r.local and np.isfinite(r.local) else "-"] for r in rows]
    out.append(table(["step", "accumulated max |diff|", "local max |diff| (replay)", "accumulated / local"],
                     body, numeric={0, 1, 2, 3}))
    return "".join(out)
