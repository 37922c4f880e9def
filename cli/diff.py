"""`tracekit diff REF CAND`: the parity verdict. Prints what tracekit.compare computes."""

from __future__ import annotations

import sys

import click

from tracekit.cli.common import (EXIT_USAGE, CommandError, check_writable, comparison_options, emit_json, json_option,
                                 one_line_errors, storage_options, verdict_error)
from tracekit.compare.options import DEFAULT_ORACLE_FACTOR, PRECISION_CHOICES


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


def environment_block(diffs: list[dict]) -> str:
    """A few lines naming the versions and numeric env vars that differ between REF and CAND."""
    if not diffs:
        return ""
    show = lambda v: "(unset)" if v is None else v  # noqa: E731
    lines = ["Environment differs between REF and CAND (versions and numeric env vars; may explain differences):"]
    lines += [f"  {d['fact']}: REF {show(d['values']['REF'])}, CAND {show(d['values']['CAND'])}" for d in diffs]
    return "\n".join(lines)


@click.command("diff")
@click.argument("ref", type=click.Path())
@click.argument("cand", type=click.Path())
@comparison_options
@click.option("--fail-fast", is_flag=True, help="Stop after the first step with a violation.")
@click.option("--oracle", type=click.Path(), help="A float64 CPU recording of the same job: three-way verdict.")
@click.option("--oracle-factor", type=float, default=None,
              help=f"Candidate error allowed, as a multiple of the reference's error against the oracle (default {DEFAULT_ORACLE_FACTOR:g}).")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="The precision the tolerance defaults assume for float32 tensors: auto derives it from the lowest "
                   "precision either run recorded computing in (autocast, FSDP2 mixed precision, TF32; docs/DIFF.md); "
                   "bf16, fp16, tf32 or fp32 sets it.")
@click.option("--structure/--no-structure", default=True, show_default=True,
              help="Fit each step's errors against simple shapes (a scale cand = k x ref, a sign flip, a constant "
                   "shift), look for values equal to the reference's at another step or rank and for one-rank and "
                   "NaN/Inf patterns: a strongly structured error is a violation even inside the bounds, "
                   "unstructured error is reported as rounding-like (docs/DIFF.md).")
@click.option("--trust-index/--check-hashes", "trust_index", default=True,
              help="Format 2: tensors whose content hashes are equal on both sides are identical; by default "
                   "(--trust-index) they are decided from the two indexes without reading their bytes, so two "
                   "identical stores diff at metadata speed and the report counts what was decided so. "
                   "--check-hashes also reads those bytes back and checks them against their hashes: damage in "
                   "either store is then exit 2 (`tracekit verify STORE` checks one store whole). Bytes the diff "
                   "reads are always checked.")
@json_option("the report", "The verdict line goes to stderr. Schema: schemas/diff-report.schema.json.")
@click.option("--json-file", "json_file", metavar="FILE", type=click.Path(),
              help="Also write the JSON report to FILE, next to the text on stdout.")
@click.option("--all-tensors", is_flag=True, help="List every compared tensor in the JSON report, not only violations.")
@click.option("--max-rows", type=click.IntRange(min=0), default=20, show_default=True, help="Violations listed in the human report.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Worker threads (default: the CPUs available).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no tables: only the verdict line.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Compare on a local Dask cluster of N worker processes (N > 1; 1: this process). See docs/CLUSTERS.md.")
@click.option("--scheduler", metavar="ADDRESS", default=None,
              help="Compare on an existing Dask cluster, e.g. tcp://10.0.0.5:8786; its workers must reach both stores.")
@one_line_errors
@storage_options
def diff(ref, cand, align, rtol, atol, rel_l2, tol, config, exact, equal_nan, kinds, allow_missing, fail_fast, oracle,
         oracle_factor, precision, structure, trust_index, as_json, json_file, all_tensors, max_rows, jobs, quiet, workers, scheduler):
    """Compare a candidate run CAND with a reference run REF, rank by rank and step by step.

    \b
    Exit status: 0 all within tolerance, 1 tolerance violations, 2 unusable input
    (not a store, half-written, too new, unreadable data, structural differences
    without --allow-missing, or nothing to compare). The last line is the verdict:
      PASS comparison ranks=N steps=S
      FAIL comparison ranks=N steps=S violations=V first_step=K
    """
    from tracekit.compare import diff as run_diff  # the engine, only when comparing (not for --help)
    from tracekit.compare.render import render
    from tracekit.inspect.facts import differences, run_facts
    from tracekit.store import open_store

    if json_file:
        check_writable(json_file, "--json-file")  # before the comparison, not after it
    ref, cand = open_store(ref), open_store(cand)  # once, for the diff and the environment check
    progress = _Progress(enabled=not quiet and sys.stderr.isatty())
    try:
        report = run_diff(
            ref, cand, align=align, rtol=rtol, atol=atol, rel_l2=rel_l2, tol=list(tol), exact=exact, equal_nan=equal_nan,
            config=config, kinds=kinds,
            allow_missing=allow_missing, fail_fast=fail_fast, oracle=oracle, oracle_factor=oracle_factor,
            details="all" if all_tensors else "violations", jobs=jobs, progress=progress, workers=workers,
            scheduler=scheduler, trust_index=trust_index, precision=precision, structure=structure)
    finally:
        progress.close()
    if json_file:
        emit_json(report.to_dict(), json_file, "--json-file")
    if as_json:
        emit_json(report.to_dict(), "-")
    to_stdout = not as_json  # with the JSON on stdout, the verdict line goes to stderr
    env_block = "" if quiet else environment_block(differences({"REF": run_facts(ref), "CAND": run_facts(cand)}))
    if quiet:
        click.echo(report.summary_line, err=not to_stdout)
    elif to_stdout:
        text = render(report, max_rows=max_rows)
        if env_block:  # just before the verdict, the last line
            body, _, verdict = text.rpartition("\n")
            text = f"{body}\n{env_block}\n{verdict}" if body else f"{env_block}\n{verdict}"
        click.echo(text)
    else:
        if env_block:
            click.echo(env_block, err=True)
        click.echo(report.summary_line, err=True)
    if report.status == "error" and not (to_stdout and not quiet):  # the human report already says so
        raise CommandError(verdict_error(report))
    sys.exit(report.exit_code if report.exit_code != 2 else EXIT_USAGE)
