"""show and diff name the versions and numeric env vars that differ over ranks and between runs."""

import json

import numpy as np
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.store import RankWriter, TensorData, create_store, finalize_store


def write(path, per_rank, root=None, finalize=True, close=None):
    """A 1-step store; per_rank: [(versions, env)] per rank; close: ranks that close (default all)."""
    create_store(path, root if root is not None else {"launcher": "tracekit record", "versions": {"torch": "0"}, "env": {}})
    for r, (versions, env) in enumerate(per_rank):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": len(per_rank)}, "versions": versions, "env": env})
        w.write(1, "loss", [TensorData("loss", "float32", (), np.array(1.0, np.float32))])
        w.complete_step(1)
        if close is None or r in close:
            w.close()
    if finalize:
        finalize_store(path, 0)
    return str(path)


BASE = ({"python": "3.11.7", "torch": "2.13.0"}, {"OMP_NUM_THREADS": "1"})


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_show_flags_the_rank_whose_torch_and_env_differ(tmp_path):
    odd = ({"python": "3.11.7", "torch": "2.14.1", "torch-neuronx": "2.1"}, {"OMP_NUM_THREADS": "4"})
    store = write(tmp_path / "s", [BASE, BASE, odd])
    text = invoke("show", store).output
    assert "same on every rank: python=3.11.7" in text
    section = text[text.index("DIFFERS over ranks"):text.index("ranks (3")]
    assert section.splitlines()[0] == "DIFFERS over ranks (torch, torch-neuronx, OMP_NUM_THREADS); flagged: rank(s) 2"
    rows = [line.split() for line in section.splitlines()[2:] if line.strip()]
    assert rows == [["0", "2.13.0", "-", "1"], ["1", "2.13.0", "-", "1"], ["2", "!", "2.14.1", "2.1", "4"]]
    doc = json.loads(invoke("show", "--json", store).output)
    assert [d["fact"] for d in doc["environment"]["differs"]] == ["torch", "torch-neuronx", "OMP_NUM_THREADS"]
    assert doc["ranks"][2]["env"] == {"OMP_NUM_THREADS": "4"} and doc["ranks"][0]["versions"]["torch"] == "2.13.0"


def test_show_with_equal_ranks_flags_nothing(tmp_path):
    text = invoke("show", write(tmp_path / "s", [BASE, BASE])).output
    assert "same on every rank: python=3.11.7, torch=2.13.0, OMP_NUM_THREADS=1" in text
    assert "DIFFERS" not in text


def test_launcherless_store_is_not_called_running_when_every_rank_closed(tmp_path):
    root = {"launcher": None}  # recorded through TRACEKIT_STORE: rank 0 made the store, nobody finalizes it
    done = invoke("show", write(tmp_path / "done", [BASE, BASE], root=root, finalize=False)).output
    assert "finished: every rank closed (no launcher, so no exit status)" in done
    half = invoke("show", write(tmp_path / "half", [BASE, BASE], root=root, finalize=False, close={0})).output
    assert "finished: no: rank(s) 1 still running, or died without closing (no launcher)" in half
    # a store that names a launcher which no longer holds it (the store's job lock says so)
    launched = invoke("show", write(tmp_path / "l", [BASE, BASE], finalize=False, close={1})).output
    assert "finished: no: launcher died" in launched
    assert "finished: yes (exit status 0)" in invoke("show", write(tmp_path / "f", [BASE])).output


def test_diff_prints_environment_differences_before_the_verdict(tmp_path):
    ref = write(tmp_path / "ref", [BASE, BASE])
    cand = write(tmp_path / "cand", [({"python": "3.11.7", "torch": "2.14.1"}, {}), ({"python": "3.11.7", "torch": "2.14.1"}, {})])
    out = invoke("diff", ref, cand)
    lines = out.output.rstrip("\n").splitlines()
    assert out.exit_code == 0 and lines[-1] == "PASS comparison ranks=2 steps=1"
    assert lines[-4:-1] == ["Environment differs between REF and CAND (versions and numeric env vars; may explain differences):",
                            "  torch: REF 2.13.0, CAND 2.14.1", "  OMP_NUM_THREADS: REF 1, CAND (unset)"]
    same = invoke("diff", ref, write(tmp_path / "same", [BASE, BASE]))
    assert "Environment differs" not in same.output
    assert "Environment differs" not in invoke("diff", "-q", ref, cand).output
