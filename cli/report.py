"""`tracekit report REF CAND -o report.html`: the diff as one self-contained HTML page."""

from __future__ import annotations

import sys

import click

from tracekit.cli.common import (CommandError, comparison_options, emit_json, json_option, one_line_errors,
                                 storage_options, verdict_error)


@click.command("report")
@click.argument("ref", type=click.Path())
@click.argument("cand", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="HTML file to write: replaced whole, never left half-written; "
              "a pipe, device or link (/dev/stdout) is written into.")
@comparison_options
@click.option("--replay", type=click.Path(), default=None, metavar="STORE",
              help="A replay of CAND's job (tracekit record --replay-from REF): plot its local error against "
                   "CAND's accumulated error per step (docs/REPLAY.md).")
@json_option("the verdict and the file written", "The verdict line goes to stderr. Schema: schemas/report-result.schema.json.")
@one_line_errors
@storage_options
def report(ref, cand, output, align, rtol, atol, rel_l2, tol, config, exact, equal_nan, kinds, allow_missing, replay, as_json):
    """Compare CAND with REF (as `tracekit diff` does) and write the result as one HTML file.

    \b
    The page is self-contained (plots embedded as PNG, no network) and shows the verdict, the
    first divergence, the loss of both runs, heatmaps of the violation margin
    (error / bound; > 1 fails) over rank x step for each kind, and the worst tensors. Plots need matplotlib (pip install 'tracekit[plot]').
    Exit status as `tracekit diff`: 0 pass, 1 tolerance violations, 2 unusable input; the report
    is written in every case but unusable input.
    """
    from tracekit.report import write_report

    notes = []

    def on_note(note):
        notes.append(note)
        click.echo(f"report: {note}", err=True)

    result = write_report(ref, cand, output, align=align, rtol=rtol, atol=atol, rel_l2=rel_l2, tol=list(tol), config=config,
                          exact=exact, equal_nan=equal_nan,
                          kinds=kinds,
                          allow_missing=allow_missing, replay=replay, on_note=on_note)
    if not as_json:
        click.echo(result.summary_line)
        click.echo(f"report: {output}")
        sys.exit(result.exit_code)
    first = result.first_divergence
    emit_json({"output": output, "status": result.status, "passed": result.passed, "summary_line": result.summary_line,
               "ref": ref, "cand": cand, "replay": replay, "violations": result.num_violations,
               "first_step": first.step if first else None, "notes": notes, "exit_status": result.exit_code}, "-")
    click.echo(result.summary_line, err=True)  # with the JSON on stdout, the verdict line goes to stderr, as diff's
    if result.status == "error":
        raise CommandError(verdict_error(result))
    sys.exit(result.exit_code)
