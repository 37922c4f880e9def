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


GREY = "#dddddd"  # not compared
NONFINITE_COLOR = "#d500f9"  # a NaN/Inf mismatch: infinite margin
MARGIN_LABEL = "margin = error / bound (elementwise or norm rule); > 1 fails"


def _margin_norm(values: np.ndarray):
    """A log scale that always spans the pass/fail line at margin 1."""
    from matplotlib.colors import LogNorm

    finite = values[np.isfinite(values) & (values > 0)]
    low = min(float(finite.min()) if finite.size else 1e-3, 1e-3)
    high = max(float(finite.max()) if finite.size else 10.0, 10.0)
    return LogNorm(max(low, 1e-12), high)


def heatmap_rgba(hm) -> np.ndarray:
    """(rank, step, 4) colours of a cells.Heatmap: grey not compared, magenta non-finite, else the
    margin on a log colour scale (monotone: every failing cell is brighter than every passing one)."""
    from matplotlib import colormaps

    from tracekit.report import cells

    norm = _margin_norm(hm.margin)
    shown = np.clip(np.nan_to_num(hm.margin, nan=norm.vmin, posinf=norm.vmax), norm.vmin, norm.vmax)
    rgba = colormaps["viridis"](norm(shown))
    rgba[hm.state == cells.NOT_COMPARED] = _rgba(GREY)
    rgba[hm.state == cells.NONFINITE] = _rgba(NONFINITE_COLOR)
    return rgba


def _rgba(color: str):
    from matplotlib.colors import to_rgba

    return to_rgba(color)


def error_heatmap(hm) -> bytes:
    """A cells.Heatmap as a picture: cell colours from heatmap_rgba, red frames on failing cells."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.patches import Rectangle

    from tracekit.report import cells

    n_ranks, n_steps = hm.margin.shape
    fig = _figure(min(11, 2.8 + 0.45 * n_steps), min(14, 1.6 + 0.22 * n_ranks))
    ax = fig.add_subplot()
    ax.imshow(heatmap_rgba(hm), aspect="auto", interpolation="nearest")
    fig.colorbar(ScalarMappable(norm=_margin_norm(hm.margin), cmap=colormaps["viridis"]), ax=ax,
                 label="margin (> 1 fails)")
    for i, j in zip(*np.nonzero((hm.state == cells.FAIL) | (hm.state == cells.NONFINITE))):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=FAIL_COLOR, linewidth=2))
    ax.set_xticks(range(n_steps), [str(s) for s in hm.steps])
    every = max(1, math.ceil(n_ranks / 32))
    ax.set_yticks(range(0, n_ranks, every), [str(r) for r in list(hm.ranks)[::every]])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    fig.suptitle(hm.kind)
    return _png(fig)


def bar_lengths(margins: list[float]) -> np.ndarray:
    """Bar lengths of the worst-tensors plot: the margin, with an infinite one drawn to the axis end
    (beyond every finite bar) and a zero one as a sliver, so that every listed tensor has a bar."""
    values = np.asarray(margins, dtype=float)
    finite = values[np.isfinite(values) & (values > 0)]
    top = max(float(finite.max()) if finite.size else 1.0, 1.0) * 10
    floor = min(float(finite.min()) if finite.size else 1e-3, 1e-3) / 10
    return np.where(np.isinf(values) | np.isnan(values), top, np.clip(values, floor, None))


def worst_tensors(labels: list[str], margins: list[float], failing: list[bool]) -> bytes:
    """Horizontal bars of the worst tensors' margins (log scale, black line at 1), red when failing;
    a NaN/Inf mismatch is a hatched bar to the end of the axis, labelled non-finite."""
    fig = _figure(9, 1.0 + 0.32 * max(len(labels), 1))
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1]
    lengths = bar_lengths(margins)
    bars = ax.barh(y, lengths, color=[FAIL_COLOR if f else OK_COLOR for f in failing])
    for bar, m in zip(bars, margins):
        if not math.isfinite(m):
            bar.set_hatch("//")
            bar.set_facecolor(NONFINITE_COLOR)
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " non-finite ", ha="right", va="center",
                    fontsize=7, color="white")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(MARGIN_LABEL)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
