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
    "verify": "tracekit.cli.verify.verify",
}

# What `tracekit --help` lists for each: the first line of the command's docstring (checked equal by
# tests/cli/test_conventions.py), so that listing them imports none of them.
SHORT_HELP = {
    "record": "Run COMMAND (usually torchrun ...) and record what every rank computes into STORE.",
    "show": "Summarize STORE: run metadata, ranks and their coordinates, steps, tensors, bytes on disk.",
    "loss": "The loss per step of each STORE side by side, with |difference| and relative difference to the first.",
    "report": "Compare CAND with REF (as `tracekit diff` does) and write the result as one HTML file.",
    "export": "Write tensors of STORE as safetensors, under their recorded names.",
    "import": "Build the store OUTPUT from the tensor files under SRC, so existing dumps can be diffed.",
    "diff": "Compare a candidate run CAND with a reference run REF, rank by rank and step by step.",
    "verify": "Check STORE: every recorded tensor's bytes against its hash, every index entry against its data.",
}


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS, lazy_help=SHORT_HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
