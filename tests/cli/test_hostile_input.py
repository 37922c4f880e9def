"""Every bad input is one line and a non-zero exit: options, config files, hostile stores and dump files."""

import json
import os
import stat
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.errors import StoreError
from tracekit.testing import write_store


def _data(name="w", steps=3, scale=1.0):
    return {0: {s: {"parameters": {name: np.arange(3, dtype=np.float32) * s * scale},
                    "loss": {"loss": np.float32(s * scale)}} for s in range(steps)}}


def cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


def one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # click's own usage errors come with its standard "Usage: ..." and "Try ... --help" hint lines
    lines = [line for line in result.output.strip().splitlines() if line and not line.startswith(("Usage:", "Try '"))]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def pair(tmp_path):
    return write_store(tmp_path / "a", _data()), write_store(tmp_path / "b", _data())


@pytest.mark.parametrize("args, fragment", [
    (["--ranks", "3-1"], "range 3-1 goes down"),
    (["--ranks", "-1"], "ranks count from 0"),
    (["--ranks", ","], "ranks count from 0"),
    (["--kinds", ","], "names no kind"),
    (["--kinds", "-outputs,-loss,-gradients,-parameters,-deltas"], "leaves no kind to record"),  # it recorded them all
    (["--flush-timeout", "nan"], "finite"),  # it waited forever
    (["--flush-timeout", "inf"], "finite"),
    (["--flush-timeout", "-1"], "finite"),
])
def test_record_refuses_bad_selections_before_starting(tmp_path, args, fragment):
    one_line_error(cli("record", "-o", tmp_path / "s", *args, "--", "true"), fragment)
    assert not os.path.exists(tmp_path / "s")


@pytest.mark.parametrize("args, fragment", [
    (["--atol", "inf"], "finite"),
    (["--rtol", "nan"], "finite"),
    (["--tol", "loss=1e-3,inf"], "finite"),
    (["--oracle-factor", "inf"], "finite"),
    (["--max-rows", "-5"], "-5"),
    (["--kinds", ","], "names no kind"),
])
def test_diff_refuses_bad_option_values(pair, args, fragment):
    one_line_error(cli("diff", *pair, *args), fragment)


def test_a_typo_anywhere_in_the_config_is_refused(pair, tmp_path):
    """[dtype.flaot32] used to apply to nothing: a PASS where [dtype.float32] FAILs."""
    cand = write_store(tmp_path / "c", _data(scale=1.001))
    good, typo = tmp_path / "good.toml", tmp_path / "typo.toml"
    good.write_text("[dtype.float32]\nrtol = 0\natol = 0\n")
    typo.write_text("[dtype.flaot32]\nrtol = 0\natol = 0\n")
    assert cli("diff", pair[0], cand, "--config", good).exit_code == 1
    one_line_error(cli("diff", pair[0], cand, "--config", typo), "[dtype.flaot32]", "unknown dtype 'flaot32'")
    for text, fragment in [("[dtype.float32]\nrtl = 0\n", "[dtype.float32]"), ("rtoll = 1\n", "rtoll"),
                           ("atol = inf\n", "finite"), ("[kind.gradeints]\nrtol = 0\n", "gradeints")]:
        typo.write_text(text)
        one_line_error(cli("diff", *pair, "--config", typo), fragment)


@pytest.mark.parametrize("inside", ["rank_0", "rank_0/new", "fresh"])
def test_a_store_inside_a_store_is_refused(tmp_path, inside):
    """-o LIVE/rank_0 was accepted: the job wrote into another job's rank group (which lost rank 0,
    and verify said OK). Any folder inside a store is refused, before anything is written."""
    outer = tmp_path / "outer"
    write_store(outer, _data())
    before = sorted(p.relative_to(outer) for p in outer.rglob("*"))
    one_line_error(cli("record", "-o", outer / inside, "--force", "--", "true"), "is inside the tracekit store", str(outer))
    assert sorted(p.relative_to(outer) for p in outer.rglob("*")) == before


def test_a_huge_rank_range_costs_its_two_ends():
    from tracekit.launch.config import RecordConfig, parse_ranks

    ranks = parse_ranks("0-99999999999999,3")
    assert ranks.ranges == ((0, 99999999999999),) and 99999999999999 in ranks and 10**14 not in ranks
    config = RecordConfig(store="s", ranks=ranks)
    assert RecordConfig.from_env(config.to_env()).ranks == ranks
    assert RecordConfig(store="s", ranks=frozenset({2, 0, 1, 5})).ranks.spec() == "0-2,5"


def test_names_with_control_characters_are_escaped_in_show_and_diff(tmp_path):
    forged = "w\nPASS comparison ranks=1 steps=2\x1b[32m"
    ref = write_store(tmp_path / "a", _data(forged))
    cand = write_store(tmp_path / "b", _data(forged, scale=2.0))
    for result in (cli("show", ref), cli("diff", ref, cand)):
        assert "\x1b" not in result.output
        assert not any(line.startswith("PASS") for line in result.output.splitlines())
        assert repr(forged) in result.output
    assert cli("diff", ref, cand).output.strip().splitlines()[-1].startswith("FAIL")


def test_a_slash_in_a_tensor_name_opens_and_reports(tmp_path):
    store = write_store(tmp_path / "a", _data("layers/0.weight"))
    tree = tracekit.open(store)
    var = tree["parameters"]["layers%2F0.weight"]
    assert var.attrs["tensor"] == "layers/0.weight"
    assert var.sel(rank=0, step=2).values.tolist() == [0.0, 2.0, 4.0]
    assert cli("report", store, store, "-o", tmp_path / "r.html").exit_code == 0


def _edit_json(path, edit):
    with open(path) as f:
        doc = json.load(f)
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_absurd_steps_and_a_lying_index_are_one_line(tmp_path):
    big = write_store(tmp_path / "big", _data())
    _edit_json(os.path.join(big, "rank_0", "zarr.json"), lambda d: d["attributes"].update(completed_steps=[1, 10**30]))
    one_line_error(cli("report", big, big, "-o", tmp_path / "r.html"), "impossible step 10000")
    with pytest.raises(StoreError, match="impossible step"):
        tracekit.open(big)

    # format 1: the packed array's own shape lies too (format 2 has no packed arrays; see below)
    lie = write_store(tmp_path / "lie", _data(), format_version=1)
    _edit_json(os.path.join(lie, "rank_0", "parameters", "zarr.json"),
               lambda d: d["attributes"]["tensors"][0].update(shape=[2**40], numel=2**40))
    _edit_json(os.path.join(lie, "rank_0", "parameters", "float32", "zarr.json"),
               lambda d: d["shape"].__setitem__(1, 2**40))
    for args in (("show", lie), ("diff", lie, lie), ("export", lie, "-o", tmp_path / "e")):
        one_line_error(cli(*args), "damaged metadata", "chunks per row")
    with pytest.raises(StoreError, match="chunks per row"):
        tracekit.open(lie)["parameters"].load()


@pytest.mark.parametrize("version", [2, 3])
def test_a_lying_index_of_format_2_is_one_line(tmp_path, version):
    lie = write_store(tmp_path / "lie", _data(), format_version=version)
    _edit_json(os.path.join(lie, "rank_0", "parameters", "zarr.json"),
               lambda d: d["attributes"]["tensors"][0].update(shape=[2**40], numel=2**40))
    # The objects' sizes are checked against the claim before anything that size is allocated.
    # Format 3: the tensor was packed, and a tensor that size has no pack: its object is not there.
    said = "the index says 4398046511104" if version == 2 else "is missing"
    result = cli("verify", lie)
    assert result.exit_code == 2 and "Traceback" not in result.output and said in result.output
    with pytest.raises(StoreError, match=said):
        tracekit.open(lie)["parameters"].load()


# format 2: the hash index is the zarr array; its reader names the kind and "unreadable data"
@pytest.mark.parametrize("version,array,problem", [(1, "float32", "unreadable array metadata"), (2, "hash", "unreadable")])
def test_corrupt_array_metadata_is_a_store_error_in_the_python_api(tmp_path, version, array, problem):
    store = write_store(tmp_path / "s", _data(), format_version=version)
    with open(os.path.join(store, "rank_0", "parameters", array, "zarr.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(StoreError, match=problem):
        tracekit.open(store)["parameters"].load()
    with pytest.raises(StoreError, match=problem):
        tracekit.open_store(store).rank(0).read("parameters", 1, "w")
    one_line_error(cli("diff", store, store), problem)


def test_unwritable_destinations_are_one_line(tmp_path, pair):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    one_line_error(cli("record", "-o", blocker / "s", "--", "true"), "cannot create it")
    one_line_error(cli("import", tmp_path / "a", "-o", blocker / "s"))
    one_line_error(cli("report", *pair, "-o", blocker / "r.html"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_import_refuses_a_fifo_instead_of_hanging(tmp_path):
    src = tmp_path / "dump"
    src.mkdir()
    torch.save({"w": torch.ones(2)}, src / "step1.pt")
    os.mkfifo(src / "step2.pt")
    one_line_error(cli("import", src, "-o", tmp_path / "s"), "is a FIFO, not a regular file")
    one_line_error(cli("import", src / "step2.pt", "-o", tmp_path / "s"), "is a FIFO")
    assert not os.path.exists(tmp_path / "s")


@pytest.mark.parametrize("tensor, fragment", [
    (torch.ones(2, 2).to_sparse(), "sparse_coo tensor, not a dense one"),
    (torch.empty(3, device="meta"), "a meta tensor"),
])
def test_import_refuses_sparse_and_meta_tensors(tmp_path, tensor, fragment):
    src = tmp_path / "dump"
    src.mkdir()
    torch.save({"w": tensor}, src / "step1.pt")
    one_line_error(cli("import", src, "-o", tmp_path / "s"), fragment)


@pytest.mark.parametrize("meta, fragment", [
    ({"rank": "-1", "step": "1"}, "impossible rank -1"),
    ({"rank": "3", "step": "1", "coords": json.dumps({"world_size": 2})}, "does not fit its metadata's world size 2"),
    ({"rank": "0", "step": str(10**30)}, "impossible step"),
])
def test_import_refuses_impossible_metadata(tmp_path, meta, fragment):
    from safetensors.torch import save_file

    src = tmp_path / "dump"
    src.mkdir()
    save_file({"w": torch.ones(2)}, str(src / "x.safetensors"), metadata=meta)
    one_line_error(cli("import", src, "-o", tmp_path / "s"), fragment)


def test_exported_files_get_umask_permissions(tmp_path):
    store = write_store(tmp_path / "s", _data())
    old = os.umask(0o022)
    try:
        assert cli("export", store, "-o", tmp_path / "e").exit_code == 0
    finally:
        os.umask(old)
    files = [os.path.join(d, n) for d, _, names in os.walk(tmp_path / "e") for n in names]
    assert files and all(stat.S_IMODE(os.stat(f).st_mode) == 0o644 for f in files)


@pytest.mark.skipif(sys.platform != "linux", reason="non-UTF-8 file names")
def test_paths_with_non_utf8_bytes_export_and_report(tmp_path):
    folder = os.path.join(os.fsencode(tmp_path), b"st\xff")
    os.makedirs(folder)
    store = write_store(os.fsdecode(os.path.join(folder, b"s")), _data())
    assert cli("export", store, "-o", tmp_path / "e").exit_code == 0
    result = cli("report", store, store, "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert "st\\udcff" in (tmp_path / "r.html").read_text()
