"""`tracekit export` and `tracekit import` on the command line: round trip, one-line errors."""

import json
import os

import jsonschema
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from tracekit import open_store
from tracekit.cli.main import main
from tracekit.schemas import load
from tracekit.store.tensors import from_torch
from tracekit.store import RankWriter, create_store


def _store(path, ranks=(0,)):
    create_store(str(path), {"command": ["test"]})
    for r in ranks:
        w = RankWriter(str(path), r, {"coords": {"rank": r, "world_size": len(ranks)}, "run": {"mode": "plain"}})
        for s in (0, 1):
            w.write(s, "parameters", [from_torch("0.weight", (torch.arange(6.0).reshape(2, 3) + s + r).to(torch.bfloat16)),
                                      from_torch("0.bias", torch.tensor([s - 0.1, r + 0.3]))])
        w.complete_step(1)
        w.close()


def _run(*args):
    """(exit code, output); click's runner interleaves stderr into the output."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_export_one_file_then_import_it_back_bit_for_bit(tmp_path):
    _store(tmp_path / "s")
    out = str(tmp_path / "p1.safetensors")
    code, text = _run("export", str(tmp_path / "s"), "--step", "1", "-o", out)
    assert code == 0, text
    assert "wrote 2 parameters tensors of rank 0 step 1" in text
    with safe_open(out, framework="pt") as f:
        assert f.metadata()["kind"] == "parameters" and f.get_tensor("0.weight").dtype == torch.bfloat16
    code, text = _run("import", out, "-o", str(tmp_path / "back"))
    assert code == 0, text
    a, b = open_store(tmp_path / "s").rank(0), open_store(tmp_path / "back").rank(0)
    for name in ("0.weight", "0.bias"):
        assert a.read_bits("parameters", 1, name).tobytes() == b.read_bits("parameters", 1, name).tobytes()
    assert b.completed_steps == [1]


def test_export_a_folder_and_import_it_with_force(tmp_path):
    _store(tmp_path / "s", ranks=(0, 1))
    code, text = _run("export", str(tmp_path / "s"), "-o", str(tmp_path / "tree"))
    assert code == 0 and "wrote 4 safetensors files" in text
    for _ in range(2):  # the second time over an existing store, which --force allows
        code, text = _run("import", str(tmp_path / "tree"), "-o", str(tmp_path / "back"), "--force")
        assert code == 0, text
    assert "ranks [0, 1], steps 0-1, kinds parameters" in text
    assert np.array_equal(open_store(tmp_path / "back").rank(1).read("parameters", 0, "0.bias"), np.float32([-0.1, 1.3]))


def _json_run(*args):
    """(exit code, stdout, stderr) of a --json run."""
    result = CliRunner().invoke(main, [*args, "--json"])
    return result.exit_code, result.stdout, result.stderr


def test_json_says_what_was_written_and_what_was_imported(tmp_path):
    """--json: one object on stdout, no human text, valid against its schema; errors stay one line."""
    _store(tmp_path / "s", ranks=(0, 1))
    one = str(tmp_path / "p.safetensors")
    code, out, err = _json_run("export", str(tmp_path / "s"), "--rank", "1", "--step", "1", "-o", one)
    assert code == 0 and not err, err
    doc = json.loads(out)
    jsonschema.validate(doc, load("export-result"))
    assert doc == {"source": str(tmp_path / "s"), "destination": one, "layout": "file", "files": 1, "ranks": [1],
                   "steps": [1], "kinds": ["parameters"], "tensors": 2}
    code, out, err = _json_run("export", str(tmp_path / "s"), "-o", str(tmp_path / "tree"))
    doc = json.loads(out)
    jsonschema.validate(doc, load("export-result"))
    assert code == 0 and (doc["layout"], doc["files"], doc["ranks"], doc["steps"]) == ("folder", 4, [0, 1], [0, 1])
    code, out, err = _json_run("import", str(tmp_path / "tree"), "-o", str(tmp_path / "back"))
    doc = json.loads(out)
    jsonschema.validate(doc, load("import-result"))
    assert code == 0 and (doc["files"], doc["ranks"], doc["steps"], doc["kinds"]) == (4, [0, 1], [0, 1], ["parameters"])
    assert doc["destination"] == str(tmp_path / "back") and open_store(tmp_path / "back").ranks == [0, 1]
    # an error is the one `Error:` line on stderr, with nothing on stdout
    code, out, err = _json_run("import", str(tmp_path / "tree"), "-o", str(tmp_path / "back"))
    assert code == 2 and not out and err.startswith("Error: ") and len(err.splitlines()) == 1, err
    with pytest.raises(jsonschema.ValidationError):  # the schema can refuse: a count is never negative
        jsonschema.validate({**doc, "files": -1}, load("import-result"))


def test_import_strips_wrapper_names_unless_asked_not_to(tmp_path):
    os.makedirs(tmp_path / "d" / "rank_0")
    torch.save({"module._orig_mod.0.weight": torch.ones(2)}, tmp_path / "d" / "rank_0" / "step_1.pt")
    assert _run("import", str(tmp_path / "d"), "-o", str(tmp_path / "a"))[0] == 0
    assert [t.name for t in open_store(tmp_path / "a").rank(0).tensors("parameters")] == ["0.weight"]
    assert _run("import", str(tmp_path / "d"), "-o", str(tmp_path / "b"), "--keep-names")[0] == 0
    assert [t.name for t in open_store(tmp_path / "b").rank(0).tensors("parameters")] == ["module._orig_mod.0.weight"]


def test_errors_are_one_line_with_exit_2(tmp_path):
    _store(tmp_path / "s", ranks=(0, 1))
    code, text = _run("export", str(tmp_path / "s"), "--step", "1", "-o", str(tmp_path / "x.safetensors"))
    assert code == 2 and "Error:" in text and "pick one with --rank" in text and "Traceback" not in text
    code, text = _run("export", str(tmp_path / "s"), "--rank", "0", "--step", "1", "-o", str(tmp_path / "x.pt"))
    assert code == 2 and "ending in .safetensors" in text
    os.makedirs(tmp_path / "evil")
    torch.save({"w": torch.ones(1), "f": _Obj()}, tmp_path / "evil" / "step1.pt")
    code, text = _run("import", str(tmp_path / "evil"), "-o", str(tmp_path / "e"))
    assert code == 2 and "refused" in text and "Traceback" not in text
    assert len([line for line in text.splitlines() if line.strip()]) == 1
    assert not os.path.exists(tmp_path / "e")


class _Obj:
    pass


def test_unwritable_export_destination_is_one_line(tmp_path):
    _store(tmp_path / "s")
    (tmp_path / "a_file").write_text("x")
    for args in (("--step", "1", "-o", str(tmp_path / "a_file" / "x.safetensors")), ("-o", str(tmp_path / "a_file" / "tree"))):
        code, text = _run("export", str(tmp_path / "s"), *args)
        assert code == 2 and text.startswith("Error: ") and "cannot write it" in text, text
        assert len(text.strip().splitlines()) == 1 and "Traceback" not in text


def test_an_export_that_fails_keeps_the_earlier_file_whole_and_leaves_no_temporary(tmp_path, full_disk):
    _store(tmp_path / "s")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "p.safetensors"
    assert _run("export", str(tmp_path / "s"), "--step", "0", "-o", str(out))[0] == 0
    before = out.read_bytes()
    with full_disk(written=10):  # the disk fills part way through the file
        code, text = _run("export", str(tmp_path / "s"), "--step", "1", "-o", str(out))
    assert code == 2 and "cannot write it (No space left on device)" in text, text
    assert out.read_bytes() == before  # step 0's export, whole
    assert [p.name for p in out_dir.iterdir()] == ["p.safetensors"]


def test_an_export_to_a_link_fills_its_target_and_keeps_the_link(tmp_path):
    _store(tmp_path / "s")
    target = tmp_path / "files" / "p.safetensors"
    target.parent.mkdir()
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    assert _run("export", str(tmp_path / "s"), "--step", "1", "-o", str(link))[0] == 0
    assert link.is_symlink()
    with safe_open(str(target), framework="pt") as f:
        assert f.metadata()["step"] == "1"
