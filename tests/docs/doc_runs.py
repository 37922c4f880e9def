"""Running a group's blocks (see doc_blocks.py) once per test run, in a folder of its own.

The folder holds links to the checkout's top-level files (so `samples/plain/train.py` resolves as in
a checkout) and whatever the commands write: a doc's commands write only under `runs/`, and
anything else they leave there is reported. A `tracekit record` of a reference workload on the CPU
(`doc_blocks.as_sample`) is the tests' shared `recorded_sample` recording of the same command,
linked at the path the doc writes (the same store other tests read, recorded once); every other
command runs literally with bash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from tests.conftest import TORCHRUN_TIMEOUT

from tests.docs.doc_blocks import DOCS, REPO, as_sample, assignment, blocks, chain, commands, expand

# the checkout's entries a group folder does not link: what a newcomer's commands would create
_NOT_LINKED = {".git", ".venv", "runs"}
PYTHON_BLOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_block.py")


def group_blocks(group: str) -> list:
    return [b for doc in DOCS for b in blocks(doc) if b.group == group]


def all_groups() -> list[str]:
    return sorted({b.group for doc in DOCS for b in blocks(doc) if b.kind in ("run", "python")})


def _env() -> dict:
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def _bash(command: str, folder: str) -> dict:
    try:
        r = subprocess.run(["bash", "-c", command], cwd=folder, env=_env(), capture_output=True, text=True,
                           timeout=TORCHRUN_TIMEOUT)
        return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
    except subprocess.TimeoutExpired as e:
        return {"rc": -1, "stdout": str(e.stdout or ""), "stderr": f"timed out after {TORCHRUN_TIMEOUT} s"}


def _run_part(part: str, folder: str, recorded_sample, seen: dict) -> dict:
    sample = as_sample(part)
    if sample:
        target = os.path.join(folder, sample.pop("out"))
        if os.path.lexists(target) and "--force" not in part.split(" -- ")[0]:
            return _bash(part, folder)  # the refusal to overwrite, as it happens
        key = json.dumps(sample, sort_keys=True)
        n = seen[key] = seen.get(key, 0) + 1  # the same command twice: two launches, as written
        store, result = recorded_sample(**sample, tag="" if n == 1 else f"doc-again-{n}")
        if os.path.islink(target) or os.path.isfile(target):
            os.remove(target)
        elif os.path.exists(target):
            shutil.rmtree(target)  # --force: the doc's command would replace it too
        os.makedirs(os.path.dirname(target) or folder, exist_ok=True)
        os.symlink(store, target)
        return {"rc": result.returncode, "stdout": result.stdout, "stderr": result.stderr, "shared": store}
    return _bash(part, folder)


def _run_command(command: str, folder: str, recorded_sample, seen: dict) -> dict:
    out = {"cmd": command, "rc": 0, "stdout": "", "stderr": ""}
    for part in chain(command):
        r = _run_part(part, folder, recorded_sample, seen)
        out.update(rc=r["rc"], stdout=out["stdout"] + r["stdout"], stderr=out["stderr"] + r["stderr"])
        if r["rc"] != 0:
            break
    return out


def _make(group: str, recorded_sample):
    def make(folder) -> dict:
        folder = str(folder)
        for entry in os.listdir(REPO):
            if entry not in _NOT_LINKED:
                os.symlink(os.path.join(REPO, entry), os.path.join(folder, entry))
        variables, seen, ran = {}, {}, []
        for b in group_blocks(group):
            if b.kind == "run":
                done = []
                for command in commands(b):
                    if assignment(command):
                        variables.update([assignment(command)])
                        continue
                    done.append(_run_command(expand(command, variables), folder, recorded_sample, seen))
                ran.append({"where": b.where, "commands": done})
            elif b.kind == "python":
                with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                    f.write(b.text)
                r = _bash(f"{sys.executable} {PYTHON_BLOCK} {f.name}", folder)
                os.unlink(f.name)
                ran.append({"where": b.where, "commands": [{"cmd": f"python block {b.where}", **r}]})
        strays = sorted(e for e in os.listdir(folder) if e != "runs" and not os.path.islink(os.path.join(folder, e)))
        return {"ran": ran, "strays": strays}

    return make


def run_group(group: str, recorded_sample, shared_once) -> tuple[str, dict]:
    """(the group's folder, {"ran": [{"where", "commands": [{cmd, rc, stdout, stderr}]}], "strays"})."""
    folder, result = shared_once(f"doc-{group}", _make(group, recorded_sample))
    return str(folder), result
