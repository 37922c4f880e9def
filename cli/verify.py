"""`tracekit verify`: check every hash and index entry of a store; one line per problem."""

from __future__ import annotations

import sys

import click

from tracekit.cli.common import EXIT_USAGE, emit_json, json_option, one_line_errors, storage_options


@click.command()
@click.argument("store", type=click.Path())
@json_option("the result")
@storage_options
@one_line_errors
def verify(store, as_json):
    """Check STORE: every recorded tensor's bytes against its hash, every index entry against its data.

    Prints one line per problem and a summary; exits 0 when the store is sound, 2 when it is damaged.

    \b
    Example:
      tracekit verify runs/ref
    """
    from tracekit.store.verify import verify_store

    result = verify_store(store, on_problem=None if as_json else lambda p: click.echo(p.line()))
    if as_json:
        emit_json({"path": result.path, "format_version": result.format_version, "ok": result.ok,
                   "entries": result.entries, "objects": result.objects, "bytes_read": result.bytes_read,
                   "problems": [{"rank": p.rank, "kind": p.kind, "step": p.step, "tensor": p.tensor, "what": p.what}
                                for p in result.problems]}, "-")
    else:
        click.echo(result.summary())
    if not result.ok:
        sys.exit(EXIT_USAGE)
