"""The `tracekit` command: one click group; each command lives in its own module."""

import click

from tracekit import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tracekit")
def main():
    """Record, diff, inspect and replay distributed PyTorch training runs.

    \b
    Typical bring-up:
      tracekit record -o runs/ref  -- torchrun --standalone --nproc-per-node=4 train.py --device cpu
      tracekit record -o runs/cand -- torchrun --standalone --nproc-per-node=4 train.py --device cuda
      tracekit diff runs/ref runs/cand
    """


# Each command module registers itself here, one line each.
from tracekit.cli.record import record  # noqa: E402
from tracekit.cli.show import show  # noqa: E402
from tracekit.cli.loss import loss  # noqa: E402
from tracekit.cli.report import report  # noqa: E402
from tracekit.cli.export import export  # noqa: E402
from tracekit.cli.import_ import import_  # noqa: E402
from tracekit.cli.diff import diff  # noqa: E402
from tracekit.cli.verify import verify  # noqa: E402

main.add_command(record)
main.add_command(show)
main.add_command(loss)
main.add_command(report)
main.add_command(export)
main.add_command(import_)
main.add_command(diff)
main.add_command(verify)


if __name__ == "__main__":
    main()
