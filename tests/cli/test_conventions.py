"""What every command shares (cli/common.py): every command has `--json`, a flag, never an option taking a value
(`tracekit verify --json runs/ref` once read runs/ref as the JSON file), and every command that
reads or writes a store takes `--storage-option` for stores at a URL."""

import click
import pytest
from click.testing import CliRunner

from tracekit.cli.main import COMMANDS, main


def command(name):
    return main.get_command(click.Context(main), name)


def options(name) -> dict:
    return {opt: p for p in command(name).params for opt in getattr(p, "opts", [])}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_json_is_a_flag_of_every_command(name):
    p = options(name).get("--json")
    assert p is not None, f"tracekit {name} has no --json"
    assert p.is_flag, f"tracekit {name} --json takes a value"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_takes_storage_options(name):
    assert "--storage-option" in options(name), f"tracekit {name} has no --storage-option"


def test_verify_json_before_the_store(tmp_path):
    """The README's convention, `tracekit verify --json STORE`: the store is the argument, not a file
    name for --json."""
    result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "Missing argument" not in result.output, result.output
    assert "nothing" in result.output
