"""The report's traces section: the root-cause op and where along the model the error appears.

From the diff's trace comparisons (tracekit record --trace): the root cause as `tracekit diff`
prints it, and a per-module error plot of the traced step where it was found: for each module
in forward order, the largest relative L2 difference of its events' first outputs against the
reference, forward and backward. A user sees the module where the error first appears, and how
it grows (or not) downstream.
"""

from __future__ import annotations

import math

from tracekit.compare.rootcause import first_root_cause, render_root_cause


def module_errors(tc) -> tuple[list[str], dict[str, list[float]]]:
    """Modules in order of first appearance, and per phase their largest rel L2 difference (nan: none compared)."""
    order: list[str] = []
    errs: dict[tuple[str, str], float] = {}
    for e in tc.events:
        m = e["module"] or "(top)"
        if m not in order:
            order.append(m)
        v = e["rel_l2_err"]
        if isinstance(v, float) and math.isfinite(v):
            key = (e["phase"], m)
            errs[key] = max(errs.get(key, 0.0), v)
    return order, {ph: [errs.get((ph, m), math.nan) for m in order] for ph in ("fwd", "bwd", "opt")}


def module_error_plot(tc, root_module: str | None) -> bytes:
    import numpy as np

    from tracekit.report.plots import FAIL_COLOR, _figure, _png

    order, by_phase = module_errors(tc)
    fig = _figure(max(5.0, 0.6 * len(order) + 2), 3.6)
    ax = fig.subplots()
    x = np.arange(len(order))
    for off, (phase, color) in zip((-0.2, 0.2), (("fwd", "#1565c0"), ("bwd", "#ef6c00"))):
        vals = np.array(by_phase[phase], dtype=float)
        shown = np.where(vals > 0, vals, np.nan)
        ax.bar(x + off, np.nan_to_num(shown, nan=0.0), width=0.4, color=color, label=phase)
    if any(v > 0 for ph in ("fwd", "bwd") for v in by_phase[ph] if math.isfinite(v)):
        ax.set_yscale("log")
    if root_module is not None and root_module in order:
        ax.axvline(order.index(root_module), color=FAIL_COLOR, linestyle="--", label="root cause")
    ax.set_xticks(x, order, rotation=45, ha="right")
    ax.set_ylabel("max rel. L2 difference")
    ax.set_title(f"step {tc.step}, rank {tc.rank}: error per module ({tc.level} trace)")
    ax.legend()
    return _png(fig)


def section(report, plots) -> str:
    from tracekit.report.html import e, img

    if not report.traces:
        return ""
    text = "\n".join(render_root_cause(report.traces, passed=report.passed)).strip()
    rc = first_root_cause(report.traces)
    tc = next((t for t in report.traces if rc is not None and (t.rank, t.step, t.level) == (rc.rank, rc.step, rc.level)),
              report.traces[0])
    picture = ""
    if plots is not None:
        picture = img(module_error_plot(tc, (rc.event.module or "(top)") if rc else None), "error per module")
    return f"<h2>Traces: the root-cause op</h2><pre>{e(text)}</pre>{picture}"
