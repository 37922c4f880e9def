"""What a recording covers, in words: the phrases `tracekit record`'s closing line, `tracekit show`
and --strict's error use (one wording everywhere)."""

from __future__ import annotations

from tracekit.store.coverage import NAMED_BY_POSITION, OUTPUT_NONE, OUTPUT_OBSERVED, Coverage

MAX_LISTED = 8  # left-out tensors named in a line; the rest are counted


def count_phrase(cov: Coverage) -> str:
    """'45 of 45 optimizer parameters'."""
    return f"{cov.recorded} of {cov.optimizer_params} optimizer parameters"


def left_out_line(cov: Coverage) -> str:
    """'left out 2 of 47 optimizer parameters: param45 (4x4: why), ...' (empty when none was)."""
    if cov.complete:
        return ""
    items = [f"{x.name} ({'x'.join(map(str, x.shape)) or 'scalar'}: {x.reason})" for x in cov.left_out[:MAX_LISTED]]
    more = len(cov.left_out) - MAX_LISTED
    return (f"left out {cov.optimizer_params - cov.recorded} of {cov.optimizer_params} optimizer parameters: "
            + ", ".join(items) + (f", and {more} more" if more > 0 else ""))


def model_phrase(cov: Coverage) -> str:
    """'Llama3Model', 'Llama (as Llama.*), Linear (as Linear.*)', or how the tensors are named without one."""
    if cov.named_by == NAMED_BY_POSITION:
        return "none called as a module: parameters named by position (param0, param1, ...)"
    if not cov.roots:
        return "none: the script gave the Recorder its parameters"
    roots = [r.class_name if not r.prefix else f"{r.class_name} (as {r.prefix}.*)" for r in cov.roots]
    return ", ".join(roots) + (f", chosen by {cov.chosen_by}" if cov.chosen_by else "")


def output_phrase(cov: Coverage) -> str:
    if cov.output == OUTPUT_NONE:
        return "none recorded (no module owning the optimizer's parameters was called)"
    if cov.output == OUTPUT_OBSERVED:
        return "what the script passed to Recorder.observe(output=...)"
    roots = " and ".join(r.class_name for r in cov.roots)
    text = f"what {roots}'s forward returned"
    if cov.outside_calls:
        text += (f"; the loop also applied {', '.join(cov.outside_calls)} itself, outside that forward (a chunked "
                 "loss, say): those outputs are not recorded")
    return text


def from_summary(summary: dict | None) -> Coverage | None:
    """The Coverage of a summary's 'coverage' entry (coverage_summary in summary.py)."""
    return Coverage.from_attrs(summary) if summary else None


def summary_lines(summary: dict | None) -> list[str]:
    """`tracekit show`'s lines on the model: its root(s), the coverage, what the output is."""
    cov = from_summary(summary)
    if cov is None:
        return []
    count = count_phrase(cov) + ("" if cov.complete else f" ({left_out_line(cov)})")
    differs = summary.get("differs_on_ranks") or []
    return [f"  root: {model_phrase(cov)}", f"  coverage: {count}", f"  output: {output_phrase(cov)}",
            *([f"  rank {summary['rank']} shown; rank(s) {', '.join(map(str, differs))} recorded other tensors"]
              if differs else [])]
