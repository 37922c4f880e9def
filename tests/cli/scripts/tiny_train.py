"""A tiny recorded training loop for launcher tests: exits, crashes or signals itself on request."""

import argparse
import os
import signal
import sys
import time

import quick_end  # before torch: ends the process without Python's teardown (sys.exit below)

import torch
import torch.distributed as dist

from lean_sgd import LeanSGD  # torch.optim.SGD's update without importing torch._dynamo

from tracekit.recorders import Recorder

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--die-rank", type=int, default=None)
p.add_argument("--die-step", type=int, default=None)
p.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
p.add_argument("--pause-at", type=int, default=None, help="before this step, wait until --pause-file exists")
p.add_argument("--pause-file", default=None)
args = p.parse_args()
# modules this job never needs (no DTensor, no FSDP, LeanSGD instead of a dynamo-disabled optimizer):
# the recorder must not load them either (~0.8 CPU-s of every such rank's start-up for the first two)
UNUSED = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch._dynamo")

if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo")
rank = dist.get_rank() if dist.is_initialized() else 0
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = LeanSGD(model.parameters(), lr=0.1)
with Recorder(model, opt, run_info={"mode": "tiny"}) as rec:
    for step in range(1, args.steps + 1):
        if rank == args.die_rank and step == args.die_step:
            os.kill(os.getpid(), getattr(signal, f"SIG{args.signal}"))
        if step == args.pause_at:
            rec.flush()  # the steps before the pause are on disk while it lasts
            os.write(1, f"rank={rank} paused\n".encode())  # one write: ranks share stdout
            while not os.path.exists(args.pause_file):
                time.sleep(0.05)
        out = model(torch.full((3, 4), float(step)))
        loss = out.square().mean()
        loss.backward()
        rec.observe(output=out, loss=loss)
        opt.step()
        opt.zero_grad()
        os.write(1, f"rank={rank} step={step}\n".encode())
if os.environ.get("TINY_MODULES_OUT"):  # what this rank loaded that it never used, for an import-hygiene test
    with open(os.environ["TINY_MODULES_OUT"], "w") as f:
        f.write(" ".join(m for m in UNUSED if m in sys.modules))
sys.exit(quick_end.ending(args.exit_code))
