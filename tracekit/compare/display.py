"""How a DiffReport shows itself in a Python shell and a notebook: short, never every result."""

from __future__ import annotations

import html

SHOWN_VIOLATIONS = 5


def _where(fd) -> str:
    return f"step {fd.step}, {fd.kind}/{fd.tensor}, rank {fd.rank}" + (
        f", element {tuple(fd.worst.index)}" if fd.worst and fd.worst.index else "")


def short_repr(report) -> str:
    """One line: the verdict line, where the runs first part, and how much the object holds."""
    fd = report.first_divergence
    parts = [report.summary_line]
    if fd is not None:
        parts.append(f"first divergence: {_where(fd)}")
    parts.append(f"{len(report.results)} results held (.results, .violations, .to_dict())")
    return f"<DiffReport {'; '.join(parts)}; ref={report.ref.get('path')!r} cand={report.cand.get('path')!r}>"


def html_repr(report) -> str:
    """A small HTML block: the verdict, the runs, the first divergence and the first few violations."""
    e = lambda x: html.escape(str(x))  # noqa: E731
    colour = {"pass": "#2e7d32", "fail": "#c62828"}.get(report.status, "#ef6c00")
    rows = [("ref", report.ref.get("path")), ("cand", report.cand.get("path")), ("alignment", report.align),
            ("compared", f"{report.num_compared} comparisons, {report.bytes_compared / 1e6:.1f} MB in {report.seconds:.2f} s")]
    fd = report.first_divergence
    if fd is not None:
        rows.append(("first divergence", _where(fd)))
        if fd.worst is not None:
            rows.append(("values there", f"ref {fd.worst.ref!r}, cand {fd.worst.cand!r}"))
    body = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td style='text-align:left'>{e(v)}</td></tr>"
                   for k, v in rows)
    out = [f"<div><p><b style='color:{colour}'>{e(report.status.upper())}</b> <code>{e(report.summary_line)}</code></p>",
           f"<table>{body}</table>"]
    violations = report.violations
    if violations:
        items = "".join(f"<li><code>{e(f'step {v.step} rank {v.rank} {v.kind}/{v.tensor}')}</code>: "
                        f"{v.metrics.violations} of {v.metrics.numel} elements</li>" for v in violations[:SHOWN_VIOLATIONS])
        more = f"<li>... {len(violations) - SHOWN_VIOLATIONS} more (.violations)</li>" if len(violations) > SHOWN_VIOLATIONS else ""
        out.append(f"<p>Violations:</p><ul>{items}{more}</ul>")
    out.append("</div>")
    return "".join(out)
