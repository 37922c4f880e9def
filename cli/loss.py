"""`tracekit loss`: the loss per step of one or more runs side by side."""

from __future__ import annotations

import csv
import io
import math

import click

from tracekit.cli.common import emit_json, json_option, one_line_errors, storage_options, write_text


def _json_safe(v):
    # JSON has no inf/nan: a diverged run's NaN loss must still print as valid JSON.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _cell(v, rel: bool = False) -> str:
    if v is None:
        return "-"
    if rel:
        return f"{v:.3e}"
    return f"{v:.8g}"


def render(table: dict) -> str:
    cols = table["columns"]
    rows = [[_cell(r[c], rel=c.startswith(("abs_diff", "rel_diff"))) if c != "step" else str(r[c]) for c in cols]
            for r in table["rows"]]
    widths = [max(len(x) for x in col) for col in zip(cols, *rows)]
    out = ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in [cols, *rows]]
    runs = "; ".join(f"{r['name']} = {r['path']}" + ("" if r["kind"] == "loss" else f" ({r['kind']})")
                     for r in table["runs"])
    return "\n".join(out + ["", f"runs: {runs}"])


def to_csv(table: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table["columns"])
    for r in table["rows"]:
        w.writerow(["" if r[c] is None else (repr(r[c]) if isinstance(r[c], float) else r[c]) for c in table["columns"]])
    return buf.getvalue()


@click.command()
@click.argument("stores", nargs=-1, required=True, type=click.Path())
@json_option("the table")
@click.option("--csv", "as_csv", is_flag=True, help="Print the table as CSV on stdout instead of text.")
@one_line_errors
@storage_options
def loss(stores, as_json, as_csv):
    """The loss per step of each STORE side by side, with |difference| and relative difference to the first.

    \b
    Example:
      tracekit loss runs/ref runs/cand
    """
    from tracekit.errors import UsageError
    from tracekit.inspect.loss import loss_table

    if as_json and as_csv:
        raise UsageError("choose one of --json and --csv")
    table = loss_table(list(stores))
    if as_json:
        safe = {**table, "rows": [{k: _json_safe(v) for k, v in r.items()} for r in table["rows"]]}
        emit_json(safe, "-")
    elif as_csv:
        write_text("-", to_csv(table), "--csv")
    else:
        click.echo(render(table))
