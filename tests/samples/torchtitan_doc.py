"""docs/TORCHTITAN.md's command blocks, parsed and run as written (bash, a fresh folder whose
`samples` is the repository's). Shared by the TorchTitan tests; not a test module itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.launching import TORCHRUN_TIMEOUT
from tests.paths import REPO

DOC = os.path.join(REPO, "docs", "TORCHTITAN.md")


def block(name: str) -> list[str]:
    """The lines of the doc's `<!-- torchtitan:NAME -->` bash block, comments and blanks dropped
    (a `<!-- doc-test: ... -->` marker may stand between the name and the fence)."""
    text = open(DOC).read()
    body = re.search(rf"<!-- torchtitan:{name} -->\n(?:<!-- doc-test:[^\n]*-->\n)?```bash\n(.*?)\n```",
                     text, re.S).group(1)
    return [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def is_assignment(line: str) -> bool:
    return re.match(r"^[A-Za-z_]\w*=", line) is not None


def run_block(folder: Path, name: str, reuse: dict[str, Path] | None = None) -> list[dict]:
    """Run the setup block, then block NAME, in folder; for each command of NAME (assignments
    excepted) its text, exit status, stdout and stderr, in order. `reuse` links paths an earlier
    block wrote (relative path in folder -> where it is) instead of recording them again."""
    os.symlink(os.path.join(REPO, "samples"), folder / "samples")
    for relative, target in (reuse or {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, folder / relative)
    logs = folder / "logs"
    logs.mkdir()
    commands = [line for line in block(name) if not is_assignment(line)]
    script = ["set -u", *block("setup")]
    i = 0
    for line in block(name):
        if is_assignment(line):
            script.append(line)
        else:
            script.append(f"{{ {line} ; }} >logs/{i}.out 2>logs/{i}.err; echo $? >logs/{i}.rc")
            i += 1
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=folder, env=env, check=True,
                   timeout=len(commands) * TORCHRUN_TIMEOUT)
    return [{"command": c, "rc": int((logs / f"{j}.rc").read_text()), "out": (logs / f"{j}.out").read_text(),
             "err": (logs / f"{j}.err").read_text()} for j, c in enumerate(commands)]


def ran(results: list[dict], prefix: str) -> dict:
    """The one result whose command starts with prefix."""
    found = [r for r in results if r["command"].startswith(prefix)]
    assert len(found) == 1, (prefix, [r["command"] for r in results])
    return found[0]


def logged_losses(text: str) -> dict[int, float]:
    """TorchTitan's `step: N  loss: X` lines (every rank logs the same global loss) -> {N: X}."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    losses: dict[int, set[float]] = {}
    for step, loss in re.findall(r"step:\s+(\d+)\s+loss:\s+([-\d.eE+]+)", plain):
        losses.setdefault(int(step), set()).add(float(loss))
    assert all(len(v) == 1 for v in losses.values()), losses  # one global loss per step
    return {step: v.pop() for step, v in sorted(losses.items())}


def cli(*args: str) -> str:
    """`tracekit ARGS`'s stdout, run in this process (the click command itself, no interpreter of its
    own: a `tracekit` subprocess costs ~0.6 CPU-s of start-up); a non-zero exit fails the test."""
    from click.testing import CliRunner

    from tracekit.cli.main import main as tracekit_main

    result = CliRunner().invoke(tracekit_main, [str(a) for a in args])
    assert result.exit_code == 0, (args, result.output[-3000:], result.exception)
    return result.stdout


def recorded_losses(store: str) -> dict[int, float]:
    """tracekit loss --json STORE -> {step: recorded global loss}."""
    out = cli("loss", "--json", store)
    name = json.loads(out)["columns"][1]
    return {row["step"]: row[name] for row in json.loads(out)["rows"]}


def doc_block(shared_once, name: str):
    """(folder, results) of the doc's block NAME, run once per test run; its launches succeeded."""
    folder, results = shared_once(f"torchtitan-{name}", lambda f: run_block(f, name))
    for r in results:
        if r["command"].startswith(("tracekit record", "torchrun")):
            assert r["rc"] == 0, (r["command"], r["err"][-3000:])
    return folder, results


def cells_block(shared_once):
    """(folder, results) of the doc's `cells` block: one traced replay of the `same` block's
    `runs/tt-ref` with four planted faults and a 1% higher learning rate, linked to that block's
    stores (recorded once per test run, not again)."""
    same, _ = doc_block(shared_once, "same")
    folder, results = shared_once("torchtitan-cells", lambda f: run_block(
        f, "cells", reuse={"runs/tt-ref": same / "runs" / "tt-ref", "runs/tt-trace": same / "runs" / "tt-trace"}))
    record = ran(results, "tracekit record")
    assert record["rc"] == 0, record["err"][-3000:]
    return folder, results


def verdict(result: dict) -> str:
    lines = [line for line in (result["out"] + result["err"]).splitlines() if re.match(r"(PASS|FAIL) ", line)]
    assert lines, result["err"][-2000:]
    return lines[-1]
