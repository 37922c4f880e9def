"""Issue 39, read side: `tracekit verify`'s metadata pass. Ranks listed vs present, completed steps
vs data, step lists vs rows: each disagreement is a named problem (exit 2), and `show` does not
count a completed step that holds no data."""

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.store.finalize import finalize_store
from tracekit.testing import write_store


def _data(steps=10):
    return {r: {s: {"gradients": {"w": np.full(3, s + r, np.float32)}, "loss": {"loss": np.float32(s)}}
                for s in range(1, steps + 1)} for r in range(2)}


@pytest.fixture(scope="module")
def finalized(tmp_path_factory):
    path = write_store(tmp_path_factory.mktemp("fin") / "s", _data(), meta={"launcher": "tracekit record"})
    finalize_store(path, 0)
    return path


@pytest.fixture
def store(finalized, tmp_path):
    return shutil.copytree(finalized, tmp_path / "s")


def _cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


def _problems(path):
    result = _cli("verify", path)
    return result.exit_code, [ln.removeprefix("damaged: ") for ln in result.output.splitlines() if ln.startswith("damaged: ")]


def _edit(path, doc, edit):
    p = os.path.join(path, doc, "zarr.json")
    d = json.load(open(p))
    edit(d)
    json.dump(d, open(p, "w"))


def test_a_clean_finalized_store_has_no_metadata_problem(finalized):
    assert _problems(finalized) == (0, [])


def test_a_deleted_rank_of_a_finalized_store_is_named(store):
    shutil.rmtree(os.path.join(store, "rank_1"))
    code, problems = _problems(store)
    assert code == 2 and problems == ["rank 1: listed in the store's finalized metadata, but its group rank_1/ is missing"]
    shown = _cli("show", store)
    assert shown.exit_code == 0 and "rank 1: listed when the store was finalized, but its group rank_1/ is missing" in shown.output
    assert json.loads(_cli("show", "--json", store).output)["missing_ranks"] == [1]


def test_a_completed_step_without_data_is_named_and_not_shown_as_recorded(store):
    _edit(store, "rank_0", lambda d: d["attributes"]["completed_steps"].append(11))
    code, problems = _problems(store)
    assert code == 2 and "rank 0 step 11: listed as completed, but no kind holds data for it" in problems
    # the launcher wrote 1-10 down at finalization: that disagreement is named too
    assert any(p.startswith("rank 0: its completed_steps (1-11) differ") for p in problems), problems
    shown = _cli("show", store)
    assert shown.exit_code == 0, shown.output
    row = next(ln for ln in shown.output.splitlines() if ln.strip().startswith("0 ") and "finished" in ln)
    assert " 1-10 " in row and "1-11" not in shown.output, shown.output
    assert "step(s) 11 listed as completed hold no data" in shown.output
    doc = json.loads(_cli("show", "--json", store).output)
    assert doc["ranks"][0]["last_step"] == 10 and doc["ranks"][0]["completed_without_data"] == [11]


def test_a_step_list_naming_more_rows_than_the_index_holds_is_named(store):
    def shrink(d):
        d["shape"][0] = 9  # the hash array of rank 1's gradients now claims 9 rows; 10 are listed
    _edit(store, "rank_1/gradients/hash", shrink)
    code, problems = _problems(store)
    assert code == 2 and [p for p in problems if "rank 1 gradients" in p] == ["rank 1 gradients: hash: damaged metadata: it lists 10 rows but holds 9"], problems


def test_an_unfinalized_store_is_not_held_to_a_rank_list(tmp_path):
    path = write_store(tmp_path / "s", _data(3))
    assert _problems(path) == (0, [])
