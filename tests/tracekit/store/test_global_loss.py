"""The global loss derived from per-rank local losses and recorded coordinates (no processes).

tracekit/store/global_loss.py is the rule; derived_loss.py reads it from a store and writes it at
finalize. The torchrun tests (tests/e2e/recorders/test_zerocode_torchrun.py, tests/e2e/cli/test_peer_death.py)
check the result against what real scripts all-reduce."""

import json

import jsonschema
import numpy as np
import pytest
import torch

from tracekit import open_store
from tracekit.store import RankWriter, TensorData, create_store, finalize_store
from tracekit.store.derived_loss import derived_losses
from tracekit.schemas import load, part
from tracekit.store.global_loss import combine, derivation_attrs, derive, dp_group, round_bf16

f32 = np.float32


def ddp(rank, world):
    return {"rank": rank, "world_size": world, "dp_degree": world, "dp_rank": rank, "tp_degree": 1, "tp_rank": 0,
            "meshes": []}


def mesh(rank, world, names, shape, coordinate, tp_rank=0):
    return {**ddp(rank, world), "tp_rank": tp_rank,
            "meshes": [{"dim_names": names, "shape": shape, "coordinate": coordinate, "device_type": "cpu"}]}


def test_ddp_mean_is_the_all_reduce_sum_then_divide_in_float32():
    a, b = f32(0.1234567), f32(2.7182817)
    got, why = derive({0: {1: a}, 1: {1: b}}, {0: ddp(0, 2), 1: ddp(1, 2)})
    assert not why
    want = (torch.tensor(b) + torch.tensor(a)) / 2  # what the script's all_reduce(SUM) / world computes
    assert got[0][1].dtype == np.float32 and got[0][1].tobytes() == want.numpy().tobytes() == got[1][1].tobytes()


def test_ranks_are_added_from_the_highest_down_as_gloo_adds_them():
    values = [f32(1e8), f32(1.0), f32(-1e8), f32(1.0)]  # the order of the additions shows in the result
    got = combine(list(enumerate(values)), "sum")
    highest_first = ((values[3] + values[2]) + values[1]) + values[0]
    lowest_first = ((values[0] + values[1]) + values[2]) + values[3]
    assert highest_first != lowest_first
    assert got == highest_first


def test_tensor_parallel_ranks_are_never_combined():
    # tp only (a mesh with no dp dim): each rank's loss is already the whole batch's
    coords = {r: mesh(r, 2, ["tp"], [2], [r], tp_rank=r) for r in range(2)}
    got, why = derive({0: {1: f32(3.0)}, 1: {1: f32(3.0)}}, coords)
    assert not why and got[0][1] == got[1][1] == f32(3.0)


def test_a_dp_by_tp_mesh_combines_over_dp_within_each_tp_coordinate():
    # 2 x 2 ("dp", "tp"), rank = 2 * dp + tp: ranks 0 and 2 share tp 0, ranks 1 and 3 tp 1
    coords = {r: mesh(r, 4, ["dp", "tp"], [2, 2], [r // 2, r % 2], tp_rank=r % 2) for r in range(4)}
    local = {0: {1: f32(1.0)}, 2: {1: f32(3.0)}, 1: {1: f32(5.0)}, 3: {1: f32(7.0)}}  # (tp values differ only to tell them apart)
    got, _ = derive(local, coords)
    assert [float(got[r][1]) for r in range(4)] == [2.0, 6.0, 2.0, 6.0]  # not the world's mean, 4.0
    got, _ = derive(local, coords, "sum")
    assert [float(got[r][1]) for r in range(4)] == [4.0, 12.0, 4.0, 12.0]


def test_hsdp_combines_over_both_dp_dims_and_fsdp2s_unnamed_mesh_is_dp():
    hsdp = {r: mesh(r, 4, ["dp_replicate", "dp_shard"], [2, 2], [r // 2, r % 2]) for r in range(4)}
    assert {dp_group(c) for c in hsdp.values()} == {dp_group(hsdp[0])} and dp_group(hsdp[0]).size == 4
    fsdp = {r: mesh(r, 2, ["dim0"], [2], [r]) for r in range(2)}
    got, _ = derive({0: {1: f32(1.0)}, 1: {1: f32(2.0)}}, fsdp)
    assert got[0][1] == f32(1.5)


def test_a_step_or_a_rank_missing_is_never_guessed():
    coords = {0: ddp(0, 2), 1: ddp(1, 2)}
    got, why = derive({0: {1: f32(1.0), 2: f32(5.0)}, 1: {1: f32(3.0)}}, coords)
    assert list(got[0]) == list(got[1]) == [1]  # step 2: rank 1 never recorded it (it died first)
    got, why = derive({0: {1: f32(1.0)}}, {0: ddp(0, 2)})  # rank 1 recorded nothing (--ranks 0)
    assert not got and "only rank(s) 0 recorded a local loss" in why[0]


def test_bfloat16_is_rounded_after_each_operation_as_torch_computes_it():
    xs = [torch.tensor(v, dtype=torch.bfloat16) for v in (1.0078125, 3.3, 0.0117, 7.77)]
    want = ((xs[3] + xs[2]) + xs[1]) + xs[0]
    want = (want / 4).float().numpy()
    got, _ = derive({r: {1: x.float().numpy()} for r, x in enumerate(xs)}, {r: ddp(r, 4) for r in range(4)},
                    dtypes={r: "bfloat16" for r in range(4)})
    assert got[0][1].tobytes() == want.tobytes()
    assert round_bf16(f32(1.0) + f32(2 ** -9)) == f32(1.0)  # a tie: to even


def write_zero_code_store(path, local, coords, reduction="mean", dtype=np.float32, format_version=None, asked=None):
    """asked: the kinds `tracekit record` was asked for (its record_config); None: not said."""
    meta = {"launcher": "test", **({"record_config": {"kinds": list(asked)}} if asked is not None else {})}
    create_store(str(path), meta, format_version=format_version)
    for r, steps in local.items():
        w = RankWriter(str(path), r, {"coords": coords[r], "run": {}, **derivation_attrs(reduction)})
        for s, v in steps.items():
            w.write(s, "local_loss", [TensorData("local_loss", np.dtype(dtype).name, (), np.asarray(v, dtype=dtype))])
            w.complete_step(s)
        w.close()
    return str(path)


def test_finalize_writes_the_derived_loss_as_each_ranks_loss_kind(tmp_path):
    local = {0: {1: f32(1.0), 2: f32(2.0)}, 1: {1: f32(3.0)}}
    store = write_zero_code_store(tmp_path / "s", local, {0: ddp(0, 2), 1: ddp(1, 2)})
    assert "loss" not in open_store(store).rank(0).kinds
    assert derived_losses(open_store(store))[0] == {0: {1: f32(2.0)}, 1: {1: f32(2.0)}}  # read before finalize
    finalize_store(store, 1)
    s = open_store(store)
    for r in (0, 1):
        assert s.rank(r).steps("loss") == [1] and s.rank(r).read("loss", 1, "loss") == f32(2.0)
    assert s.rank(0).completed_steps == [1, 2]  # rank 0 keeps its step 2, which has no global loss
    assert "loss_not_derived" not in s.run["ranks"]["0"]


def test_finalize_says_why_a_rank_has_no_loss_and_leaves_recorded_losses_alone(tmp_path):
    store = write_zero_code_store(tmp_path / "s", {0: {1: f32(1.0)}}, {0: ddp(0, 2)})
    finalize_store(store, 0)
    s = open_store(store)
    assert "loss" not in s.rank(0).kinds
    assert "only rank(s) 0 recorded a local loss" in s.run["ranks"]["0"]["loss_not_derived"]
    schema = load("store-metadata")  # both new attributes are in the store's JSON Schema
    jsonschema.validate(s.run["ranks"], schema["$defs"]["root"]["properties"]["ranks"])
    jsonschema.validate(json.load(open(tmp_path / "s" / "rank_0" / "zarr.json"))["attributes"], part(schema, "rank"))

    from tracekit.testing import write_store  # a Recorder-made store: its loss is its own
    plain = write_store(tmp_path / "p", {0: {1: {"loss": {"loss": f32(7.0)}, "local_loss": {"local_loss": f32(1.0)}}}})
    finalize_store(plain, 0)
    assert open_store(plain).rank(0).read("loss", 1, "loss") == f32(7.0)


def test_an_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="mean, sum"):
        derivation_attrs("max")


def test_tracekit_loss_derives_the_loss_of_a_store_never_finalized(tmp_path):
    from tracekit.inspect.loss import DERIVED, loss_table

    local = {0: {1: f32(1.0), 2: f32(2.0)}, 1: {1: f32(3.0), 2: f32(5.0)}}
    store = write_zero_code_store(tmp_path / "s", local, {0: ddp(0, 2), 1: ddp(1, 2)})  # its launcher died
    table = loss_table([store])
    assert table["runs"][0]["kind"] == DERIVED
    assert [(r["step"], r["s"]) for r in table["rows"]] == [(1, 2.0), (2, 3.5)]  # not rank 0's local 1.0, 2.0
    finalize_store(store, 0)
    table = loss_table([store])
    assert table["runs"][0]["kind"] == "loss" and [r["s"] for r in table["rows"]] == [2.0, 3.5]


@pytest.mark.parametrize("where", ["format 1", "bucket"])
def test_finalize_derives_the_loss_in_a_format_1_store_and_in_a_bucket(tmp_path, where, request):
    store = str(tmp_path / "s") if where == "format 1" else request.getfixturevalue("s3").url("runs/zero")
    local = {0: {1: f32(1.0)}, 1: {1: f32(2.0)}}
    write_zero_code_store(store, local, {0: ddp(0, 2), 1: ddp(1, 2)}, format_version=1 if where == "format 1" else None)
    finalize_store(store, 0)
    s = open_store(store)
    assert [float(s.rank(r).read("loss", 1, "loss")) for r in (0, 1)] == [1.5, 1.5]


def test_local_losses_recorded_only_to_derive_from_go_once_each_has_served(tmp_path):
    coords = {0: ddp(0, 2), 1: ddp(1, 2)}
    default = ("outputs", "loss", "gradients", "parameters", "deltas")
    complete = {0: {1: f32(1.0), 2: f32(2.0)}, 1: {1: f32(3.0), 2: f32(4.0)}}
    store = write_zero_code_store(tmp_path / "a", complete, coords, asked=default)
    finalize_store(store, 0)
    s = open_store(store)
    assert [s.rank(r).kinds for r in (0, 1)] == [["loss"], ["loss"]]  # what was asked for, as a Recorder's store
    assert s.rank(0).steps("loss") == [1, 2] and s.rank(0).read("loss", 2, "loss") == f32(3.0)

    store = write_zero_code_store(tmp_path / "b", complete, coords, asked=(*default, "local_loss"))
    finalize_store(store, 0)
    assert open_store(store).rank(0).kinds == ["loss", "local_loss"]  # asked for: kept

    died = {0: {1: f32(1.0), 2: f32(2.0)}, 1: {1: f32(3.0)}}  # rank 1 died before recording step 2
    store = write_zero_code_store(tmp_path / "c", died, coords, asked=default)
    finalize_store(store, 0)
    s = open_store(store)
    assert s.rank(0).steps("local_loss") == [1, 2]  # rank 0's step 2 has no global loss: its local one stays
    assert "local_loss" not in s.rank(1).kinds


def test_finalize_writes_the_derived_rows_at_once_as_a_rank_writes_them_one_by_one(tmp_path):
    """Finalize stores each rank's derived losses in one go (writer.append_rows); the rows are the
    ones a rank writing its loss step by step makes, sealed to the rank, and the store verifies."""
    import zarr

    from tracekit.store.verify import verify_store

    steps = range(1, 7)
    local = {r: {s: f32(r + s / 8) for s in steps} for r in range(3)}
    store = write_zero_code_store(tmp_path / "bulk", local, {r: ddp(r, 3) for r in range(3)})
    finalize_store(store, 0)
    assert verify_store(store).ok
    derived = {s: combine([(r, local[r][s]) for r in range(3)], "mean") for s in steps}
    per_row = str(tmp_path / "rows")
    create_store(per_row, {"launcher": "test"})
    w = RankWriter(per_row, 2, {"coords": ddp(2, 3), "run": {}})
    for s in steps:
        w.write(s, "loss", [TensorData("loss", "float32", (), derived[s])])
        w.complete_step(s)
    w.close()
    a, b = (zarr.open_group(p, mode="r")["rank_2/loss"] for p in (store, per_row))
    assert a.attrs.asdict() == b.attrs.asdict()
    for name in ("hash", "finite", "summary"):
        assert a[name][:].tobytes() == b[name][:].tobytes()
