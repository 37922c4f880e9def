"""The small in-process training that the replay tests record and replay (test_replay, test_replay_objstore)."""

import torch

from tracekit import open_store
from tracekit.recorders import RecordConfig, Recorder
from tracekit.launch.config import parse_kinds


KINDS = parse_kinds("+optimizer_state")
STEPS = 5


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def make_optimizer(name, params):
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


def train_step(model, opt, step, autocast, rec=None):
    x, y = _batch(step)
    # the planted per-step error: a bfloat16 forward, as mixed precision on an accelerator would do
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    loss.backward()
    if rec is not None:
        rec.observe(output=out, loss=loss)
    opt.step()
    opt.zero_grad()


def record_run(store, optimizer="momentum", autocast=False, steps=STEPS, **config):
    model = make_model()
    opt = make_optimizer(optimizer, model.parameters())
    with Recorder(model, opt, config=RecordConfig(store=str(store), kinds=KINDS, **config)) as rec:
        for step in range(1, steps + 1):
            train_step(model, opt, step, autocast, rec)
    return open_store(store).rank(0)
