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
  ffn_bf16   from step STEP on, the output of `layers.1.feed_forward`'s last matmul (w2) is rounded
             to bfloat16 and back: one op's result in bfloat16 in a float32 run (samples'
             `--fault op=matmul_bf16`; bench/bench_sensitivity.py --workload titan)
  grad_scale KIND:RANK:STEP:FACTOR: in step STEP, the rank's gradients (its shards under FSDP2) are
             multiplied by FACTOR after backward, before clipping and the optimizer step (samples'
             `--fault grad_scale`; bench/bench_sensitivity.py --workload titan)

Only rank RANK is affected. Parameters, names and call structure stay as they are.

TorchTitan's files are not edited: the runner wraps `Trainer.train_step`, which knows the step
(`self.step`) and the model (`self.model_parts`), and on its first call replaces the faulty
module's forward, the trainer's `loss_fn` or the optimizers' `step` as the faults need.
"""

from __future__ import annotations

import math
import re
import types

KINDS = ("ffn_act", "ffn_bwd", "nan_grad", "loss_scale", "opt_lr", "ffn_bf16", "grad_scale")
MODULE = "layers.1.feed_forward"  # ffn_act's
BWD_MODULE = "layers.5.feed_forward"  # ffn_bwd's
FACTOR = 1.5  # loss_scale's and opt_lr's
_SPEC = re.compile(r"^(?P<kind>[a-z_0-9]+):(?P<rank>\d+):(?P<step>\d+)(:(?P<factor>[0-9.eE+-]+))?$")


def parse(spec: str) -> tuple[str, int, int, float | None]:
    """(kind, rank, step, factor) of 'KIND:RANK:STEP' (factor None) or 'grad_scale:RANK:STEP:FACTOR';
    ValueError naming the problem otherwise."""
    m = _SPEC.match(spec)
    expected = (f"KIND:RANK:STEP (KIND one of {', '.join(k for k in KINDS if k != 'grad_scale')}) or "
                "grad_scale:RANK:STEP:FACTOR; STEP >= 1")
    if not m or m["kind"] not in KINDS or int(m["step"]) < 1 or (m["factor"] is None) != (m["kind"] != "grad_scale"):
        raise ValueError(f"--fault {spec!r}: expected {expected}")
    try:
        factor = None if m["factor"] is None else float(m["factor"])
    except ValueError:
        raise ValueError(f"--fault {spec!r}: expected {expected}") from None
    return m["kind"], int(m["rank"]), int(m["step"]), factor


def _target(model, path: str):
    """The fault's module; activation checkpointing may wrap the block it sits in."""
    for name, module in model.named_modules():
        if name.replace("_checkpoint_wrapped_module.", "") == path:
            return module
    raise RuntimeError(f"--fault: the model has no module {path}")


def _faulty_forward(is_on):
    """layers.1.feed_forward's forward under ffn_act (gelu for silu) and ffn_bf16 (w2's output
    rounded to bfloat16): is_on(kind) says which holds now."""
    import torch
    import torch.nn.functional as F

    def forward(self, x):
        act = F.gelu if is_on("ffn_act") else F.silu  # silu is what TorchTitan's FeedForward computes
        out = self.w2(act(self.w1(x)) * self.w3(x))
        return out.to(torch.bfloat16).to(out.dtype) if is_on("ffn_bf16") else out

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


def _scaled_gradients(original, faults, state):
    """Trainer.forward_backward_step, then grad_scale's FACTOR on the rank's gradients in its step."""
    import torch

    def forward_backward_step(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        for kind, rank, step, factor in faults:
            if kind == "grad_scale" and state["rank"] == rank and state["step"] == step:
                with torch.no_grad():
                    for part in self.model_parts:
                        for p in part.parameters():
                            if p.grad is not None:
                                p.grad.mul_(factor)
        return loss

    return forward_backward_step


def install(faults: list[tuple[str, int, int, float | None]]) -> None:
    """Wrap TorchTitan's Trainer.train_step so each fault applies on its rank and step."""
    import torch.distributed as dist
    from torchtitan.trainer import Trainer

    kinds = {fault[0] for fault in faults}
    state = {"step": 0, "rank": -1}

    def is_on(kind: str) -> bool:
        # ffn_act and ffn_bf16 hold from their step on (as samples' op faults do), the others in their step only
        return any(k == kind and state["rank"] == rank
                   and (state["step"] >= step if kind in ("ffn_act", "ffn_bf16") else state["step"] == step)
                   for k, rank, step, _ in faults)

    original = Trainer.train_step

    def train_step(self, *args, **kwargs):
        if not hasattr(self, "_tracekit_fault"):
            model = self.model_parts[0]
            if kinds & {"ffn_act", "ffn_bf16"}:
                module = _target(model, MODULE)
                module.forward = types.MethodType(_faulty_forward(is_on), module)
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
    if "grad_scale" in kinds:
        Trainer.forward_backward_step = _scaled_gradients(Trainer.forward_backward_step, faults, state)
