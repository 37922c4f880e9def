"""--loss-reduction auto (recorders/loss_reduction.py): sum where TorchTitan's trainer takes the
optimizer step, an assumed mean elsewhere, an explicit flag always; and how the store says it.
The TorchTitan run that it is right for: tests/e2e/samples/test_torchtitan_dp4.py."""

import numpy as np
import pytest

from tracekit.recorders.loss_reduction import ASSUMED_MEAN, TORCHTITAN, resolve
from tracekit.store.global_loss import derivation_attrs, derivation_line


def test_auto_outside_torchtitans_trainer_assumes_the_mean_and_says_so():
    assert resolve("auto") == ("mean", ASSUMED_MEAN)
    assert "assumed" in ASSUMED_MEAN


def test_auto_inside_torchtitans_train_step_is_the_sum_and_an_explicit_flag_wins():
    trainer = pytest.importorskip("torchtitan.trainer").Trainer
    me = trainer.__new__(trainer)  # never initialized: only its class is looked at

    def train_step(self):  # TorchTitan's loop, as it stands when its optimizer steps
        return optimizer_step()

    def optimizer_step():
        return [resolve(asked) for asked in ("auto", "mean", "sum")]

    assert train_step(me) == [("sum", TORCHTITAN), ("mean", "--loss-reduction mean"), ("sum", "--loss-reduction sum")]
    assert train_step(object())[0] == ("mean", ASSUMED_MEAN)  # a train_step of anything else: not TorchTitan's

    def step(self):  # TorchTitan's trainer elsewhere on the stack (building, checkpointing): not its step
        return optimizer_step()

    assert step(me)[0] == ("mean", ASSUMED_MEAN)


def test_the_store_says_how_the_global_loss_was_chosen(tmp_path):
    assert derivation_line(derivation_attrs("sum", TORCHTITAN)) == \
        "global loss = sum over dp ranks (TorchTitan pre-divides by global tokens)"
    assert derivation_line(derivation_attrs("mean")) == "global loss = mean over dp ranks"  # a store from before
    assert derivation_line({}) is None  # a loss recorded, not derived

    from tracekit.inspect.summary import recording_summary, summarize
    from tracekit.store import RankWriter, TensorData, create_store, finalize_store

    store = str(tmp_path / "s")
    create_store(store, {"launcher": "test"})
    for r in (0, 1):
        coords = {"rank": r, "world_size": 2, "dp_degree": 2, "dp_rank": r, "tp_degree": 1, "tp_rank": 0, "meshes": []}
        w = RankWriter(store, r, {"coords": coords, "run": {}, **derivation_attrs("sum", TORCHTITAN)})
        w.write(1, "local_loss", [TensorData("local_loss", "float32", (), np.float32(r + 1))])
        w.complete_step(1)
        w.close()
    finalize_store(store, 0)
    want = "global loss = sum over dp ranks (TorchTitan pre-divides by global tokens)"
    assert recording_summary(store)["loss_derivation"] == summarize(store)["loss_derivation"] == want
