"""tracekit show, loss and report: in-process through click, on stores written with the writer API."""

import csv
import io
import json
import os

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.schemas import load
from tracekit.store import RankWriter, TensorData, create_store


def write_losses(path, losses, ranks=2, env=None, fallback=None):
    """A store with only losses: {step: value}; rank r > 0 completes only the steps rank 0 does."""
    create_store(path, {"command": ["train.py", "--lr", "0.01"], "versions": {"torch": "2.13.0"},
                        "env": env or {}})
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r,
                                            "tp_degree": 1, "tp_rank": 0},
                                 "run": {"device": "cpu", "backend": "gloo", "mode": "ddp"}})
        for step, value in losses.items():
            w.write(step, "loss", [TensorData("loss", "float32", (), np.array(value, np.float32))])
            w.complete_step(step)
        if fallback is not None:
            w.update_attrs(fallback_ops=fallback)
        w.close()
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# ---- show ---------------------------------------------------------------------------------------

def test_show_text_lists_run_ranks_steps_tensors_and_bytes(divergence_runs):
    ref, _ = divergence_runs
    out = invoke("show", ref)
    assert out.exit_code == 0, out.output
    text = out.output
    assert "command: samples/inspect_divergence.py --device cpu" in text
    assert "device: cpu" in text and "backend: gloo" in text
    assert "ranks (4; world_size=4 dp_degree=2 tp_degree=2):" in text
    # rank 3: dp_rank 1, tp_rank 1, mesh position, finished, steps 1-5
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("3 "))
    assert row[:7] == ["3", "3", "1", "1", "dp=1,tp=1", "finished", "1-5"]
    assert "parameters: 4 tensors, steps 0-5" in text
    assert any(line.split()[:3] == ["0.weight", "float32", "16x8"] for line in text.splitlines())
    assert "size on disk:" in text


def test_show_json_matches_the_disk(divergence_runs):
    ref, _ = divergence_runs
    out = invoke("show", ref, "--json")
    assert out.exit_code == 0
    doc = json.loads(out.output)
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ref) for f in fs)
    assert doc["bytes_on_disk"] == on_disk
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert [r["coords"]["tp_rank"] for r in doc["ranks"]] == [0, 1, 0, 1]
    assert all(r["steps_completed"] == 5 and r["last_step"] == 5 for r in doc["ranks"])
    kinds = {k["kind"]: k for k in doc["kinds"]}
    assert kinds["parameters"]["steps"] == [0, 1, 2, 3, 4, 5]
    grads = {t["name"]: t for t in kinds["gradients"]["tensors"]}
    assert grads["2.weight"] == {"name": "2.weight", "dtype": "float32", "opens_as": "float32", "shape": [4, 16], "numel": 64,
                                 "bytes_per_step": 256, "ranks": 4, "shapes_differ": False}
    assert doc["finished"] is True and doc["run"]["exit_status"] == 0


def test_show_counts_the_shared_objects_beside_the_ranks(divergence_runs):
    """Tensor bytes live once per content in objects/, for all ranks: show says how much, so the
    ranks' own bytes beside the store's size are not a mystery."""
    ref, _ = divergence_runs
    doc = json.loads(invoke("show", ref, "--json").output)
    objects = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(ref, "objects")) for f in fs)
    assert doc["bytes_shared_objects"] == objects > sum(r["bytes"] for r in doc["ranks"]) / 4
    assert doc["bytes_shared_objects"] + sum(r["bytes"] for r in doc["ranks"]) <= doc["bytes_on_disk"]
    assert "  of which shared objects: " in invoke("show", ref).output


def test_show_lists_a_bfloat16_tensor_as_it_opens(tmp_path):
    import tracekit

    path = str(tmp_path / "s")
    create_store(path, {"command": ["train.py"], "record_config": {"kinds": ["outputs"], "params": [], "ranks": None}})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}, "run": {"device": "cpu"}})
    w.write(1, "outputs", [TensorData("output", "bfloat16", (2,), np.array([0x3F80, 0x4000], np.uint16))])
    w.complete_step(1)
    w.close()
    text = invoke("show", path).output
    row = next(line.split(None, 1)[1] for line in text.splitlines() if line.strip().startswith("output "))
    assert row.startswith("bfloat16 (opens as float32)"), text
    assert str(tracekit.open(path)["outputs"]["output"].dtype) == "float32"  # what show says
    # an empty selection is no filter: every parameter, every rank (it said `ranks: None`)
    assert "    ranks: all" in text and "    params: all" in text and "None" not in text


def test_show_says_what_a_replay_store_replays(tmp_path):
    path = str(tmp_path / "s")
    create_store(path, {"command": ["train.py"], "replay_of": "/runs/ref", "replay_steps": "2:3"})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}, "run": {"device": "cpu"}})
    w.write(1, "loss", [TensorData("loss", "float32", (), np.array(1.0, np.float32))])
    w.complete_step(1)
    w.close()
    text = invoke("show", path).output
    assert "replay of: /runs/ref (steps 2:3 restarted from that store's state; docs/REPLAY.md)" in text
    assert "replay_of" not in text and "replay_steps" not in text


def test_show_gives_each_mesh_position_once():
    from tracekit.cli.show import _mesh_cell

    tp = {"dim_names": ["tp"], "coordinate": [1], "shape": [2]}
    assert _mesh_cell([tp, dict(tp), dict(tp), dict(tp)]) == "tp=1"  # one mesh per TP module, all alike
    assert _mesh_cell([tp, {"dim_names": ["dp", "tp"], "coordinate": [0, 1]}]) == "tp=1; dp=0,tp=1"
    assert _mesh_cell([]) == "-"


def test_show_env_versions_and_fallback_ops(tmp_path):
    path = write_losses(str(tmp_path / "s"), {1: 1.0}, env={"NEURON_CC_FLAGS": "--auto-cast none"},
                        fallback=["aten::sort"])
    text = invoke("show", path).output
    # the ranks recorded no facts of their own: the run's stand for every rank
    assert "  same on every rank: torch=2.13.0, NEURON_CC_FLAGS=--auto-cast none" in text
    assert "fallback_ops: aten::sort" in text
    assert "finished: every rank closed, but no launcher finalized the store" in text
    out = invoke("show", "--json", path)
    assert out.exit_code == 0 and json.loads(out.output)["run"]["fallback_ops"] == ["aten::sort"]


def test_show_bad_store_is_one_line(tmp_path):
    (tmp_path / "junk").mkdir()
    out = CliRunner().invoke(main, ["show", str(tmp_path / "junk")])
    assert out.exit_code == 2
    assert out.output.strip().count("\n") == 0 and out.output.startswith("Error: ") and "not a tracekit store" in out.output


# ---- loss ---------------------------------------------------------------------------------------

def test_loss_side_by_side_with_differences(tmp_path):
    a = write_losses(str(tmp_path / "a"), {1: 2.0, 2: 1.0, 3: 0.5})
    b = write_losses(str(tmp_path / "b"), {1: 2.0, 2: 1.25, 3: 0.25})
    c = write_losses(str(tmp_path / "c"), {1: 4.0, 2: 1.0})  # died after step 2
    out = invoke("loss", a, b, c, "--json")
    assert out.exit_code == 0
    doc = json.loads(out.output)
    assert doc["columns"] == ["step", "a", "b", "c", "abs_diff[b]", "rel_diff[b]", "abs_diff[c]", "rel_diff[c]"]
    rows = {r["step"]: r for r in doc["rows"]}
    assert rows[2]["b"] == 1.25 and rows[2]["abs_diff[b]"] == 0.25 and rows[2]["rel_diff[b]"] == 0.25
    assert rows[3]["rel_diff[b]"] == 0.5 and rows[3]["c"] is None and rows[3]["abs_diff[c]"] is None
    assert rows[1]["abs_diff[c]"] == 2.0 and rows[1]["rel_diff[c]"] == 1.0

    text = invoke("loss", a, b).output.splitlines()
    assert text[0].split() == ["step", "a", "b", "abs_diff[b]", "rel_diff[b]"]
    assert text[2].split() == ["2", "1", "1.25", "2.500e-01", "2.500e-01"]

    rows = list(csv.DictReader(io.StringIO(invoke("loss", a, b, "--csv").output)))
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert float(rows[2]["b"]) == 0.25 and float(rows[2]["abs_diff[b]"]) == 0.25


def test_loss_of_the_sample_runs(divergence_runs):
    doc = json.loads(invoke("loss", *divergence_runs, "--json").output)
    assert [r["step"] for r in doc["rows"]] == [1, 2, 3, 4, 5]
    assert [r["name"] for r in doc["runs"]] == ["ref", "cand"]


def test_loss_errors_are_one_line(tmp_path):
    a = write_losses(str(tmp_path / "a"), {1: 1.0})
    out = CliRunner().invoke(main, ["loss", a, "--json", "--csv"])
    assert out.exit_code == 2 and "choose one of --json and --csv" in out.output
    out = CliRunner().invoke(main, ["loss", a, str(tmp_path / "missing")])
    assert out.exit_code == 2 and out.output.startswith("Error: ") and "no such store" in out.output
    # a store without any loss
    path = str(tmp_path / "noloss")
    create_store(path, {})
    w = RankWriter(path, 0, {"coords": {"rank": 0}})
    w.write(1, "gradients", [TensorData("g", "float32", (1,), np.ones(1, np.float32))])
    w.complete_step(1)
    w.close()
    out = CliRunner().invoke(main, ["loss", path])
    assert out.exit_code == 2 and "holds no loss" in out.output


def test_loss_nan_prints_valid_json(tmp_path):
    a = write_losses(str(tmp_path / "a"), {1: 1.0})
    b = write_losses(str(tmp_path / "b"), {1: float("nan")})
    def reject(token):
        raise AssertionError(f"bare {token} in JSON output")

    doc = json.loads(invoke("loss", a, b, "--json").output, parse_constant=reject)  # strict JSON: no bare NaN
    assert doc["rows"][0]["b"] == "nan"


# ---- report -------------------------------------------------------------------------------------

def test_report_writes_html_and_exits_like_diff(divergence_runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.html"
    res = CliRunner().invoke(main, ["report", *divergence_runs, "-o", str(out)])
    assert res.exit_code == 1, res.output  # FAIL, as `tracekit diff` would exit
    assert res.output.splitlines() == ["FAIL comparison ranks=4 steps=5 violations=18 first_step=3", f"report: {out}"]
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("data:image/png;base64,") == 7
    # looser tolerances pass, and the page says so
    res = CliRunner().invoke(main, ["report", *divergence_runs, "-o", str(out), "--rtol", "1", "--atol", "1"])
    assert res.exit_code == 0 and res.output.startswith("PASS comparison ranks=4 steps=5")
    assert '<div class="verdict PASS">PASS</div>' in out.read_text()


def test_report_bad_input_is_one_line(divergence_runs, tmp_path):
    res = CliRunner().invoke(main, ["report", divergence_runs[0], str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and res.output == f"Error: {tmp_path / 'nope'}: no such store\n"
    res = CliRunner().invoke(main, ["report", *divergence_runs, "-o", str(tmp_path / "no" / "r.html")])
    assert res.exit_code == 2 and res.output.startswith("Error: -o ") and "does not exist" in res.output
    assert not (tmp_path / "r.html").exists()


def test_no_option_swallows_a_positional_argument(tmp_path):
    a = write_losses(str(tmp_path / "a"), {1: 1.0, 2: 0.5})
    b = write_losses(str(tmp_path / "b"), {1: 1.0, 2: 0.25})
    # --json and --csv are flags in every command: before or after the stores, the same output
    for args in (["show", "--json", a], ["show", a, "--json"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0 and json.loads(out.output)["world_size"] == 2, out.output
    for flag in ("--json", "--csv"):
        before = CliRunner().invoke(main, ["loss", flag, a, b])
        after = CliRunner().invoke(main, ["loss", a, b, flag])
        assert before.exit_code == 0 and before.output == after.output and "0.25" in before.output
    # a file name after --json is a store argument, reported as such
    out = CliRunner().invoke(main, ["show", a, "--json", str(tmp_path / "out.json")])
    assert out.exit_code == 2 and "unexpected extra argument" in out.output


def test_report_without_matplotlib_says_so_on_stderr(divergence_runs, tmp_path, monkeypatch):
    """The page says its plots are missing; so does the command, where the user is looking."""
    from tracekit.report import plots

    def no_matplotlib(*a, **k):
        raise plots.PlottingUnavailable("matplotlib is not installed (pip install 'tracekit[plot]')")

    monkeypatch.setattr(plots, "_figure", no_matplotlib)
    ref, cand = divergence_runs
    out = CliRunner().invoke(main, ["report", ref, cand, "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 1, out.output
    assert "report: No plots: matplotlib is not installed" in out.stderr
    assert "No plots" not in out.stdout and "No plots: matplotlib" in (tmp_path / "r.html").read_text()


def test_report_json_gives_the_verdict_and_the_file(divergence_runs, tmp_path, monkeypatch):
    """--json: the object on stdout (schemas/report-result), the verdict line on stderr, diff's exit codes;
    an unusable comparison still writes its object, then the one `Error:` line, exit 2."""
    from tracekit.report import plots

    def no_matplotlib(*a, **k):  # the page's plots are not what this test is about: skip drawing them
        raise plots.PlottingUnavailable("matplotlib is not installed (pip install 'tracekit[plot]')")

    monkeypatch.setattr(plots, "_figure", no_matplotlib)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--json", *divergence_runs, "-o", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, load("report-result"))
    assert (doc["output"], doc["status"], doc["violations"], doc["first_step"], doc["exit_status"]) == (
        str(out), "fail", 18, 3, 1)
    assert doc["notes"] and doc["notes"][0].startswith("No plots: matplotlib is not installed")
    assert res.stderr.splitlines()[-1] == doc["summary_line"] == "FAIL comparison ranks=4 steps=5 violations=18 first_step=3"
    assert out.read_text().startswith("<!DOCTYPE html>")
    a = write_losses(str(tmp_path / "a"), {1: 1.0, 2: 0.5})
    b = write_losses(str(tmp_path / "b"), {1: 1.0, 2: 0.5}, ranks=1)
    res = CliRunner().invoke(main, ["report", a, b, "-o", str(tmp_path / "s.html"), "--json"])
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, load("report-result"))
    assert res.exit_code == 2 and (doc["status"], doc["exit_status"]) == ("error", 2)
    assert res.stderr.splitlines()[-1].startswith("Error: the stores differ in structure"), res.stderr
