"""A 2-rank DDP loop (no tracekit import) whose rank 1 exits (os._exit) at a chosen point of step K.

The points, in the order a step reaches them:
  before_collective  after the forward, before backward() (whose gradient all-reduce is the
                     step's first collective)
  inside_collective  in DDP's communication hook, instead of the gradient all-reduce (rank 0 is
                     in it or about to be)
  after_backward     after backward() (the gradients are all-reduced), before optimizer.step()
  after_step         after optimizer.step(), before the script's own loss all-reduce
Every rank prints `rank=R step=S stepped` when optimizer.step() has returned, then all-reduces its
loss like a DDP script reporting the global loss and prints `rank=R step=S loss=L`.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

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
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0


def hook(state, bucket):
    die_here(step, "inside_collective")
    fut = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


model.register_comm_hook(None, hook)

for step in range(1, args.steps + 1):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    die_here(step, "before_collective")
    loss.backward()
    die_here(step, "after_backward")
    opt.step()
    opt.zero_grad()
    say(f"rank={rank} step={step} stepped")
    die_here(step, "after_step")
    total = loss.detach().clone()
    dist.all_reduce(total)
    say(f"rank={rank} step={step} loss={(total / dist.get_world_size()).item()!r}")
