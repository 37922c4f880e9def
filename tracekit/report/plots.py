"""The report's pictures as PNG bytes, drawn with matplotlib's object API.

No pyplot: figures are made with matplotlib.figure.Figure and rendered by Agg, so building a
report never changes the plotting backend or the open figures of a notebook that calls it.
"""

from __future__ import annotations

import io
import math

import numpy as np

DPI = 110
FAIL_COLOR = "#c62828"
OK_COLOR = "#607d8b"


class PlottingUnavailable(RuntimeError):
    pass


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:  # matplotlib is the optional extra `plot`
        raise PlottingUnavailable("matplotlib is not installed (pip install 'tracekit[plot]')") from None
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def loss_curves(steps, ref, cand, passed, ref_label="ref", cand_label="cand") -> bytes:
    """Both loss curves, and below them |cand - ref| / |ref| per step (failing steps in red)."""
    fig = _figure(8, 5.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    top.plot(steps, ref, "o-", label=ref_label, color="#1565c0")
    top.plot(steps, cand, "s--", label=cand_label, color="#ef6c00", markerfacecolor="none")
    top.set_ylabel("loss")
    top.legend()
    top.grid(alpha=0.3)
    rel = np.array([abs(c - r) / abs(r) if r not in (0, None) else np.nan for r, c in zip(ref, cand)], dtype=float)
    shown = np.where(rel > 0, rel, np.nan)
    colors = [OK_COLOR if ok else FAIL_COLOR for ok in passed]
    bottom.bar(steps, np.nan_to_num(shown, nan=0.0), color=colors)
    if np.isfinite(shown).any():
        bottom.set_yscale("log")
    else:
        bottom.text(0.5, 0.5, "identical losses at every step", ha="center", va="center", transform=bottom.transAxes)
    bottom.set_ylabel("rel. difference")
    bottom.set_xlabel("step")
    if len(steps) <= 30:
        bottom.set_xticks(list(steps))
    else:
        from matplotlib.ticker import MaxNLocator

        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.grid(alpha=0.3)
    return _png(fig)


def error_heatmap(values: np.ndarray, failing: np.ndarray, ranks, steps, title: str) -> bytes:
    """values: (rank, step) max relative error (NaN: not compared); failing cells get a red frame."""
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")  # grey: not compared
    n_ranks, n_steps = values.shape
    fig = _figure(min(11, 2.8 + 0.45 * n_steps), min(14, 1.6 + 0.22 * n_ranks))
    ax = fig.add_subplot()
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size:
        floor = max(float(positive.min()), 1e-12)
        top = max(float(positive.max()), floor * 10)
        shown = np.where(np.isfinite(values), np.clip(values, floor, None), np.nan)
        im = ax.imshow(shown, aspect="auto", cmap=cmap, norm=LogNorm(floor, top), interpolation="nearest")
        fig.colorbar(im, ax=ax, label="max relative error")
    else:
        ax.imshow(np.where(np.isfinite(values), 0.0, np.nan), aspect="auto", cmap=cmap, vmin=0, vmax=1,
                  interpolation="nearest")
        ax.set_title("no difference anywhere", fontsize=9)
    for i, j in zip(*np.nonzero(failing)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=FAIL_COLOR, linewidth=2))
    ax.set_xticks(range(n_steps), [str(s) for s in steps])
    every = max(1, math.ceil(n_ranks / 32))
    ax.set_yticks(range(0, n_ranks, every), [str(r) for r in list(ranks)[::every]])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    fig.suptitle(title)
    return _png(fig)


def worst_tensors(labels: list[str], values: list[float], failing: list[bool], rtols: list[float]) -> bytes:
    """Horizontal bars of the worst max relative errors (log scale), red when outside tolerance."""
    fig = _figure(9, 1.0 + 0.32 * max(len(labels), 1))
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1]
    shown = [v if v > 0 and math.isfinite(v) else np.nan for v in values]
    ax.barh(y, np.nan_to_num(shown, nan=0.0), color=[FAIL_COLOR if f else OK_COLOR for f in failing])
    for yi, rt in zip(y, rtols):
        ax.plot([rt, rt], [yi - 0.4, yi + 0.4], color="black", linewidth=1)
    ax.set_yticks(y, labels, fontsize=8)
    if any(np.isfinite(shown)):
        ax.set_xscale("log")
    ax.set_xlabel("max relative error (black tick: rtol)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
