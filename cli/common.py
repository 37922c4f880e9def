"""What every command shares: one-line errors with exit codes, and JSON output.

Conventions of every command:
- `--json` is a flag: the command's result goes to stdout as JSON instead of the human text
  (`tracekit diff` then prints its verdict line on stderr). Write a file with the shell's `>`.
- Exit status 0 success, 1 a verdict of failure (diff violations), 2 unusable input; the error is one
  `Error: ...` line on stderr (a click.ClickException), never a traceback.
"""

from __future__ import annotations

import functools
import json
import os

import click

from tracekit.display import terminal_safe
from tracekit.errors import TracekitError, UsageError

# Exit codes shared by all commands: 0 success, 1 a verdict of failure (diff violations), 2 unusable input.
EXIT_FAIL = 1
EXIT_USAGE = 2


class CommandError(click.ClickException):
    """A user's error (bad input, unusable store): click prints `Error: message` on stderr and exits 2."""

    exit_code = EXIT_USAGE


def one_line_errors(fn):
    """Raise tracekit's own errors as CommandError: one `Error: ...` line and exit 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TracekitError as e:
            # one line, always: names and paths in messages are data, never control sequences
            raise CommandError(terminal_safe(str(e)).replace("\n", "|")) from None

    return wrapper


def _kind_list(ctx, param, value):
    if value is None:
        return None
    kinds = [k.strip() for k in value.split(",") if k.strip()]
    if not kinds:
        raise click.BadParameter(f"{value!r} names no kind", ctx=ctx, param=param)
    return kinds


def storage_options(fn):
    """`--storage-option KEY=VALUE` (repeatable): fsspec options for stores given as URLs (s3://...).

    They apply to every URL the command opens (tracekit.store.location.storage_options_scope), and
    `tracekit record` hands them to its ranks in their environment. They are never printed, and
    never written into a store or a report."""

    @functools.wraps(fn)
    def wrapper(*args, storage_option=(), **kwargs):
        if not storage_option:
            return fn(*args, **kwargs)
        from tracekit.store.location import parse_storage_options, storage_options_scope

        with storage_options_scope(parse_storage_options(storage_option)):
            return fn(*args, **kwargs)

    return click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
                        help="Option for stores given as URLs, e.g. endpoint_url=http://host:9000 or "
                             "client_kwargs.region_name=eu-west-1; repeatable. Credentials: the AWS chain.")(wrapper)


def json_option(what: str, note: str = "", where: str = "on stdout instead of text"):
    """`--json`, the same flag in every command: print `what` as JSON on stdout instead of the text."""
    return click.option("--json", "as_json", is_flag=True,
                        help=f"Print {what} as JSON {where}.{' ' + note if note else ''}")


def comparison_options(fn):
    """The options that choose what `diff` and `report` compare and how closely (one definition).

    The wrapped command receives align, rtol, atol, rel_l2, tol (a tuple), config, exact, equal_nan,
    kinds (a list or None) and allow_missing.
    """
    from tracekit.compare.options import ALIGN_MODES  # constants only: --help stays light

    options = [
        click.option("--align", type=click.Choice(ALIGN_MODES), default="rank", show_default=True,
                     help="rank: by rank and step; coords: by mesh coordinates; global: layout-free, full tensors per step."),
        click.option("--rtol", type=float, help="Relative tolerance for every kind (default: per dtype, see docs/DIFF.md)."),
        click.option("--atol", type=float, help="Absolute tolerance for every kind (default: per dtype)."),
        click.option("--rel-l2", "rel_l2", type=float,
                     help="Bound of the norm rule ||cand-ref|| <= REL_L2 (||ref|| + atol sqrt(n)) for every kind "
                          "(default: per dtype, see docs/DIFF.md; inf: elementwise rule only)."),
        click.option("--tol", "tol", multiple=True, metavar="KIND=RTOL,ATOL[,REL_L2]", help="Tolerance for one kind; repeatable."),
        click.option("--config", type=click.Path(), help="TOML file of tolerances (see docs/DIFF.md)."),
        click.option("--exact", is_flag=True, help="Require equal values (rtol = atol = 0)."),
        click.option("--equal-nan", is_flag=True, default=None, help="Count NaNs on both sides as equal."),
        click.option("--kinds", callback=_kind_list,
                     help="Comma-separated kinds to compare (default: every recorded kind)."),
        click.option("--allow-missing", is_flag=True, help="Compare the common part when the stores differ in structure."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def check_writable(dest: str, option: str) -> None:
    """UsageError now when the output file `dest` cannot be written, before any work is done for it."""
    if dest == "-":
        return
    folder = os.path.dirname(os.path.abspath(dest))
    if os.path.isdir(dest):
        raise UsageError(f"{option} {dest}: is a directory")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {dest}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(dest) and not os.access(dest, os.W_OK)):
        raise UsageError(f"{option} {dest}: not writable")


def write_text(dest: str, text: str, option: str) -> None:
    """Write text to a file path (tracekit/output_file.py: an earlier file survives a failed write), or
    to stdout for '-'; an unwritable path is one UsageError line."""
    if dest == "-":
        click.echo(text, nl=False)
        return
    from tracekit.output_file import write_output  # here: every command imports this module

    try:
        write_output(dest, text.encode("utf-8"))  # whole or not at all; a pipe or link is written into
    except OSError as e:
        raise UsageError(f"{option} {dest}: cannot write it ({e.strerror or e})") from None


def emit_json(obj, dest: str, option: str = "--json") -> None:
    """Write obj as JSON to a file path, or to stdout for '-'."""
    write_text(dest, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", option)


def emit_json_line(obj) -> None:
    """obj as one line of JSON on stdout: for `tracekit record`, whose recorded job streams its own
    stdout first, so that the result is the last line (`tail -n 1` reads it)."""
    click.echo(json.dumps(obj, default=str))


def verdict_error(report) -> str:
    """Why a comparison that ended in status 'error' is unusable (diff's and report's `Error:` line)."""
    if report.nothing_compared:
        return f"nothing was compared: {report.nothing_compared_reason}"
    return "the stores differ in structure; pass --allow-missing to compare the common part"
