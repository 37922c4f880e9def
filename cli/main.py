"""The `tracekit` command: one click group; each command lives in its own module."""

import click

from tracekit import __version__
from tracekit.cli.lazy import LazyGroup

# Each command lives in its own module, imported only when that command runs (or --help lists it):
# commands that don't train never import torch, and `tracekit diff --help` imports no engine at all.
COMMANDS = {
    "record": "tracekit.cli.record.record",
    "show": "tracekit.cli.show.show",
    "loss": "tracekit.cli.loss.loss",
    "report": "tracekit.cli.report.report",
    "export": "tracekit.cli.export.export",
    "import": "tracekit.cli.import_.import_",
    "diff": "tracekit.cli.diff.diff",
}


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tracekit")
def main():
    """Record, diff, inspect and replay distributed PyTorch training runs.

    \b
    Typical bring-up:
      tracekit record -o runs/ref  -- torchrun --standalone --nproc-per-node=4 train.py --device cpu
      tracekit record -o runs/cand -- torchrun --standalone --nproc-per-node=4 train.py --device cuda
      tracekit diff runs/ref runs/cand
    """


if __name__ == "__main__":
    main()
