"""--full through the Recorder (explicit config and the environment zero-code reads): the rank's
writer process keeps the bytes of matching tensors only, and summaries of all."""

import numpy as np
import torch

from tracekit import open_store
from tracekit.recorders import RecordConfig, Recorder


def _train(model, opt, rec, steps, grads):
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        rec.observe(loss=loss)
        grads[step] = {n: p.grad.detach().clone().double() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _check(path, grads):
    view = open_store(path).rank(0)
    assert view.completed_steps == [1, 2]
    assert all(t.keeps_bytes for t in view.tensors("parameters"))
    assert not any(t.keeps_bytes for t in view.tensors("gradients"))
    for step, by_name in grads.items():
        sums = view.summaries("gradients", step)
        for name, g in by_name.items():
            expected = [g.min().item(), g.max().item(), g.mean().item(), g.norm().item(), 0, 0, 0]
            np.testing.assert_allclose(sums[name], expected, rtol=1e-9, atol=1e-12)
    assert view.read("parameters", 2, "0.weight").shape == (16, 8)


def test_explicit_config_keeps_bytes_of_matching_tensors_only(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grads = {}
    config = RecordConfig(store=str(tmp_path / "s"), full=("parameters:*,loss:*",))
    with Recorder(model, opt, config=config) as rec:
        _train(model, opt, rec, 2, grads)
    _check(tmp_path / "s", grads)
    assert open_store(tmp_path / "s").rank(0).group.attrs["config"]["full"] == ["parameters:*", "loss:*"]


def test_full_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STORE", str(tmp_path / "s"))
    monkeypatch.setenv("TRACEKIT_FULL", "parameters:*\nloss:*")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grads = {}
    with Recorder(model, opt) as rec:
        _train(model, opt, rec, 2, grads)
    _check(tmp_path / "s", grads)
