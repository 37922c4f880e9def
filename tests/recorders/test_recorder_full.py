"""--full through the Recorder (explicit config and the environment zero-code reads): the rank's
writer process keeps the bytes of matching tensors only, and summaries of all."""

import torch

from tracekit import open_store
from tracekit.recorders import RecordConfig, Recorder
from tests.recorders import full_runs


def test_explicit_config_keeps_bytes_of_matching_tensors_only(tmp_path):
    model = full_runs.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grads = {}
    config = RecordConfig(store=str(tmp_path / "s"), full=("parameters:*,loss:*",))
    with Recorder(model, opt, config=config) as rec:
        full_runs.train(model, opt, rec, 2, grads)
    full_runs.check_store(tmp_path / "s", grads)
    assert open_store(tmp_path / "s").rank(0).group.attrs["config"]["full"] == ["parameters:*", "loss:*"]


def test_full_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STORE", str(tmp_path / "s"))
    monkeypatch.setenv("TRACEKIT_FULL", "parameters:*\nloss:*")
    model = full_runs.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grads = {}
    with Recorder(model, opt) as rec:
        full_runs.train(model, opt, rec, 2, grads)
    full_runs.check_store(tmp_path / "s", grads)
