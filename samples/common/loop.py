"""The training loop body shared by samples/tutorial/train.py and samples/plain/train.py.

A step is split where a recorder has to look: forward_backward() (loss, backward, gradient sync
and gradient checks) returns the output and global loss to observe, then optimizer_step() steps,
checks that something changed, and clears the gradients.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from .config import LOW_PRECISIONS, TrainConfig
from .data import GLOBAL_BATCH, batch_slice, global_batch
from .errors import WorkloadError
from .model import build_model
from .op_faults import FaultSwitch, install_op_fault
from .parallel_model import ParallelModel
from .parallelize import parallelize
from .runtime import Runtime, start, stop


def say(line: str) -> None:
    """Print one line in a single write, so lines of ranks sharing a terminal never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly DTensor) tensor that lives on this rank."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from every rank's shard if it is a DTensor."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@dataclass(frozen=True)
class StepResult:
    output: torch.Tensor  # this rank's model output (ddp/fsdp/simplefsdp_tp: its batch slice)
    local_loss: torch.Tensor  # this rank's mean loss (after any planted loss_scale fault)
    global_loss: torch.Tensor  # mean loss over the global batch: what is reported and recorded


class Workload:
    """One rank's run: the parallelized model, its optimizer and the per-step work."""

    def __init__(self, config: TrainConfig, runtime: Runtime):
        self.config = config
        self.runtime = runtime
        self.dtype = getattr(torch, config.dtype)
        self._check_batch_split()
        model = build_model(config.seed, self.dtype, bias=config.bias)
        model.to(runtime.device)
        self.op_faults = [FaultSwitch(*op) for op in config.faults.op]
        for switch in self.op_faults:
            install_op_fault(model, switch)
        if config.autocast:
            # outputs in float32 whatever autocast computed them in: the same dtype as a float32 reference's
            model.register_forward_hook(lambda module, args, out: out.float())
        self.parallel: ParallelModel = parallelize(
            config.parallelism, model, runtime, tp=config.tp, compile_backend=config.compile_backend,
            mixed_precision=LOW_PRECISIONS.get(config.mixed_precision),
        )
        # Planted fault lr_scale: the optimizer itself runs with a wrong learning rate.
        self.optimizer = torch.optim.SGD(
            self.parallel.named_module.parameters(), lr=config.lr * config.faults.lr_scale, momentum=0.0
        )

    @property
    def named_model(self) -> torch.nn.Module:
        """The model to hand a recorder: its parameter names are the same in every mode."""
        return self.parallel.named_module

    def _check_batch_split(self) -> None:
        world, config = self.runtime.world_size, self.config
        if config.parallelism == "simplefsdp_tp" and world % config.tp:
            raise WorkloadError(f"simplefsdp_tp needs the world size ({world}) divisible by --tp ({config.tp})")
        dp = {"ddp": world, "fsdp": world, "tp": 1, "simplefsdp_tp": world // (config.tp or 1)}[config.parallelism]
        if GLOBAL_BATCH % dp:
            raise WorkloadError(
                f"the global batch of {GLOBAL_BATCH} samples does not split over {dp} data-parallel ranks"
            )

    def local_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(local_tensor(p).shape) for name, p in self.named_model.named_parameters()}

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = global_batch(step, self.dtype)
        dp_degree, dp_rank = self.parallel.dp_degree, self.parallel.dp_rank
        if step in self.config.faults.swap_data and dp_rank < 2 <= dp_degree:
            dp_rank = 1 - dp_rank  # planted fault swap_data: ranks 0 and 1 take each other's slice
        inputs, targets = batch_slice(inputs, dp_rank, dp_degree), batch_slice(targets, dp_rank, dp_degree)
        return inputs.to(self.runtime.device), targets.to(self.runtime.device)

    def forward_backward(self, step: int) -> StepResult:
        faults, rank = self.config.faults, self.runtime.rank
        if faults.crash_at(rank, step):
            _crash(faults.crash_at(rank, step), rank, step)
        inputs, targets = self.batch(step)
        for switch in self.op_faults:
            switch.update(rank, step)
        if self.config.log_norms:
            self._log_norms(step)
        with torch.autocast(self.runtime.device.type, dtype=getattr(torch, LOW_PRECISIONS.get(self.config.autocast, "bfloat16")),
                            enabled=self.config.autocast is not None):
            output = self.parallel.module(inputs)
            local_loss = F.mse_loss(output, targets) * faults.local_loss_factor(rank, step)
        (local_loss / self.parallel.loss_divisor).backward()
        self._check_gradients(step)
        if faults.wants_nan_grad(rank, step):
            self._plant_nan_gradient()
        if faults.grad_factor(rank, step) != 1.0:
            self._scale_gradients(faults.grad_factor(rank, step))
        if step + 1 in faults.stale_grad:  # planted fault stale_grad: kept for the next step
            self._kept_gradients = [local_tensor(p.grad).detach().clone() for p in self.named_model.parameters()]
        if step in faults.stale_grad and getattr(self, "_kept_gradients", None) is not None:
            with torch.no_grad():
                for p, old in zip(self.named_model.parameters(), self._kept_gradients):
                    local_tensor(p.grad).copy_(old)
        global_loss = self._global_loss(local_loss.detach()) * faults.reported_loss_factor(step)
        return StepResult(output=output, local_loss=local_loss.detach(), global_loss=global_loss)

    def _log_norms(self, step: int) -> None:
        # full_tensor(): an all-gather of each sharded parameter (async functional collectives)
        with torch.no_grad():
            norms = [float(full_tensor(p).norm()) for p in self.named_model.parameters()]
        if self.runtime.rank == 0:
            say(f"step={step} norms=" + ",".join(f"{n:.6g}" for n in norms))

    def _global_loss(self, local_loss: torch.Tensor) -> torch.Tensor:
        group = self.parallel.dp_group
        if group is None:  # tp: the whole batch on every rank, the loss is already global
            return local_loss.clone()
        total = local_loss.clone()
        # SUM then divide: gloo has no AVG reduction.
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        return total / dist.get_world_size(group)

    def _check_gradients(self, step: int) -> None:
        missing = [name for name, p in self.named_model.named_parameters() if p.grad is None]
        if missing:
            raise WorkloadError(f"step {step}: no gradient for parameter(s) {', '.join(missing)}")

    def _plant_nan_gradient(self) -> None:
        first = next(iter(self.named_model.parameters()))
        with torch.no_grad():
            local_tensor(first.grad).view(-1)[0] = math.nan

    def _scale_gradients(self, factor: float) -> None:
        with torch.no_grad():
            for p in self.named_model.parameters():
                local_tensor(p.grad).mul_(factor)

    def optimizer_step(self, step: int) -> None:
        params = list(self.named_model.parameters())
        before = [local_tensor(p).detach().clone() for p in params]
        factor = self.config.faults.last_param_lr_factor(self.runtime.rank, step)
        if factor != 1.0:
            self._step_last_param_with_lr_times(factor)
        else:
            self.optimizer.step()
        changed = any(not torch.equal(old, local_tensor(p).detach()) for old, p in zip(before, params))
        # A rank's shards could all sit still by chance at large world sizes; the run is only
        # broken if no rank changed anything, so agree on that with one small all-reduce.
        flag = torch.tensor([1 if changed else 0], dtype=torch.int32, device=self.runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not flag.item():
            raise WorkloadError(f"step {step}: the optimizer step changed no parameter on any rank")
        self.optimizer.zero_grad()

    def _step_last_param_with_lr_times(self, factor: float) -> None:
        """The planted opt_lr fault: one step in which the last parameter sits in a param group of its
        own with lr * factor. The last one, so the update's ops keep their order: only that
        parameter's update op computes differently (its alpha)."""
        groups = self.optimizer.param_groups
        group = groups[-1]
        last = group["params"][-1]
        group["params"] = group["params"][:-1]
        groups.append({**group, "params": [last], "lr": group["lr"] * factor})
        try:
            self.optimizer.step()
        finally:
            groups.pop()
            group["params"] = [*group["params"], last]

    def report(self, step: int, result: StepResult) -> None:
        loss = result.global_loss.item()
        say(f"step={step}/{self.config.steps} training=completed rank={self.runtime.rank} loss={loss!r}")

    def finish(self) -> None:
        say(f"PASS rank={self.runtime.rank} mode={self.config.parallelism} world_size={self.runtime.world_size}")


def _crash(how: str, rank: int, step: int) -> None:
    """The planted crash fault: a rank that stops for good in the middle of the run."""
    if how == "raise":
        raise RuntimeError(f"planted crash on rank {rank} at step {step}")
    sys.stdout.flush()
    sys.stderr.flush()
    if how == "exit":
        os._exit(3)  # no cleanup, no exit hooks: like a C extension calling exit()
    os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer


def _train_once(config: TrainConfig, runtime: Runtime, train: Callable[[Workload], None]) -> None:
    workload = Workload(config, runtime)
    shapes = " ".join(f"{name}={'x'.join(map(str, shape))}" for name, shape in workload.local_shapes().items())
    say(f"local_shapes rank={runtime.rank} {shapes}")
    train(workload)
    workload.finish()


def run(config: TrainConfig, train: Callable[[Workload], None]) -> int:
    """Set up this rank, call train(workload), tear down; a WorkloadError becomes one line and exit 1.

    Any other exception propagates with its traceback and skips the teardown: other ranks may be
    waiting in a collective, and torchrun stops them once this rank exits.
    """
    try:
        _train_once(config, start(config), train)
        code = 0
    except WorkloadError as error:
        rank = os.environ.get("RANK", "?")
        sys.stderr.write(f"ERROR rank={rank} mode={config.parallelism}: {error}\n")
        sys.stderr.flush()
        code = 1
    # Out here the workload (model, optimizer, meshes) is gone, with any traceback that held it,
    # so stop() can release the last holders of the process groups before destroying them.
    stop()
    return code
