"""docs/LOCATE.md's four commands from a FAIL to its op, run as the doc writes them, and the
outputs it shows; then a clean replay of the traced step (`record --replay-from --trace`), which
names no root cause.

The two recordings the doc's block takes as given (runs/ref, runs/cand) come from the shared
`recorded_sample` fixture, whose command is the doc's `$T` plus the sample's default
`--device cpu --backend gloo`; commands 1-4 run literally (bash, the repository as the working
folder, `runs/` in a temporary folder).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import tracekit

from conftest import REPO, TORCHRUN_TIMEOUT
from tracekit.store import open_store
from tracekit.store.traces import read_events, trace_steps

DOC = os.path.join(REPO, "docs", "LOCATE.md")
# a candidate whose rank 1 differs from step 1 on (gradients scaled in step 1 only) and whose
# model is clean: replayed from the reference at step 2, its traced step 2 is the reference's
CLEAN_REPLAY = ("tracekit record -o runs/clean-replay --replay-from runs/ref --replay-steps 2:2 --trace ops "
                "--trace-steps 2 -- $T --fault grad_scale=1:1:1.01")


def doc_commands(text: str) -> tuple[str, dict[str, list[str]], list[tuple[int, str]]]:
    """(T, {store: extra sample args} of the recordings taken as given, [(number, command)])."""
    block = re.search(r"<!-- locate:commands -->\n```bash\n(.*?)\n```", text, re.S).group(1)
    block = re.sub(r"\\\n\s*", "", block)  # continuation lines
    t = re.search(r'^T="([^"]+)"$', block, re.M).group(1)
    given = {store: shlex.split(extra) for store, extra in
             re.findall(r"`tracekit record -o (runs/[\w-]+) -- \$T((?: [^`]+)?)`", block)}
    numbered = [(int(n), cmd.strip()) for n, cmd in re.findall(r"^# (\d)\. .*\n(.+)$", block, re.M)]
    return t, given, numbered


def doc_outputs(text: str) -> dict[int, list[str]]:
    return {int(n): body.splitlines() for n, body in
            re.findall(r"<!-- locate:output (\d) -->\n```\n(.*?)\n```", text, re.S)}


def sample_of(t: str) -> dict:
    """recorded_sample's arguments for the doc's `$T` (the only flags it may carry)."""
    words = shlex.split(t)
    assert words[:2] == ["torchrun", "--standalone"] and words[2].startswith("--nproc-per-node="), t
    script = re.fullmatch(r"samples/(\w+)/train\.py", words[3]).group(1)
    flags = dict(zip(words[4::2], words[5::2]))
    assert sorted(flags) == ["--parallelism", "--steps"] and len(words[4:]) == 4, t
    return dict(mode=flags["--parallelism"], script=script, steps=int(flags["--steps"]),
                ranks=int(words[2].split("=", 1)[1]))


def _run(cmd: str, folder, t: str) -> dict:
    cmd = cmd.replace("runs/", f"{folder}/runs/")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "T": t,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    r = subprocess.run(["bash", "-c", f"T=\"$T\"; {cmd}"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=TORCHRUN_TIMEOUT)
    return {"cmd": cmd, "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


@pytest.fixture(scope="module")
def locate(recorded_sample, shared_once):
    text = open(DOC).read()
    t, given, numbered = doc_commands(text)
    sample = sample_of(t)
    stores = {name: recorded_sample(**sample, extra=extra)[0] for name, extra in given.items()}

    def make(folder):
        os.mkdir(folder / "runs")
        for name, store in stores.items():
            os.symlink(store, folder / name)
        out = {str(n): _run(cmd, folder, t) for n, cmd in numbered}
        out["clean"] = _run(CLEAN_REPLAY + " && tracekit diff runs/ref-trace runs/clean-replay --json-file "
                            "runs/clean.json", folder, t)
        return out

    folder, out = shared_once("locate-doc", make)
    return folder / "runs", out, doc_outputs(text), [n for n, _ in numbered]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
# lines whose numbers are the model's structure (step, rank, module, call, shapes, our own source
# line), not float digits or op counts of this torch version: they must match exactly
_EXACT = ("Root cause:", "First divergence:", "inputs:", "outputs:", "source:")


def _shape(line: str) -> str:
    return _NUMBER.sub("N", line.strip())


def _assert_shown(shown: list[str], actual: str) -> None:
    """Each shown line appears in the actual output, in order: exactly for _EXACT lines and the
    verdict's ranks, steps and first step; with any number for the rest."""
    lines = [x.strip() for x in actual.splitlines()]
    at = 0
    for want in (w.strip() for w in shown):
        exact = want.startswith(_EXACT)
        match = (lambda got: got == want) if exact else (lambda got: _shape(got) == _shape(want))
        hit = next((i for i in range(at, len(lines)) if match(lines[i])), None)
        assert hit is not None, f"the doc shows {want!r}; not in the output (from line {at}):\n" + "\n".join(lines[at:])
        if want.startswith(("FAIL comparison", "PASS comparison")):
            keep = re.compile(r"(?:ranks|steps|first_step)=\d+")
            assert keep.findall(lines[hit]) == keep.findall(want), (want, lines[hit])
        at = hit + 1


@pytest.mark.torchrun
def test_locate_doc_commands_show_what_the_doc_shows(locate):
    runs, out, shown, numbers = locate
    assert numbers == [1, 2, 3, 4], "the doc promises four commands"
    assert [out[str(n)]["rc"] for n in numbers] == [1, 0, 0, 1], {n: out[str(n)]["stderr"][-2000:] for n in map(str, numbers)}
    assert sorted(shown) == [1, 4]
    for n, lines in shown.items():
        _assert_shown(lines, out[str(n)]["stdout"])
    # the planted op, its module and rank, as the doc says
    assert "Root cause: step 2, rank 1, module 0, aten._to_copy.default [fwd, call 0] (extra op)" in out["4"]["stdout"]
    # our own source line: where samples/common/op_faults.py casts to bfloat16
    src = open(os.path.join(REPO, "samples", "common", "op_faults.py")).read().splitlines()
    cast = next(i for i, line in enumerate(src, 1) if "self.bias.to(torch.bfloat16)" in line)
    assert f"source: samples/common/op_faults.py:{cast}" in out["4"]["stdout"]


@pytest.mark.torchrun
def test_replayed_traced_step_is_recorded_from_the_reference_state(locate):
    """Command 3 (--replay-from REF --replay-steps 2:2 --trace ops): each rank's store holds the
    trace of step 2, and says step 2 started from REF's state."""
    runs, out, _, _ = locate
    store = open_store(str(runs / "cand-trace"))
    for r in (0, 1):
        rank = store.rank(r).group
        assert trace_steps(rank, "ops") == [2]
        assert rank.attrs["replay"]["replayed_steps"] == [2]
        assert {e["phase"] for e in read_events(rank, "ops", 2)} == {"fwd", "bwd", "opt"}


@pytest.mark.torchrun
def test_clean_replay_names_no_root_cause(locate):
    """A candidate whose rank 1 left the reference in step 1 (its gradients scaled), replayed at
    step 2 from the reference: the step-level diff fails at step 1 only, and the traced step 2 is
    the reference's, bit for bit on every rank, so no op is named."""
    runs, out, _, _ = locate
    assert out["clean"]["rc"] == 1, out["clean"]["stderr"][-3000:]
    report = json.loads((runs / "clean.json").read_text())
    assert report["first_divergence"]["step"] == 1 and report["summary_line"].endswith("first_step=1")
    assert "Root cause:" not in out["clean"]["stdout"] and "no root cause" in out["clean"]["stdout"]
    assert report["root_cause"] is None
    assert sorted((t["step"], t["rank"]) for t in report["traces"]) == [(2, 0), (2, 1)]
    assert all(t["matched"] > 0 and not t["extra"] and not t["missing"] for t in report["traces"])
    ref, cand = str(runs / "ref-trace"), str(runs / "clean-replay")
    ds = tracekit.open_diff(ref, cand)
    for r in (0, 1):
        ev = ds.tracekit.events(rank=r, step=2)
        # suspect: a collective whose inputs match and whose output no reader saw land (read in flight)
        assert set(ev.status.values) <= {"ok", "unknown", "suspect"} and (ev.status == "ok").sum() > 0
        # what the diff vouches for matches exactly (unknown: memory the trace cannot vouch for,
        # e.g. `empty` buffers, read before they are written)
        assert float(ev.max_stat_abs_err.where(ev.status == "ok").max()) == 0.0
        # the step-level tensors the chain ends at (the update's parameters, the gradients) are
        # bitwise the reference's
        named = [{(t["name"], t["hash"]) for e in read_events(open_store(s).rank(r).group, "ops", 2)
                  for t in e["outputs"] if t.get("name")} for s in (ref, cand)]
        assert len(named[0]) >= 4 and named[0] == named[1]
