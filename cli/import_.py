"""`tracekit import`: build a store from dumps (safetensors, or weights-only torch.save files)."""

import click

from tracekit.cli.common import emit_json, json_option, one_line_errors, storage_options
from tracekit.interchange import import_dumps


@click.command("import")
@click.argument("src", type=click.Path())
@click.option("-o", "--output", "out", required=True, type=click.Path(), help="Store to create (a directory).")
@click.option("--force", is_flag=True, help="Overwrite an existing tracekit store at OUTPUT.")
@click.option("--kind", "default_kind", default="parameters", show_default=True, metavar="KIND",
              help="Kind of files whose path and metadata name none.")
@click.option("--step-offset", default=0, show_default=True, type=int,
              help="Add this to every step (e.g. 1 for dumps that count steps from 0).")
@click.option("--keep-names", is_flag=True,
              help="Keep tensor names as dumped; by default wrapper parts (module., _orig_mod., ...) are "
                   "dropped, as the recorder does, so names match recorded stores.")
@json_option("what was imported", "Skipped entries are still named on stderr. Schema: schemas/import-result.schema.json.")
@one_line_errors
@storage_options
def import_(src, out, force, default_kind, step_offset, keep_names, as_json):
    """Build the store OUTPUT from the tensor files under SRC, so existing dumps can be diffed.

    \b
    SRC is a folder (or one file) of *.safetensors, *.pt, *.pth or *.bin files, e.g.
      SRC/rank_0/step_1/gradients.safetensors   SRC/rank0/step3.pt   SRC/step_2/rank_1/params.pt
    Each file's rank, step and kind come from its tracekit metadata (files from `tracekit export`),
    else from its path: rank<N> (none: rank 0), step<N> or iter<N> (required), and a kind name
    (parameters, gradients, outputs, loss, deltas, ...; none: --kind). torch.save files are read
    with torch.load(weights_only=True) only: one that holds other objects is refused.
    See docs/INTERCHANGE.md.
    """
    from tracekit.recorders.names import canonical_name  # no torch: .pt files alone need it

    done = import_dumps(src, out, force=force, default_kind=default_kind, step_offset=step_offset,
                        rename=None if keep_names else canonical_name)
    steps = done["steps"]
    if as_json:
        emit_json({"source": src, "destination": out, "files": done["files"], "ranks": done["ranks"], "steps": steps,
                   "kinds": done["kinds"], "skipped": done["skipped"]}, "-")
    else:
        click.echo(f"imported {done['files']} files into {out}: ranks {done['ranks']}, steps {steps[0]}-{steps[-1]}, "
                   f"kinds {', '.join(done['kinds'])}")
    if done["skipped"]:
        shown = ", ".join(done["skipped"][:5]) + (" ..." if len(done["skipped"]) > 5 else "")
        click.echo(f"skipped {len(done['skipped'])} non-tensor entries: {shown}", err=True)
