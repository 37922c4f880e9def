"""What every command shares: one-line errors with exit codes, and JSON output."""

from __future__ import annotations

import functools
import json
import sys

import click

from tracekit.errors import TracekitError

# Exit codes shared by all commands: 0 success, 1 a verdict of failure (diff violations), 2 unusable input.
EXIT_FAIL = 1
EXIT_USAGE = 2


def one_line_errors(fn):
    """Turn tracekit's own errors into `Error: ...` on stderr and exit 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TracekitError as e:
            click.echo(f"Error: {e}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


def emit_json(obj, dest: str) -> None:
    """Write obj as JSON to a file path, or to stdout for '-'."""
    text = json.dumps(obj, indent=2, sort_keys=False, default=str)
    if dest == "-":
        click.echo(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")
