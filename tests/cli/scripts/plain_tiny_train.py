"""A tiny training loop with no tracekit import, for zero-code recording in one process."""

import argparse
import sys

import quick_end  # before torch: ends the process without Python's teardown (the last line)

import torch

from lean_sgd import LeanSGD  # torch.optim.SGD's update without importing torch._dynamo

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = LeanSGD(model.parameters(), lr=0.1)
for step in range(1, args.steps + 1):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
sys.exit(quick_end.ending(0))  # after the exit handlers: zero-code recording closes its store there
