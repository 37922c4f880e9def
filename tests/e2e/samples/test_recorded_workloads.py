"""The four reference workloads recorded end to end through `tracekit record -- torchrun ...`."""

import numpy as np
import pytest

from tracekit import open_store

# mode -> (dp degree, tp degree, output rows per rank, parameter names)
EXPECTED = {
    "ddp": (2, 1, 256, ["0.weight", "0.bias", "2.weight", "2.bias"]),
    "fsdp": (2, 1, 256, ["0.weight", "0.bias", "2.weight", "2.bias"]),
    "tp": (1, 2, 512, ["0.weight", "0.bias", "2.weight", "2.bias"]),
    "simplefsdp_tp": (2, 2, 256, ["0.weight", "2.weight"]),
}
FULL_SHAPES = {"0.weight": (256, 128), "0.bias": (256,), "2.weight": (128, 256), "2.bias": (128,)}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_store_holds_every_rank_step_and_kind_fully_materialized(recorded_sample, mode):
    path, result = recorded_sample(mode)
    dp, tp, rows, names = EXPECTED[mode]
    store = open_store(path)
    assert store.meta["exit_status"] == 0
    assert store.ranks == list(range(dp * tp))
    assert store.run["mode"] == mode and store.run["backend"] == "gloo" and store.run["device"] == "cpu"
    for r in store.ranks:
        rank = store.rank(r)
        assert rank.completed_steps == [1, 2, 3]
        assert rank.kinds == ["outputs", "loss", "gradients", "parameters", "deltas"]
        assert rank.steps("parameters") == [0, 1, 2, 3]
        assert (rank.coords["dp_degree"], rank.coords["tp_degree"]) == (dp, tp)
        assert rank.coords["dp_rank"] * tp + rank.coords["tp_rank"] == r
        for kind in ("gradients", "parameters", "deltas"):
            assert {t.name: t.shape for t in rank.tensors(kind)} == {n: FULL_SHAPES[n] for n in names}
        assert rank.tensor("outputs", "output").shape == (rows, 128)
        # update delta is what the step changed: parameters(k) - parameters(k-1)
        for name in names:
            before, after = rank.read("parameters", 1, name), rank.read("parameters", 2, name)
            np.testing.assert_array_equal(rank.read("deltas", 2, name), after - before)
            assert np.any(rank.read("deltas", 2, name) != 0)
    # fully materialized: every rank holds the same full parameters and the same global loss
    first = store.rank(0)
    for r in store.ranks[1:]:
        for name in names:
            np.testing.assert_array_equal(store.rank(r).read("parameters", 3, name), first.read("parameters", 3, name))
        assert store.rank(r).read("loss", 3, "loss") == first.read("loss", 3, "loss")
    assert result.stdout.count("PASS rank=") == dp * tp


def test_eager_modes_record_the_same_initial_parameters_and_close_losses(recorded_sample):
    stores = {m: open_store(recorded_sample(m)[0]).rank(0) for m in ("ddp", "fsdp", "tp")}
    for name in FULL_SHAPES:
        np.testing.assert_array_equal(stores["ddp"].read("parameters", 0, name), stores["tp"].read("parameters", 0, name))
        np.testing.assert_array_equal(stores["ddp"].read("parameters", 0, name), stores["fsdp"].read("parameters", 0, name))
    for step in (1, 2, 3):
        losses = [float(s.read("loss", step, "loss")) for s in stores.values()]
        np.testing.assert_allclose(losses, losses[0], rtol=1e-5)
