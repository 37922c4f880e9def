"""The HTML report: one self-contained file (inline CSS, PNGs as base64 data URIs, no network).

A few lines of inline script count the images that loaded and any error on the page, and show a
warning if something did not load; they also leave the counts on <body> (data-images,
data-broken-images, data-errors) for the headless-browser check in the tests.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math

import numpy as np

from tracekit.store.kinds import kind_order

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
.verdict { font-size: 1.4em; font-weight: bold; padding: 0.5em 0.8em; border-radius: 6px; color: white; }
.PASS { background: #2e7d32; } .FAIL { background: #c62828; } .ERROR { background: #ef6c00; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; font-family: monospace; }
tr.bad td { background: #ffebee; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.9em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; border-radius: 4px; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
.note { color: #666; font-size: 0.9em; } .warn { background: #fff3e0; padding: 0.5em; border-left: 4px solid #ef6c00; }
"""

SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener("error", function () { errors += 1; }, true);
  window.addEventListener("load", function () {
    var imgs = document.images, broken = 0;
    for (var i = 0; i < imgs.length; i++) {
      if (!imgs[i].complete || imgs[i].naturalWidth === 0) { broken += 1; }
    }
    document.body.setAttribute("data-images", String(imgs.length));
    document.body.setAttribute("data-broken-images", String(broken));
    document.body.setAttribute("data-errors", String(errors));
    if (broken || errors) {
      var w = document.getElementById("load-warning");
      w.textContent = broken + " image(s) failed to load, " + errors + " error(s) on this page.";
      w.hidden = false;
    }
  });
})();
"""


def e(x) -> str:
    return html.escape(str(x), quote=True)


def fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    return f"{x:.{digits}g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.{digits - 1}e}"


def table(headers, rows, bad_rows=(), numeric=()) -> str:
    """An HTML table; headers None for a two-column list of facts (first column as row headers)."""
    if headers is None:
        body = "".join(f"<tr><th>{e(a)}</th><td>{e(b)}</td></tr>" for a, b in rows)
        return f"<table><tbody>{body}</tbody></table>"
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = ' class="bad"' if i in bad_rows else ""
        cells = "".join(f'<td class="num">{e(c)}</td>' if j in numeric else f"<td>{e(c)}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _runs_section(report, meta: dict) -> str:
    rows = []
    keys = ["path", "device", "backend", "mode", "ranks", "steps", "command", "versions"]
    for k in keys:
        vals = []
        for side in ("ref", "cand"):
            v = meta.get(side, {}).get(k, report.ref.get(k) if side == "ref" else report.cand.get(k))
            if isinstance(v, list):
                v = " ".join(map(str, v))
            elif isinstance(v, dict):
                v = ", ".join(f"{a}={b}" for a, b in v.items())
            vals.append("-" if v is None else v)
        if any(v != "-" for v in vals):
            rows.append([k, *vals])
    return "<h2>Runs</h2>" + table(["", "reference", "candidate"], rows)


def _first_divergence_section(report, ds) -> str:
    fd = report.first_divergence
    if fd is None:
        return "<h2>First divergence</h2><p>None: every compared tensor is within tolerance.</p>"
    w = fd.worst
    m = fd.metrics
    rel = (w.abs_err / abs(w.ref)) if w and w.ref not in (0, None) else None
    rows = [["step", fd.step], ["kind", fd.kind], ["tensor", fd.tensor],
            ["rank (ref rank)", f"{fd.rank} ({fd.ref_rank})"],
            ["element", "(" + ", ".join(map(str, w.index)) + ")" if w else "-"],
            ["reference value", fmt(w.ref, 9) if w else "-"], ["candidate value", fmt(w.cand, 9) if w else "-"],
            ["|cand - ref|", fmt(w.abs_err) if w else "-"], ["relative error", fmt(rel)],
            ["tolerance", f"rtol={fmt(m.rtol)} atol={fmt(m.atol)}"],
            ["violating elements", f"{m.violations} of {m.numel}"], ["cosine", fmt(m.cosine, 9)],
            ["violating ranks there", ", ".join(map(str, fd.ranks))],
            ["violating tensors there", ", ".join(fd.tensors)]]
    key = f"{fd.kind}/{fd.tensor}"
    snippet = (  # works for every kind, scalars such as the loss included (tested)
        "import tracekit\n"
        f"ds = tracekit.open_diff({report.ref.get('path')!r}, {report.cand.get('path')!r})\n"
        "ds.tracekit.first_divergence()\n"
        f"at = ds.sel(step={fd.step}, rank={fd.rank})\n"
        "at['margin'].where(at['compared'] & ~at['passed'], drop=True)   # the failing tensors there\n"
        f"ds.tracekit.locate({key!r}, step={fd.step}, rank={fd.rank})   # the worst element, both values\n"
    )
    return ("<h2>First divergence</h2>" + table(None, rows)
            + "<p>The same in a notebook:</p><pre>" + e(snippet) + "</pre>")


def _loss_section(report, plots) -> str:
    rows = report.loss_table
    if not rows:
        return "<h2>Loss</h2><p class='note'>No loss was compared (neither run recorded the loss kind).</p>"
    out = "<h2>Loss</h2>"
    if plots is not None:
        out += img(plots.loss_curves([r.step for r in rows], [r.ref for r in rows], [r.cand for r in rows],
                                     [r.passed for r in rows]), "loss curves of both runs")
    body = [[r.step, fmt(r.ref, 9), fmt(r.cand, 9), fmt(r.abs_diff), fmt(r.rel_diff), "yes" if r.passed else "NO"]
            for r in rows]
    bad = {i for i, r in enumerate(rows) if not r.passed}
    return out + table(["step", "ref", "cand", "|diff|", "rel. diff", "within tolerance"], body, bad, numeric={1, 2, 3, 4})


def _heatmap_section(ds, plots) -> str:
    if ds is None or plots is None or not ds.sizes.get("tensor"):
        return ""
    from tracekit.report.cells import heatmaps

    out = ["<h2>Violation margin, rank x step</h2>",
           "<p class='note'>Per kind, the largest margin over its tensors: the error divided by the bound "
           "of the rule closer to failing (elementwise |cand - ref| / (atol + rtol |ref|), or the norm rule). "
           "Above 1 (red frame): "
           "outside tolerance; magenta: a NaN or Inf mismatch; grey: not compared.</p>"]
    for hm in heatmaps(ds):
        out.append(img(plots.error_heatmap(hm), f"heatmap of the violation margin of {hm.kind} over rank and step"))
    return "".join(out)


def _worst_section(ds, plots, n: int = 15) -> str:
    if ds is None or not ds.sizes.get("tensor"):
        return ""
    from tracekit.report.cells import worst_tensors

    per = worst_tensors(ds, n)
    if not per:
        return ""
    out = "<h2>Worst tensors</h2>"
    if plots is not None:
        out += img(plots.worst_tensors([f"{d.tensor} (rank {d.rank}, step {d.step})" for d in per],
                                       [d.margin for d in per], [d.failing_pairs > 0 for d in per]),
                   "worst tensors by violation margin")
    rows = [[d.tensor, fmt(d.margin), fmt(d.max_rel_err), d.rank, d.step, d.violations, d.failing_pairs, fmt(d.rtol)]
            for d in per]
    bad = {i for i, d in enumerate(per) if d.failing_pairs}
    return out + table(["tensor", "margin", "max rel. error", "at rank", "at step", "violating elements (all ranks, steps)",
                        "failing (rank, step) pairs", "rtol"], rows, bad, numeric={1, 2, 3, 4, 5, 6, 7})


def _summary_section(report) -> str:
    if not report.summary:
        return ""
    rows, bad = [], set()
    for i, s in enumerate(sorted(report.summary, key=lambda s: (s.step, kind_order(s.kind), s.kind))):
        rows.append([s.step, s.kind, f"{s.violating} / {s.comparisons}", s.violating_elements, fmt(s.max_abs_err),
                     fmt(s.max_rel_err), fmt(s.min_cosine, 9)])
        if s.violating:
            bad.add(i)
    return ("<h2>Per step and kind</h2>"
            + table(["step", "kind", "failing / compared", "violating elements", "max |diff|", "max rel. error",
                     "min cosine"], rows, bad, numeric={0, 3, 4, 5, 6}))


def _tolerance_section(report) -> str:
    if not report.tolerances:
        return ""
    rows = [[t["kind"], t["dtype"], fmt(t["rtol"]), fmt(t["atol"]), t["source"]] for t in report.tolerances]
    return "<h2>Tolerances applied</h2>" + table(["kind", "dtype", "rtol", "atol", "from"], rows, numeric={2, 3})


def _problems_section(report) -> str:
    out = ""
    if report.structural:
        title = "Skipped (present on one side only)" if report.options.get("allow_missing") else "Structural problems"
        out += f"<h2>{title}</h2><ul>" + "".join(f"<li>{e(p.message)}</li>" for p in report.structural) + "</ul>"
        if not report.usable:
            out += "<p>Nothing was compared. Rerun with <code>--allow-missing</code> to compare the common part.</p>"
    if report.not_comparable:
        out += "<h2>Not comparable</h2><ul>" + "".join(
            f"<li>{e(n.kind)}{'/' + e(n.tensor) if n.tensor else ''}: {e(n.reason)}</li>" for n in report.not_comparable) + "</ul>"
    return out


def render(report, ds=None, plots=None, meta: dict | None = None, notes: list[str] = (), extra: list[str] = ()) -> str:
    """The whole page. ds: the open_diff Dataset (None when nothing was compared); plots: the
    tracekit.report.plots module, or None to leave the pictures out (no matplotlib)."""
    from tracekit import __version__

    verdict = report.status.upper()
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tracekit report: {e(verdict)}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{CSS}</style></head><body>",
        '<p id="load-warning" class="warn" hidden></p>',
        "<h1>tracekit report</h1>",
        f'<p class="note">tracekit {e(__version__)}, written {e(now)}; compared in {report.seconds:.2f} s '
        f"({report.bytes_compared / 1e6:.1f} MB), alignment <code>{e(report.align)}</code></p>",
        f'<div class="verdict {e(verdict)}">{e(verdict)}</div>',
        f"<p><code>{e(report.summary_line)}</code></p>",
        *[f'<p class="warn">{e(n)}</p>' for n in notes],
        _runs_section(report, meta or {}),
    ]
    if report.usable:
        parts += [_first_divergence_section(report, ds), _loss_section(report, plots), *extra, _heatmap_section(ds, plots),
                  _worst_section(ds, plots), _summary_section(report), _tolerance_section(report)]
    parts += [_problems_section(report), f"<script>{SCRIPT}</script>", "</body></html>"]
    return "\n".join(p for p in parts if p)
