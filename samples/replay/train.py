"""The reference workload with an optional bfloat16 autocast forward: a small error planted in every step.

    tracekit record -o runs/replay-ref -- torchrun --standalone --nproc-per-node=2 samples/replay/train.py
    tracekit record -o runs/replay-cand -- torchrun ... samples/replay/train.py --autocast bfloat16

The candidate's error compounds step after step; `tracekit record --replay-from runs/replay-ref`
restarts each of its steps from the reference state, which shows that each step's own error is
small and flat (see samples/replay/README.md). The model, data and parallel modes are the shared
ones of samples/common; only the optimizer (momentum SGD by default) and the autocast are added.
"""

import argparse
import os
import sys

# torchrun runs this file as a script: put samples/ first (for `common`) and the repository root
# behind it, so a source checkout's tracekit is importable without installing it.
_SAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _SAMPLES)
sys.path.append(os.path.dirname(_SAMPLES))

from common import quick_exit  # noqa: E402

if __name__ == "__main__":
    quick_exit.arm()  # before torch is imported: the first exit handler registered runs last

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.config import BACKENDS, DEVICES, TrainConfig  # noqa: E402
from common.data import batch_slice, global_batch  # noqa: E402
from common.errors import WorkloadError  # noqa: E402
from common.model import build_model  # noqa: E402
from common.parallelize import parallelize  # noqa: E402
from common.runtime import start, stop  # noqa: E402

from tracekit.recorders import Recorder  # noqa: E402

OPTIMIZERS = ("sgd", "momentum", "adam")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallelism", default="fsdp", choices=("ddp", "fsdp", "tp"))
    parser.add_argument("--device", default="cpu", choices=DEVICES)
    parser.add_argument("--backend", default="gloo", choices=BACKENDS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", default="momentum", choices=OPTIMIZERS,
                        help="momentum (SGD, 0.9) and adam keep state that a true replay restores")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--autocast", default="none", choices=("none", "bfloat16"),
                        help="bfloat16: run the forward under autocast, a small error in every step")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    return args


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "momentum" else 0.0)


def train(args: argparse.Namespace) -> None:
    runtime = start(TrainConfig(parallelism=args.parallelism, device=args.device, backend=args.backend))
    model = build_model(args.seed).to(runtime.device)
    parallel = parallelize(args.parallelism, model, runtime, tp=None, compile_backend=None)
    optimizer = make_optimizer(args.optimizer, parallel.named_module.parameters(), args.lr)
    run_info = {"mode": args.parallelism, "device": args.device, "backend": args.backend, "seed": args.seed,
                "steps": args.steps, "optimizer": args.optimizer, "autocast": args.autocast}
    with Recorder(parallel.named_module, optimizer, run_info=run_info) as recorder:
        for step in range(1, args.steps + 1):
            inputs, targets = global_batch(step)
            inputs = batch_slice(inputs, parallel.dp_rank, parallel.dp_degree).to(runtime.device)
            targets = batch_slice(targets, parallel.dp_rank, parallel.dp_degree).to(runtime.device)
            with torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=args.autocast == "bfloat16"):
                output = parallel.module(inputs)
            loss = F.mse_loss(output.float(), targets)
            (loss / parallel.loss_divisor).backward()
            global_loss = loss.detach().clone()
            if parallel.dp_group is not None:  # SUM then divide: gloo has no AVG
                dist.all_reduce(global_loss, group=parallel.dp_group)
                global_loss /= dist.get_world_size(parallel.dp_group)
            recorder.observe(output=output, loss=global_loss)
            optimizer.step()  # the recorder's hooks capture the step (and, replaying, load the next start)
            optimizer.zero_grad()
            if runtime.rank == 0:
                print(f"step={step}/{args.steps} loss={global_loss.item()!r}", flush=True)


def main() -> int:
    args = parse_args()
    try:
        train(args)
        return 0
    except WorkloadError as error:
        print(f"ERROR rank={os.environ.get('RANK', '?')}: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop()


if __name__ == "__main__":
    sys.exit(quick_exit.ending(main()))  # ends without Python's teardown once the exit handlers ran
