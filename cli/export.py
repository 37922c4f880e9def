"""`tracekit export`: a store's tensors as safetensors files."""

import click

from tracekit.cli.common import emit_json, json_option, one_line_errors, storage_options
from tracekit.errors import UsageError
from tracekit.interchange import export_file, export_tree


@click.command("export")
@click.argument("store", type=click.Path())
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Rank to export (needed when STORE has several).")
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="Step to export into one file (0: initial parameters). Without it, every step into a folder.")
@click.option("--kind", default=None, metavar="KIND",
              help="Kind to export: parameters (the default for one file), gradients, outputs, ...; a folder export takes all.")
@click.option("-o", "--output", "out", required=True, type=click.Path(),
              help="FILE.safetensors with --step; otherwise a folder laid out as rank_R/step_S/KIND.safetensors.")
@json_option("what was written", "Schema: schemas/export-result.schema.json.")
@one_line_errors
@storage_options
def export(store, rank, step, kind, out, as_json):
    """Write tensors of STORE as safetensors, under their recorded names.

    \b
    One file: tracekit export runs/ref --rank 0 --step 3 -o ref-r0-s3.safetensors
    Everything: tracekit export runs/ref -o ref-tensors/
    The metadata of each file holds format, run, coords, rank, step, kind and store; `tracekit import`
    reads it back, so an exported folder imports bit for bit (docs/INTERCHANGE.md).
    """
    if step is not None:
        if not out.endswith(".safetensors"):
            raise UsageError(f"with --step, -o names one file ending in .safetensors, not {out!r}")
        done = export_file(store, out, step=step, rank=rank, kind=kind or "parameters")
        text = f"wrote {done['tensors']} {done['kind']} tensors of rank {done['rank']} step {done['step']} to {out}"
        result = {"source": store, "destination": out, "layout": "file", "files": 1, "ranks": [done["rank"]],
                  "steps": [done["step"]], "kinds": [done["kind"]], "tensors": done["tensors"]}
    else:
        done = export_tree(store, out, ranks=None if rank is None else [rank], kinds=None if kind is None else [kind])
        text = f"wrote {done['files']} safetensors files to {out}"
        result = {"source": store, "destination": out, "layout": "folder", "files": done["files"], "ranks": done["ranks"],
                  "steps": done["steps"], "kinds": done["kinds"], "tensors": None}
    if as_json:
        emit_json(result, "-")
    else:
        click.echo(text)
