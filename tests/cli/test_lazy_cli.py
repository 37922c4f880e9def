"""Commands that don't train never import torch; the group loads a command's module only when it is used."""

import subprocess
import sys

import pytest

# Runs the tracekit command given as arguments, then reports on stderr which heavy modules it imported.
PROBE = """
import atexit, sys
atexit.register(lambda: print("IMPORTED:" + ",".join(m for m in ("torch", "tracekit.compare.engine", "xarray", "zarr")
                                                    if m in sys.modules), file=sys.stderr))
from tracekit.cli.main import main
sys.argv = ["tracekit", *sys.argv[1:]]
main()
"""


def probe(*args, cwd=None):
    out = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=300,
                         cwd=cwd)
    imported = [line for line in out.stderr.splitlines() if line.startswith("IMPORTED:")]
    assert imported, out.stderr[-3000:]
    return out, set(filter(None, imported[-1][len("IMPORTED:"):].split(",")))


@pytest.mark.parametrize("args", [
    ["diff", "{ref}", "{cand}"],
    ["diff", "--json", "{ref}", "{cand}"],
    ["show", "{ref}"],
    ["show", "--json", "{ref}"],
    ["loss", "{ref}", "{cand}"],
    ["report", "{ref}", "{cand}", "-o", "{tmp}/r.html"],
    ["export", "{ref}", "--rank", "2", "--step", "3", "-o", "{tmp}/r2s3.safetensors"],
    ["export", "{cand}", "-o", "{tmp}/tree"],
    ["import", "{tmp}/tree", "-o", "{tmp}/imported"],
    ["record", "--help"],
    ["verify", "{ref}"],
], ids=lambda a: " ".join(a[:2]))
def test_commands_that_do_not_train_never_import_torch(divergence_runs, tmp_path, args):
    ref, cand = divergence_runs
    if args[0] == "import":  # something to import: an export of the candidate, made without torch too
        assert probe("export", cand, "-o", tmp_path / "tree")[0].returncode == 0
    out, imported = probe(*(a.format(ref=ref, cand=cand, tmp=tmp_path) for a in args), cwd=str(tmp_path))
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 1: the planted fault's FAIL verdict
    assert "torch" not in imported


def test_help_loads_no_engine():
    out, imported = probe("diff", "--help")
    assert out.returncode == 0 and "Compare a candidate run CAND" in out.stdout
    assert imported == set()  # neither torch, nor the diff engine, nor xarray


def test_group_help_lists_every_command_and_imports_none():
    out, imported = probe("--help")
    listed = {line.split()[0] for line in out.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"diff", "export", "import", "loss", "record", "report", "show", "verify"}
    assert imported == set()  # no command module, so neither zarr nor torch


def test_group_help_says_what_each_command_says_of_itself():
    """`tracekit --help` lists main.SHORT_HELP without loading the commands: each entry must be the
    first line of that command's own help."""
    from tracekit.cli.main import COMMANDS, SHORT_HELP, main

    assert set(SHORT_HELP) == set(COMMANDS)
    import click

    ctx = click.Context(main)
    for name in COMMANDS:
        assert SHORT_HELP[name] == main.get_command(ctx, name).get_short_help_str(limit=1000), name
