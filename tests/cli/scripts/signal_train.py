"""A training loop for the signal and crash tests: stops at a chosen point for a signal to land.

Prints `pid PID`, then `rank=R step=S` once step S is over (optimizer.step() returned), so a test
knows exactly which steps completed before it sent anything. --stop-at K --stop {between,mid}
pauses after step K is over, or in step K after backward() (before the update); --stop exit
prints `flushing` after the last step, when the exit flush begins. --crash {exit,raise} ends the
process there instead (os._exit, or an exception). --mode zero uses no tracekit at all (record it
zero-code); explicit uses tracekit's Recorder.
"""

import argparse
import contextlib
import os
import select
import signal
import sys
import time

import torch
import torch.distributed as dist

from lean_sgd import LeanSGD  # torch.optim.SGD's update without importing torch._dynamo

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--mode", choices=["zero", "explicit"], default="zero")
p.add_argument("--stop-at", type=int, default=None)
p.add_argument("--stop", choices=["between", "mid", "exit"], default=None)
p.add_argument("--crash", choices=["exit", "raise"], default=None, help="crash at the stop instead of pausing")
p.add_argument("--dim", type=int, default=16)
p.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute per step")
args = p.parse_args()

if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if dist.is_initialized() else 0


def say(line: str) -> None:
    """One write per line: under torchrun the ranks share stdout, and print() under
    PYTHONUNBUFFERED writes the text and its newline separately, so two ranks' lines could mix."""
    os.write(1, (line + "\n").encode())


say(f"pid {os.getpid()}")


# Woken by any signal, even one that lands before we start waiting. signal.pause() is not: the test
# sends its signal the moment it reads our line, and one that arrives after Python's last check for
# pending signals but before pause() blocks runs its handler only at the *next* signal, which never
# comes (the job hung until the test's watchdog killed it). The C-level handler writes a byte to the
# wakeup fd at once, so select() returns and the Python handler runs right after.
_wake_r, _wake_w = os.pipe()
os.set_blocking(_wake_w, False)
signal.set_wakeup_fd(_wake_w)


def stop(where):
    say(f"rank={rank} {where}")
    if args.crash == "exit":
        os._exit(3)
    if args.crash == "raise":
        raise RuntimeError("crash")
    while True:  # until the test's signal kills us (our handlers re-raise it)
        select.select([_wake_r], [], [])
        os.read(_wake_r, 512)


def train(make_recorder=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.dim, args.dim), torch.nn.Tanh(), torch.nn.Linear(args.dim, 4))
    opt = LeanSGD(model.parameters(), lr=0.01)
    recording = make_recorder(model, opt, run_info={"mode": "signal"}) if make_recorder else contextlib.nullcontext()
    with recording as rec:
        for step in range(1, args.steps + 1):
            x = torch.full((8, args.dim), float(step) / args.steps)
            out = model(x)
            loss = out.square().mean()
            loss.backward()
            if dist.is_initialized():  # DDP's gradient all-reduce, by hand: DDP's constructor imports torch._dynamo
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad.div_(dist.get_world_size())
            if args.stop == "mid" and step == args.stop_at:
                stop(f"mid {step}")
            if rec is not None:
                rec.observe(output=out, loss=loss)
            time.sleep(args.step_time)
            opt.step()
            opt.zero_grad()
            say(f"rank={rank} step={step}")
            if args.stop == "between" and step == args.stop_at:
                stop(f"between {step}")
        if args.stop == "exit":
            say(f"rank={rank} flushing")  # the recorder's close (the exit flush) is next
            if args.crash:
                stop("exit")


if args.mode == "explicit":
    from tracekit.recorders import Recorder

    train(Recorder)
else:
    train()
