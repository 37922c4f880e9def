"""Each rank all-reduces (SUM, then / world, in float32) N random losses with gloo, as a DDP script
reports its global loss; rank 0 prints how many of them tracekit's derivation
(tracekit/store/global_loss.py) reproduces bit for bit: `derived N of N`."""

import sys

import quick_end  # before torch: ends the process without Python's teardown (the last line)

import numpy as np
import torch
import torch.distributed as dist

from tracekit.store.global_loss import combine

N = int(sys.argv[1])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
values = (torch.rand(N, world, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3).float()
reduced = []
for i in range(N):
    t = values[i, rank].clone()
    dist.all_reduce(t)
    reduced.append((t / world).numpy())
if rank == 0:
    same = sum(combine([(r, values[i, r].numpy()) for r in range(world)], "mean").tobytes() == reduced[i].tobytes()
               for i in range(N))
    print(f"derived {same} of {N}", flush=True)
dist.destroy_process_group()
sys.exit(quick_end.ending(0))
