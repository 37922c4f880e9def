"""Planted faults for the TorchTitan runner (`--fault KIND:RANK:STEP`, repeatable), the TorchTitan
counterparts of samples' `--fault` specs, for docs/LOCATE.md's root cause on TorchTitan
(tests/e2e/samples/test_torchtitan_locate.py checks that `tracekit diff` of a traced step names each):

  ffn_act    from step STEP on, `layers.1.feed_forward` computes gelu where SwiGLU computes silu
             (a forward op)
  ffn_bwd    in step STEP, `layers.5.feed_forward` computes silu right in forward, but its backward
             takes sigmoid(x) for silu's derivative (a backward-only op: the forward trace matches).
             The last layer, so its backward runs before any gradient reduction of the step
  nan_grad   in step STEP, after gradient clipping and before the optimizer step, one element of the
             first parameter's local gradient becomes NaN, written through a view (an in-place write)
  loss_scale in step STEP, the rank's loss is multiplied by 1.5 before backward, so what it feeds
             FSDP's gradient reduce-scatter differs (a collective's input)
  opt_lr     in step STEP, the rank's optimizer step runs with 1.5 x the learning rate (an
             optimizer op's argument)

Only rank RANK is affected. Parameters, names and call structure stay as they are.

TorchTitan's files are not edited: the runner wraps `Trainer.train_step`, which knows the step
(`self.step`) and the model (`self.model_parts`), and on its first call replaces the faulty
module's forward, the trainer's `loss_fn` or the optimizers' `step` as the faults need.
"""

from __future__ import annotations

import math
import re
import types

KINDS = ("ffn_act", "ffn_bwd", "nan_grad", "loss_scale", "opt_lr")
MODULE = "layers.1.feed_forward"  # ffn_act's
BWD_MODULE = "layers.5.feed_forward"  # ffn_bwd's
FACTOR = 1.5  # loss_scale's and opt_lr's
_SPEC = re.compile(r"^(?P<kind>[a-z_]+):(?P<rank>\d+):(?P<step>\d+)$")


def parse(spec: str) -> tuple[str, int, int]:
    """(kind, rank, step) of 'KIND:RANK:STEP'; ValueError naming the problem otherwise."""
    m = _SPEC.match(spec)
    if not m or m["kind"] not in KINDS or int(m["step"]) < 1:
        raise ValueError(f"--fault {spec!r}: expected KIND:RANK:STEP (KIND one of {', '.join(KINDS)}; STEP >= 1)")
    return m["kind"], int(m["rank"]), int(m["step"])


def _target(model, path: str):
    """The fault's module; activation checkpointing may wrap the block it sits in."""
    for name, module in model.named_modules():
        if name.replace("_checkpoint_wrapped_module.", "") == path:
            return module
    raise RuntimeError(f"--fault: the model has no module {path}")


def _faulty_forward(is_on):
    import torch.nn.functional as F

    def forward(self, x):
        act = F.gelu if is_on() else F.silu  # silu is what TorchTitan's FeedForward computes
        return self.w2(act(self.w1(x)) * self.w3(x))

    return forward


def _silu_wrong_backward():
    import torch
    import torch.nn.functional as F

    class SiluWrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return F.silu(x)  # the same op as TorchTitan's forward

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * torch.sigmoid(x)  # silu's derivative is s(x) * (1 + x * (1 - s(x)))

    return SiluWrongBackward


def _bwd_forward(is_on):
    import torch.nn.functional as F

    wrong = _silu_wrong_backward()

    def forward(self, x):
        h = self.w1(x)
        return self.w2((wrong.apply(h) if is_on() else F.silu(h)) * self.w3(x))

    return forward


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _optimizer_step(trainer, is_on):
    """The optimizers' step, with nan_grad and opt_lr applied first where they are on."""
    import torch

    original = trainer.optimizers.step

    def step(*args, **kwargs):
        if is_on("nan_grad"):
            first = next(p for m in trainer.model_parts for p in m.parameters() if p.grad is not None)
            with torch.no_grad():
                _local(first.grad).view(-1)[0] = math.nan
        groups = [g for opt in trainer.optimizers.optimizers for g in opt.param_groups] if is_on("opt_lr") else []
        saved = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = g["lr"] * FACTOR
        try:
            return original(*args, **kwargs)
        finally:
            for g, lr in zip(groups, saved):
                g["lr"] = lr

    return step


def _loss_fn(original, is_on):
    def loss_fn(*args, **kwargs):
        loss, rest = original(*args, **kwargs)
        return (loss * FACTOR if is_on("loss_scale") else loss), rest

    return loss_fn


def install(faults: list[tuple[str, int, int]]) -> None:
    """Wrap TorchTitan's Trainer.train_step so each fault applies on its rank and step."""
    import torch.distributed as dist
    from torchtitan.trainer import Trainer

    kinds = {kind for kind, _, _ in faults}
    state = {"step": 0, "rank": -1}

    def is_on(kind: str) -> bool:
        # ffn_act holds from its step on (as samples' op faults do), the others in their step only
        return any(k == kind and state["rank"] == rank
                   and (state["step"] >= step if kind == "ffn_act" else state["step"] == step)
                   for k, rank, step in faults)

    original = Trainer.train_step

    def train_step(self, *args, **kwargs):
        if not hasattr(self, "_tracekit_fault"):
            model = self.model_parts[0]
            if "ffn_act" in kinds:
                module = _target(model, MODULE)
                module.forward = types.MethodType(_faulty_forward(lambda: is_on("ffn_act")), module)
            if "ffn_bwd" in kinds:
                module = _target(model, BWD_MODULE)
                module.forward = types.MethodType(_bwd_forward(lambda: is_on("ffn_bwd")), module)
            if "loss_scale" in kinds:
                self.loss_fn = _loss_fn(self.loss_fn, is_on)
            if kinds & {"nan_grad", "opt_lr"}:
                self.optimizers.step = _optimizer_step(self, is_on)
            self._tracekit_fault = True
        state["step"], state["rank"] = self.step, dist.get_rank()
        return original(self, *args, **kwargs)

    Trainer.train_step = train_step
