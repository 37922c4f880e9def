"""A 2-rank data-parallel loop (no tracekit import) whose rank 1 exits (os._exit) at a chosen point of step K.

DDP's gradient all-reduce by hand (as tests/cli/scripts/signal_train.py does) and LeanSGD: DDP's
constructor and torch.optim.SGD import torch._dynamo (~1.8 CPU-s a rank); the property here is
the peer's death at each point of a step, not DDP's own code.

The points, in the order a step reaches them:
  before_collective  after the forward, before backward() (the gradient all-reduce that follows
                     it is the step's first collective)
  inside_collective  instead of the gradient all-reduce (rank 0 is in it or about to be)
  after_backward     after the gradients are all-reduced, before optimizer.step()
  after_step         after optimizer.step(), before the script's own loss all-reduce
Every rank prints `rank=R step=S stepped` when optimizer.step() has returned, then all-reduces its
loss like a DDP script reporting the global loss and prints `rank=R step=S loss=L`.
"""

import argparse
import os

import torch
import torch.distributed as dist

from lean_sgd import LeanSGD  # torch.optim.SGD's update without importing torch._dynamo

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--die-at", type=int, required=True)
p.add_argument("--point", choices=["before_collective", "inside_collective", "after_backward", "after_step"],
               required=True)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write per line: the ranks share stdout


def die_here(step: int, point: str) -> None:
    if rank == 1 and step == args.die_at and point == args.point:
        say(f"rank={rank} step={step} exiting {point}")
        os._exit(3)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = LeanSGD(model.parameters(), lr=0.1)


def all_reduce_gradients(step: int) -> None:
    """DDP's gradient all-reduce: every gradient in one flat buffer (one bucket), averaged."""
    die_here(step, "inside_collective")
    grads = [q.grad for q in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(dist.get_world_size())
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


for step in range(1, args.steps + 1):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    die_here(step, "before_collective")
    loss.backward()
    all_reduce_gradients(step)
    die_here(step, "after_backward")
    opt.step()
    opt.zero_grad()
    say(f"rank={rank} step={step} stepped")
    die_here(step, "after_step")
    total = loss.detach().clone()
    dist.all_reduce(total)
    say(f"rank={rank} step={step} loss={(total / dist.get_world_size()).item()!r}")
