"""Typed run and rank metadata (tracekit/store/runmeta.py): parsed once by the store, matching the
schema, damage one StoreError line."""

import dataclasses
import json
import os

import numpy as np
import pytest

from tracekit.errors import StoreError
from tracekit.schemas import load as load_schema
from tracekit.store import finalize_store, open_store
from tracekit.store.precision import POLICY_FIELDS, FsdpPolicy, PrecisionContext
from tracekit.store.runmeta import Mesh, RankCoords, RankMeta, RunMeta, RunSetup
from tracekit.testing import write_store


def _store(path, **kw):
    data = {r: {s: {"gradients": {"w": np.full(3, s, np.float32)}} for s in (1, 2)} for r in range(2)}
    coords = {r: {"rank": r, "local_rank": r, "world_size": 2, "dp_degree": 1, "dp_rank": 0, "tp_degree": 2,
                  "tp_rank": r, "meshes": [{"dim_names": ["tp"], "shape": [2], "coordinate": [r]}]} for r in range(2)}
    return write_store(path, data, coords=coords, run={"device": "cpu"}, **kw)


def test_run_and_rank_metadata_parse_once_and_typed(tmp_path):
    path = _store(tmp_path / "s", meta={"command": ["train.py"], "replay_of": "runs/ref"})
    store = open_store(path)
    run = store.run_meta
    assert run is store.run_meta  # parsed once
    assert run.command == ("train.py",) and run.replay_of == "runs/ref" and not run.finished and run.exit_status is None
    finalize_store(path, 0)
    run = open_store(path).run_meta
    assert run.finished and run.exit_status == 0
    meta = store.rank(1).meta
    assert meta is store.rank(1).meta
    assert meta.run["device"] == "cpu" and meta.fallback_ops is None and not meta.is_replay
    c = meta.coords
    assert (c.rank, c.tp_rank, c.dp_rank, c.world_size) == (1, 1, 0, 2)
    assert c.meshes == (Mesh(("tp",), (2,), (1,)),) and c.positions() == {"dp_rank": 0, "tp_rank": 1}
    assert c.data_parallel == (1, 0) and c.to_attrs()["tp_degree"] == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rank = 3  # frozen: what the store parsed is what every reader sees


def test_fields_match_the_schema():
    defs = load_schema("store-metadata")["$defs"]
    coords = set(defs["coords"]["properties"])
    assert {f.name for f in dataclasses.fields(RankCoords)} - {"integers", "attrs"} <= coords
    rank = set(defs["rank"]["properties"])
    assert {f.name for f in dataclasses.fields(RankMeta)} - {"replayed_steps", "is_replay"} <= rank
    assert "replayed_steps" in defs["rank"]["properties"]["replay"]["properties"]
    root = set(defs["root"]["properties"])
    assert {f.name for f in dataclasses.fields(RunMeta)} - {"finished", "launcherless", "writers_outlived_launcher"} <= root
    assert {f.name for f in dataclasses.fields(RunSetup)} <= set(defs["run"]["properties"])
    precision = defs["precision"]["properties"]
    assert {f.name for f in dataclasses.fields(PrecisionContext)} == set(precision)
    policy = set(precision["fsdp"]["additionalProperties"]["properties"])
    assert {f.name for f in dataclasses.fields(FsdpPolicy)} == policy == set(POLICY_FIELDS)


def test_run_setup_and_precision_policies_are_typed(tmp_path):
    store = open_store(_store(tmp_path / "s"))
    assert store.setup == RunSetup("cpu", None, None, None) and store.setup.known() == {"device": "cpu"}
    ctx = PrecisionContext.from_attrs({"fsdp": {"layers.0": {"param_dtype": "bfloat16"}},
                                       "flags": {"cuda_matmul_allow_tf32": True}}, "rank 0")
    assert ctx.policies == {"layers.0": FsdpPolicy(param_dtype="bfloat16")} and ctx.cuda_tf32_matmuls
    assert ctx.to_attrs()["fsdp"] == {"layers.0": {"param_dtype": "bfloat16", "reduce_dtype": None, "output_dtype": None}}


@pytest.mark.parametrize("where,value", [("meshes", "not a list"), ("meshes", [3])])
def test_malformed_coordinates_are_one_store_error(tmp_path, where, value):
    path = _store(tmp_path / "s")
    meta_file = os.path.join(path, "rank_1", "zarr.json")
    with open(meta_file) as f:
        doc = json.load(f)
    doc["attributes"]["coords"][where] = value
    with open(meta_file, "w") as f:
        json.dump(doc, f)
    store = open_store(path)
    assert store.rank(0).meta.coords.rank == 0  # the other ranks stay readable
    with pytest.raises(StoreError, match=r"rank 1 has malformed metadata"):
        store.rank(1).meta
