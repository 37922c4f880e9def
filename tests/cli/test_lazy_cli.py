"""Commands that don't train never import torch; the group loads a command's module only when it is used."""

import json
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


# The commands in the order one process runs them (the import reads the export before it).
COMMANDS = [
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
]

# Runs each command of a JSON list in turn, as `tracekit` would, and writes (exit code, whether torch
# is imported by then) after each one to a JSON file.
PROBE_ALL = """
import json, sys
from tracekit.cli.main import main
results = []
for args in json.loads(sys.argv[2]):
    try:
        main(args, prog_name="tracekit")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    results.append({"args": args, "code": code, "torch": "torch" in sys.modules})
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
"""


@pytest.fixture
def probed_commands(shared_once, request):
    """COMMANDS run one after another in one process (once per test run, whichever xdist worker asks
    first), on the divergence runs: torch absent after the k-th means none of the first k imported it,
    so each command's cell reads its own line (a command that imports torch fails its cell and the
    later ones, the first failing cell naming it)."""
    def make(folder):
        ref, cand = request.getfixturevalue("divergence_runs")
        argv = [[a.format(ref=ref, cand=cand, tmp=folder) for a in args] for args in COMMANDS]
        out = subprocess.run([sys.executable, "-c", PROBE_ALL, str(folder / "results.json"), json.dumps(argv)],
                             capture_output=True, text=True, timeout=600, cwd=str(folder))
        results = json.loads((folder / "results.json").read_text()) if out.returncode == 0 else []
        return {"returncode": out.returncode, "stderr": out.stderr[-3000:], "results": results}

    return shared_once("lazy-cli-commands", make)[1]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_commands_that_do_not_train_never_import_torch(probed_commands, args):
    assert probed_commands["returncode"] == 0, probed_commands["stderr"]
    result = probed_commands["results"][COMMANDS.index(args)]
    assert result["code"] in (0, 1), (result, probed_commands["stderr"])  # 1: the planted fault's FAIL verdict
    assert not result["torch"], f"torch was imported by the time `tracekit {' '.join(args)}` ended"


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
