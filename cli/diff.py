"""`tracekit diff REF CAND`: the parity verdict. Prints what tracekit.compare computes."""

from __future__ import annotations

import sys

import click

from tracekit.cli.common import EXIT_USAGE, check_writable, comparison_options, emit_json, one_line_errors
from tracekit.compare import DEFAULT_ORACLE_FACTOR
from tracekit.compare import diff as run_diff
from tracekit.compare.render import render


class _Progress:
    """A click progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=max(total, 1), label="comparing", file=sys.stderr,
                                         show_eta=True, show_percent=True)
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@click.command("diff")
@click.argument("ref", type=click.Path())
@click.argument("cand", type=click.Path())
@comparison_options
@click.option("--fail-fast", is_flag=True, help="Stop after the first step with a violation.")
@click.option("--oracle", type=click.Path(), help="A float64 CPU recording of the same job: three-way verdict.")
@click.option("--oracle-factor", type=float, default=None,
              help=f"Candidate error allowed, as a multiple of the reference's error against the oracle (default {DEFAULT_ORACLE_FACTOR:g}).")
@click.option("--json", "json_dest", metavar="FILE|-", help="Also write the JSON report (schemas/diff-report.schema.json); '-' for stdout.")
@click.option("--all-tensors", is_flag=True, help="List every compared tensor in the JSON report, not only violations.")
@click.option("--max-rows", type=click.IntRange(min=0), default=20, show_default=True, help="Violations listed in the human report.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Worker threads (default: the CPUs available).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no tables: only the verdict line.")
@one_line_errors
def diff(ref, cand, align, rtol, atol, tol, config, exact, equal_nan, kinds, allow_missing, fail_fast, oracle,
         oracle_factor, json_dest, all_tensors, max_rows, jobs, quiet):
    """Compare a candidate run CAND with a reference run REF, rank by rank and step by step.

    \b
    Exit status: 0 all within tolerance, 1 tolerance violations, 2 unusable input
    (not a store, half-written, too new, unreadable data, structural differences
    without --allow-missing, or nothing to compare). The last line is the verdict:
      PASS comparison ranks=N steps=S
      FAIL comparison ranks=N steps=S violations=V first_step=K
    """
    if json_dest:
        check_writable(json_dest, "--json")  # before the comparison, not after it
    progress = _Progress(enabled=not quiet and sys.stderr.isatty())
    try:
        report = run_diff(
            ref, cand, align=align, rtol=rtol, atol=atol, tol=list(tol), exact=exact, equal_nan=equal_nan,
            config=config, kinds=kinds,
            allow_missing=allow_missing, fail_fast=fail_fast, oracle=oracle, oracle_factor=oracle_factor,
            details="all" if all_tensors else "violations", jobs=jobs, progress=progress)
    finally:
        progress.close()
    if json_dest:
        emit_json(report.to_dict(), json_dest)
    to_stdout = json_dest != "-"  # with the JSON on stdout, the verdict line goes to stderr
    if quiet:
        click.echo(report.summary_line, err=not to_stdout)
    elif to_stdout:
        click.echo(render(report, max_rows=max_rows))
    else:
        click.echo(report.summary_line, err=True)
    if report.status == "error" and not (to_stdout and not quiet):  # the human report already says so
        if report.nothing_compared:
            click.echo(f"Error: nothing was compared: {report.nothing_compared_reason}", err=True)
        else:
            click.echo("Error: the stores differ in structure; pass --allow-missing to compare the common part", err=True)
    sys.exit(report.exit_code if report.exit_code != 2 else EXIT_USAGE)
