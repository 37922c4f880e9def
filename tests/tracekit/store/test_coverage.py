"""Coverage metadata (tracekit/store/coverage.py): what the recorder writes matches the schema and
reads back equal; a damaged value is one StoreError line, never a traceback or a guess."""

import json
import os
import shutil

import jsonschema
import pytest
import torch

from click.testing import CliRunner

from tracekit import StoreError, open_store
from tracekit.cli.main import main
from tracekit.recorders import Recorder
from tracekit.schemas import load, part
from tracekit.store.coverage import Coverage, LeftOut, Root


def recorded(tmp_path, extra=()):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD([*model.parameters(), *extra], lr=0.1)
    path = str(tmp_path / "s")
    with Recorder(model, optimizer, store=path) as rec:
        model(torch.ones(1, 3)).sum().backward()
        rec.observe(output=None)
        optimizer.step()
    return path


def test_explicit_recorder_states_its_coverage_as_the_schema_says(tmp_path):
    path = recorded(tmp_path, extra=[torch.nn.Parameter(torch.zeros(4))])
    attrs = json.load(open(os.path.join(path, "rank_0", "zarr.json")))["attributes"]["coverage"]
    jsonschema.validate(attrs, part(load("store-metadata"), "coverage"))
    cov = open_store(path).rank(0).coverage
    assert cov.to_attrs() == attrs
    assert (cov.recorded, cov.optimizer_params, cov.output) == (4, 5, "observed")
    assert cov.roots == (Root("Sequential", "", 4),)
    assert cov.left_out == (LeftOut("param4", (4,), "not a parameter of the Sequential given to Recorder"),)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One recording for the damage cases below: each damages a copy of it."""
    return recorded(tmp_path_factory.mktemp("coverage"))


@pytest.mark.parametrize("bad", [
    [1, 2], {"recorded": 1}, {"optimizer_params": 1, "recorded": 2}, {"optimizer_params": -1, "recorded": 0},
    {"optimizer_params": 1, "recorded": 1, "output": "guess"}, {"optimizer_params": 1, "recorded": True},
    {"optimizer_params": 1, "recorded": 0, "left_out": [{"name": "p", "shape": "2x3", "reason": "r"}]},
])
def test_damaged_coverage_is_one_store_error(pristine, tmp_path, bad):
    path = shutil.copytree(pristine, str(tmp_path / "s"))
    meta = os.path.join(path, "rank_0", "zarr.json")
    doc = json.load(open(meta))
    doc["attributes"]["coverage"] = bad
    json.dump(doc, open(meta, "w"))
    with pytest.raises(StoreError, match="rank 0 (has malformed coverage metadata|metadata: 'coverage' is a list)"):
        open_store(path).rank(0).coverage
    with pytest.raises((ValueError, TypeError, KeyError)):
        Coverage.from_attrs(bad)
    shown = CliRunner().invoke(main, ["show", path])
    assert shown.exit_code == 2 and shown.output.startswith("Error: ") and len(shown.output.splitlines()) == 1
