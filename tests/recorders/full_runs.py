"""The in-process training that the full-recording tests record, and its check (test_recorder_full, test_recorder_full_objstore)."""

import numpy as np
import torch

from tracekit import open_store


def train(model, opt, rec, steps, grads):
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        rec.observe(loss=loss)
        grads[step] = {n: p.grad.detach().clone().double() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def check_store(path, grads):
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
