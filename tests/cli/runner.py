"""`tracekit ...` in the tests' own process (click's CliRunner), for tests in several folders."""

from click.testing import CliRunner

from tracekit.cli.main import main


def cli(*args):
    """(exit code, output) of `tracekit ARGS`; paths and numbers may be passed as they are."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output
