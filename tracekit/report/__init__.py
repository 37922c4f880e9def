"""The HTML report of a diff: `write_report(ref, cand, "report.html")` (CLI: `tracekit report`).

One self-contained file, viewable offline: the verdict, the first divergence, the loss table and
curves, heatmaps of the violation margin (error / bound) over rank x step per kind, and the worst tensors.
Plots need matplotlib (the `plot` extra); without it the report has the tables only, and says so.
"""

from __future__ import annotations

import os

from tracekit.display import path_text
from tracekit.errors import UsageError
from tracekit.output_file import write_output


def build_report(ref, cand, replay=None, **diff_kwargs):
    """(DiffReport, html text, notes) for REF vs CAND; diff_kwargs go to tracekit.compare.diff.
    replay: a replay store of CAND's job (docs/REPLAY.md), plotted as local against accumulated error."""
    from tracekit.compare import diff
    from tracekit.inspect.diffview import dataset_from_report
    from tracekit.report.html import render
    from tracekit.store import RunStore, open_store

    diff_kwargs = {k: v for k, v in diff_kwargs.items() if k not in ("details", "progress")}
    # each store is opened once, for the diff, the metrics view, the run facts and the replay section
    ref, cand = (s if isinstance(s, RunStore) else open_store(s) for s in (ref, cand))
    report = diff(ref, cand, details="all", **diff_kwargs)
    # the metrics alone: the report draws no element, so it needs neither dask nor tensor views
    ds = dataset_from_report(report, ref, cand, diff_kwargs, elementwise=False) if report.usable else None
    notes = []
    try:
        from tracekit.report import plots

        plots._figure(1, 1)  # fails early, with the install hint, when matplotlib is missing
    except plots.PlottingUnavailable as e:
        plots = None
        notes.append(f"No plots: {e}.")
    meta = {}
    for side, store in (("ref", ref), ("cand", cand)):
        run = store.run_meta
        meta[side] = {"path": store.path, "command": list(run.command) if run.command is not None else None,
                      "versions": dict(run.versions) or None, "ranks": len(store.ranks)}
    extra = []
    if report.traces:  # both stores traced a step (tracekit record --trace): the root-cause op
        from tracekit.report.traces import section as traces_section

        extra.append(traces_section(report, plots))
    if replay is not None:
        from tracekit.report.replay import section

        extra.append(section(ref, cand, replay, plots))
    return report, render(report, ds, plots, meta, notes, extra), notes


def write_report(ref, cand, output, replay=None, on_note=None, **diff_kwargs):
    """Write the HTML report of REF vs CAND to `output`; return the DiffReport. on_note(text) is
    told what the page says it lacks (no plots without matplotlib), for a caller to say it too."""
    output = os.fspath(output)
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise UsageError(f"-o {output}: folder {parent} does not exist")
    report, text, notes = build_report(ref, cand, replay=replay, **diff_kwargs)
    for note in notes if on_note else ():
        on_note(note)
    # a path with a non-UTF-8 byte (a lone surrogate in text) is shown escaped, not a crash
    data = text.encode("utf-8", errors="backslashreplace")
    try:
        write_output(output, data)  # whole or not at all; a pipe or /dev/stdout is written into
    except OSError as e:
        raise UsageError(f"-o {path_text(output)}: cannot write it ({e.strerror or e})") from None
    return report


__all__ = ["build_report", "write_report"]
