"""`tracekit diff` through click's CliRunner: verdict lines, exit codes, JSON report, bad input."""

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from tracekit.cli.diff import diff
from tracekit.testing import write_store

SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "diff-report.schema.json").read_text())
f32 = np.float32


def _run(steps=3, ranks=2, grad_scale=None, loss_scale=None):
    """A tiny recorded run; grad_scale=(step, factor) and loss_scale=(step, factor) plant faults."""
    data = {}
    for r in range(ranks):
        data[r] = {0: {"parameters": {"w": np.linspace(-1, 1, 12, dtype=f32).reshape(3, 4)}}}
        for s in range(1, steps + 1):
            g = np.linspace(0.1, 0.3, 12, dtype=f32).reshape(3, 4) * s
            if grad_scale and grad_scale[0] == s:
                g = g * f32(grad_scale[1])
            loss = f32(2.0 / s) * (f32(loss_scale[1]) if loss_scale and loss_scale[0] == s else f32(1))
            data[r][s] = {"outputs": {"y": np.full((2, 4), r + s, f32)}, "loss": {"loss": loss}, "gradients": {"w": g},
                          "parameters": {"w": np.full((3, 4), -0.1 * s, f32)}, "deltas": {"w": np.full((3, 4), -0.1, f32)}}
    return data


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("stores")
    return {
        "ref": write_store(d / "ref", _run(), run={"device": "cpu", "backend": "gloo"}),
        "same": write_store(d / "same", _run(), run={"device": "cuda", "backend": "nccl"}),
        "grad": write_store(d / "grad", _run(grad_scale=(2, 1.01))),
        "short": write_store(d / "short", _run(steps=2)),
    }


def invoke(*args):
    return CliRunner().invoke(diff, [str(a) for a in args], catch_exceptions=False)


def test_pass_prints_tables_and_the_verdict_last(stores):
    r = invoke(stores["ref"], stores["same"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.rstrip("\n").splitlines()
    assert lines[-1] == "PASS comparison ranks=2 steps=3"
    assert "Summary per step and kind" in r.stdout and "Loss:" in r.stdout
    assert "ref loss" in r.stdout and "device=cuda, backend=nccl" in r.stdout


def test_fail_exit_1_and_json_validates(stores, tmp_path):
    out = tmp_path / "report.json"
    r = invoke(stores["ref"], stores["grad"], "--json-file", out)
    assert r.exit_code == 1
    assert r.stdout.rstrip().splitlines()[-1] == "FAIL comparison ranks=2 steps=3 violations=2 first_step=2"
    assert "First divergence: step 2, gradients, tensor 'w', ranks 0-1" in r.stdout
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["status"] == "fail" and doc["first_divergence"]["kind"] == "gradients"
    assert [row["step"] for row in doc["loss_table"]] == [1, 2, 3]
    assert {(x["step"], x["kind"], x["rank"]) for x in doc["results"]} == {(2, "gradients", 0), (2, "gradients", 1)}


def test_json_to_stdout_keeps_stdout_pure_json(stores):
    r = invoke(stores["ref"], stores["same"], "--json", "--all-tensors")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["summary_line"] == "PASS comparison ranks=2 steps=3"
    assert len(doc["results"]) == 2 * (1 + 3 * 5)
    assert r.stderr.strip().splitlines()[-1] == "PASS comparison ranks=2 steps=3"


def test_structural_problem_exit_2_and_allow_missing(stores, tmp_path):
    out = tmp_path / "r.json"
    r = invoke(stores["ref"], stores["short"], "--json-file", out)
    assert r.exit_code == 2
    assert "cand ranks 0-1 lack step 3 of outputs, loss, gradients, parameters, deltas" in r.stdout
    assert "Nothing was compared: pass --allow-missing" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "ERROR comparison ranks=2 structural_problems=1"
    quiet = invoke(stores["ref"], stores["short"], "-q")
    assert quiet.exit_code == 2 and "pass --allow-missing" in quiet.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["status"] == "error"
    r = invoke(stores["ref"], stores["short"], "--allow-missing")
    assert r.exit_code == 0
    assert "Skipped" in r.stdout and r.stdout.rstrip().splitlines()[-1] == "PASS comparison ranks=2 steps=2 missing_steps=1"


def test_tolerance_options(stores, tmp_path):
    assert invoke(stores["ref"], stores["grad"], "--tol", "gradients=2e-2,0").exit_code == 0
    assert invoke(stores["ref"], stores["grad"], "--rtol", "2e-2").exit_code == 0
    assert invoke(stores["ref"], stores["same"], "--exact", "-q").stdout == "PASS comparison ranks=2 steps=3\n"
    cfg = tmp_path / "tol.toml"
    cfg.write_text("[kind.gradients]\nrtol = 2e-2\natol = 0\n")
    assert invoke(stores["ref"], stores["grad"], "--config", cfg).exit_code == 0
    cfg.write_text("rtol = 1e-9\n[kind.gradients]\nrtol = 2e-2\n")
    r = invoke(stores["ref"], stores["grad"], "--config", cfg, "--json")
    tols = {t["kind"]: t for t in json.loads(r.stdout)["tolerances"]}
    assert tols["gradients"]["rtol"] == 2e-2 and tols["gradients"]["atol"] == 1e-5  # atol: float32 default
    assert tols["loss"]["rtol"] == 1e-9 and tols["loss"]["source"] == "rtol: config, atol: float32 default"


def test_fail_fast_and_quiet(stores, tmp_path):
    later = write_store(tmp_path / "later", _run(grad_scale=(2, 1.01), loss_scale=(3, 2.0)))
    r = invoke(stores["ref"], later, "--fail-fast", "-q")
    assert r.exit_code == 1 and r.stdout == "FAIL comparison ranks=2 steps=2 violations=2 first_step=2\n"


@pytest.mark.parametrize("bad, message", [
    ("usage", "--tol 'gradients': expected KIND=RTOL,ATOL[,REL_L2]"),
])
def test_bad_options(stores, bad, message):
    r = invoke(stores["ref"], stores["same"], "--tol", "gradients")
    assert r.exit_code == 2 and r.stderr.strip() == f"Error: {message}, e.g. --tol gradients=1e-5,1e-6"


def _corrupt(path: Path, how: str) -> Path:
    if how == "missing":
        return path / "nope"
    if how == "plain dir":
        (path / "x").mkdir(parents=True)
        (path / "x" / "notes.txt").write_text("hi")
        return path / "x"
    if how == "foreign zarr":
        zarr.open_group(str(path / "z"), mode="w", attributes={"something": 1})
        return path / "z"
    # chunk files are format 1's; format 2's objects are damaged in the last two cases, on a store
    # whose gradients differ from the reference (equal hashes would be decided without a read)
    version = 1 if how.endswith("chunk") else None
    store = Path(write_store(path / "s", _run(grad_scale=(2, 1.01)) if "object" in how else _run(), format_version=version))
    meta = store / "zarr.json"
    if how == "newer format":
        doc = json.loads(meta.read_text())
        doc["attributes"]["tracekit"]["format_version"] = 99
        meta.write_text(json.dumps(doc))
    elif how == "no ranks":
        for r in store.glob("rank_*"):
            import shutil

            shutil.rmtree(r)
    elif how == "garbage rank metadata":
        (store / "rank_1" / "zarr.json").write_text("{not json")
    elif how == "rank metadata deleted":
        (store / "rank_1" / "zarr.json").unlink()
    elif how == "bad tensor index":
        kmeta = store / "rank_0" / "gradients" / "zarr.json"
        doc = json.loads(kmeta.read_text())
        doc["attributes"]["tensors"] = [{"name": "w"}]
        kmeta.write_text(json.dumps(doc))
    elif how == "deleted chunk":
        (store / "rank_1" / "gradients" / "float32" / "c" / "1" / "0").unlink()
    elif how == "truncated chunk":
        chunk = store / "rank_0" / "parameters" / "float32" / "c" / "2" / "0"
        chunk.write_bytes(chunk.read_bytes()[:10])
    elif how in ("deleted object", "flipped bit in object"):
        from tracekit.testing import tensor_bytes

        file, base, _ = tensor_bytes(store, 1, "gradients", 2, "w")  # its object, or its range of a pack
        obj = Path(file)
        if how == "deleted object":
            obj.unlink()
        else:
            raw = bytearray(obj.read_bytes())
            raw[base + 3] ^= 0x10
            obj.write_bytes(bytes(raw))
    return store


BAD = {
    "missing": "no such store",
    "plain dir": "is not a tracekit store (no zarr.json at its root)",
    "foreign zarr": "is a zarr store but not a tracekit store",
    "newer format": "has store format 99, newer than this tracekit reads",
    "no ranks": "has no ranks: a half-written store",
    "garbage rank metadata": "unreadable metadata below it (JSONDecodeError",
    "rank metadata deleted": "rank_1 has no readable metadata (half-written store?)",
    "bad tensor index": "rank 0 gradients: malformed tensor index",
    "deleted chunk": "rank 1 gradients step 2: chunk file rank_1/gradients/float32/c/1/0 is missing",
    "truncated chunk": "rank 0 parameters step 2: chunk file rank_0/parameters/float32/c/2/0 is truncated",
    "deleted object": "gradients step 2 tensor w: its object objects/",
    "flipped bit in object": "gradients step 2 tensor w: bytes do not match their hash",
}


@pytest.mark.parametrize("how, side", [(how, "cand") for how in BAD] + [("newer format", "ref"), ("deleted chunk", "ref")])
def test_bad_input_is_one_line_and_exit_2(stores, tmp_path, how, side):
    bad = _corrupt(tmp_path, how)
    args = (bad, stores["ref"]) if side == "ref" else (stores["ref"], bad)
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and BAD[how] in err[0], r.stderr
    assert str(bad) in err[0]  # names the store
    assert "Traceback" not in r.output


def test_oracle_shows_both_errors(tmp_path):
    x = np.linspace(500, 1000, 16)
    oracle = write_store(tmp_path / "o", {0: {1: {"gradients": {"w": x}}}})
    ref = write_store(tmp_path / "r", {0: {1: {"gradients": {"w": x.astype(f32)}}}})
    bad = x.astype(f32)
    bad[2] += f32(0.5)
    cand = write_store(tmp_path / "c", {0: {1: {"gradients": {"w": bad}}}})
    r = invoke(ref, cand, "--oracle", oracle, "--oracle-factor", "2", "--json-file", tmp_path / "j.json")
    assert r.exit_code == 1
    assert "oracle:" in r.stdout and "(factor 2)" in r.stdout and "|cand-oracle|" in r.stdout and "|ref-oracle|" in r.stdout
    doc = json.loads((tmp_path / "j.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    w = doc["first_divergence"]["worst"]
    assert w["index"] == [2] and w["oracle"] == x[2] and w["cand_oracle_err"] > 2 * w["ref_oracle_err"]
    assert invoke(ref, cand, "--oracle", oracle, "--oracle-factor", "-1").exit_code == 2


@pytest.mark.parametrize("case, args, reason", [
    ("no data", (), "no step of any tensor is recorded in both stores"),
    ("disjoint steps", ("--allow-missing",), "the stores have no step of any tensor in common (2 difference(s) skipped)"),
    ("global, outputs only", ("--align", "global"), "not comparable: outputs: per-rank outputs depend on the data-parallel layout"),
])
def test_nothing_compared_is_an_error_not_a_pass(tmp_path, case, args, reason):
    dp = lambda r, d: {"rank": r, "world_size": d, "dp_degree": d, "dp_rank": r}  # noqa: E731
    one = lambda step, kind="loss": {step: {kind: {kind: f32(1.0)}}}  # noqa: E731
    ref, cand = {
        "no data": ({0: {}, 1: {}}, {0: {}, 1: {}}),
        "disjoint steps": ({0: one(1)}, {0: one(2)}),
        "global, outputs only": ({0: one(1, "outputs")}, {0: one(1, "outputs"), 1: one(1, "outputs")}),
    }[case]
    coords = {"global, outputs only": ({0: dp(0, 1)}, {0: dp(0, 2), 1: dp(1, 2)})}.get(case, (None, None))
    a = write_store(tmp_path / "a", ref, coords=coords[0])
    b = write_store(tmp_path / "b", cand, coords=coords[1])
    out = tmp_path / "r.json"
    r = invoke(a, b, *args, "--json-file", out)
    assert r.exit_code == 2, r.output
    last = r.stdout.rstrip().splitlines()[-1]
    assert last.startswith("ERROR comparison ranks=") and f"compared=0: {reason}" in last
    assert f"Nothing was compared: {reason}" in r.stdout
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["status"] == "error" and doc["passed"] is False
    quiet = invoke(a, b, *args, "-q")
    assert quiet.exit_code == 2 and quiet.stdout.startswith("ERROR") and f"Error: nothing was compared: {reason}" in quiet.stderr


def test_an_empty_tensor_alone_still_counts_as_compared(tmp_path):
    data = {0: {1: {"outputs": {"e": np.zeros((0, 3), f32)}}}}
    r = invoke(write_store(tmp_path / "a", data), write_store(tmp_path / "b", data), "-q")
    assert r.exit_code == 0 and r.stdout == "PASS comparison ranks=1 steps=1\n"


def test_misspelt_kind_in_tol_or_config_is_a_usage_error(stores, tmp_path):
    # a tightened gate that applies to nothing would report PASS
    r = invoke(stores["ref"], stores["same"], "--tol", "gradient=0,0")
    assert r.exit_code == 2
    assert r.stderr.strip() == ("Error: --tol gradient: no store recorded this kind "
                                "(recorded: outputs, loss, gradients, parameters, deltas)")
    cfg = tmp_path / "tol.toml"
    cfg.write_text("[kind.losss]\nrtol = 0\n")
    r = invoke(stores["ref"], stores["same"], "--config", cfg)
    assert r.exit_code == 2 and r.stderr.startswith("Error: config [kind.losss]: no store recorded this kind")


def test_unwritable_json_destination_fails_before_comparing(stores, tmp_path, monkeypatch):
    import tracekit.compare as diff_module

    def never(*a, **k):
        raise AssertionError("compared although the report cannot be written")

    monkeypatch.setattr(diff_module, "diff", never)
    for dest, why in ((tmp_path / "nope" / "r.json", "does not exist"), (tmp_path, "is a directory")):
        r = invoke(stores["ref"], stores["same"], "--json-file", dest)
        assert r.exit_code == 2 and r.stderr.strip().startswith(f"Error: --json-file {dest}: "), r.output
        assert why in r.stderr and "Traceback" not in r.output


def test_a_json_file_that_cannot_be_written_keeps_the_earlier_one(stores, tmp_path, full_disk):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / "r.json"
    dest.write_text('{"earlier": true}\n')
    with full_disk():
        r = invoke(stores["ref"], stores["same"], "--json-file", dest)
    assert r.exit_code == 2 and "cannot write it (No space left on device)" in r.stderr, r.output
    assert dest.read_text() == '{"earlier": true}\n' and [p.name for p in out_dir.iterdir()] == ["r.json"]


def _violation_table(output: str) -> tuple[str, list[list[str]]]:
    """The Violations title line and its rows (split on runs of spaces), up to the next blank line."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Violations:"))
    end = next(i for i in range(start + 3, len(lines) + 1) if i == len(lines) or not lines[i].strip())
    return lines[start], [line.split() for line in lines[start + 3:end]]


def test_identical_violations_of_several_ranks_share_one_row_and_json_keeps_each_rank(tmp_path):
    """Issue 12: ranks 0-2 fail identically at step 2 (an all-reduced gradient does); rank 3 fails
    otherwise. The table has one row per distinct result, naming its ranks; the JSON every rank."""
    ref, cand = _run(ranks=4), _run(ranks=4)
    for r in range(4):
        cand[r][2]["gradients"]["w"] = cand[r][2]["gradients"]["w"] * f32(1.02 if r == 3 else 1.01)
    a, b = write_store(tmp_path / "ref", ref), write_store(tmp_path / "cand", cand)
    out = tmp_path / "r.json"
    r = invoke(a, b, "--json-file", out)
    assert r.exit_code == 1
    title, rows = _violation_table(r.stdout)
    assert title.startswith("Violations: 4 (step, rank, kind, tensor) comparisons outside tolerance, in 2 rows, "
                            "all shown;")
    assert [row[:4] for row in rows] == [["2", "0-2", "gradients", "w"], ["2", "3", "gradients", "w"]]
    assert rows[0][4:] != rows[1][4:]  # rank 3's errors differ
    assert r.stdout.rstrip().splitlines()[-1].endswith(" violations=4 first_step=2")  # V counts every rank
    doc = json.loads(out.read_text())
    assert sorted(x["rank"] for x in doc["results"]) == [0, 1, 2, 3]
    # --max-rows counts rows
    title, rows = _violation_table(invoke(a, b, "--max-rows", "1").stdout)
    assert "in 2 rows, the first 1 shown (--max-rows)" in title and len(rows) == 1


def test_the_summary_header_says_what_n_counts(stores):
    r = invoke(stores["ref"], stores["grad"])
    assert "FAIL n: n (rank, tensor) pairs outside tolerance" in r.stdout
    row = next(line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["2"])
    assert "FAIL" in row and row[row.index("FAIL") + 1] == "2"  # both ranks' 'w' at step 2
    title, rows = _violation_table(r.stdout)
    assert "2 (step, rank, kind, tensor) comparisons" in title and [row[:2] for row in rows] == [["2", "0-1"]]
