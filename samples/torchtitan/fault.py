"""Planted faults for the TorchTitan runner (`--fault KIND:RANK:STEP[:FACTOR]`):

  ffn_act:RANK:STEP              on rank RANK, from step STEP on, `layers.1.feed_forward` computes
                                 gelu where SwiGLU computes silu (samples' `--fault op=act`)
  ffn_bf16:RANK:STEP             on rank RANK, from step STEP on, the output of that module's last
                                 matmul (w2) is rounded to bfloat16 and back: one op's result in
                                 bfloat16 in a float32 run (samples' `--fault op=matmul_bf16`)
  grad_scale:RANK:STEP:FACTOR    on rank RANK, in step STEP only, its gradients (its shards under
                                 FSDP2) are multiplied by FACTOR after backward, before clipping and
                                 the optimizer step (samples' `--fault grad_scale`)

Its parameters, names and call structure stay as they are. `tracekit diff` of a traced ffn_act
step must name rank RANK, that module and `aten.gelu` (tests/e2e/samples/test_torchtitan_locate.py).

TorchTitan's files are not edited: the runner wraps `Trainer.train_step`, which knows the step
(`self.step`) and the model (`self.model_parts`), and replaces the module's forward on first call;
grad_scale wraps `Trainer.forward_backward_step` (the gradients exist once it returns).
"""

from __future__ import annotations

import re
import types

KINDS = ("ffn_act", "ffn_bf16", "grad_scale")
MODULE = "layers.1.feed_forward"
_SPEC = re.compile(r"^(?P<kind>[a-z_0-9]+):(?P<rank>\d+):(?P<step>\d+)(:(?P<factor>[0-9.eE+-]+))?$")


def parse(spec: str) -> tuple[str, int, int, float | None]:
    """(kind, rank, step, factor) of 'KIND:RANK:STEP' or 'grad_scale:RANK:STEP:FACTOR'; ValueError
    naming the problem otherwise."""
    m = _SPEC.match(spec)
    expected = "ffn_act:RANK:STEP, ffn_bf16:RANK:STEP or grad_scale:RANK:STEP:FACTOR (STEP >= 1)"
    if not m or m["kind"] not in KINDS or int(m["step"]) < 1 or (m["factor"] is None) != (m["kind"] != "grad_scale"):
        raise ValueError(f"--fault {spec!r}: expected {expected}")
    try:
        factor = None if m["factor"] is None else float(m["factor"])
    except ValueError:
        raise ValueError(f"--fault {spec!r}: expected {expected}") from None
    return m["kind"], int(m["rank"]), int(m["step"]), factor


def _target(model):
    """The fault's module; activation checkpointing may wrap the block it sits in."""
    for name, module in model.named_modules():
        if name.replace("_checkpoint_wrapped_module.", "") == MODULE:
            return module
    raise RuntimeError(f"--fault: the model has no module {MODULE}")


def _faulty_forward(kind: str, is_on):
    import torch
    import torch.nn.functional as F

    def forward(self, x):
        on = is_on()
        act = F.gelu if on and kind == "ffn_act" else F.silu  # silu is what TorchTitan's FeedForward computes
        out = self.w2(act(self.w1(x)) * self.w3(x))
        if on and kind == "ffn_bf16":
            return out.to(torch.bfloat16).to(out.dtype)
        return out

    return forward


def install(kind: str, rank: int, step: int, factor: float | None = None) -> None:
    """Wrap TorchTitan's Trainer so the fault applies on RANK from STEP on (grad_scale: at STEP only)."""
    import torch
    import torch.distributed as dist
    from torchtitan.trainer import Trainer

    if kind == "grad_scale":
        original_fb = Trainer.forward_backward_step

        def forward_backward_step(self, *args, **kwargs):
            loss = original_fb(self, *args, **kwargs)
            if dist.get_rank() == rank and self.step == step:
                with torch.no_grad():
                    for part in self.model_parts:
                        for p in part.parameters():
                            if p.grad is not None:
                                p.grad.mul_(factor)
            return loss

        Trainer.forward_backward_step = forward_backward_step
        return

    state = {"on": False}
    original = Trainer.train_step

    def train_step(self, *args, **kwargs):
        if not hasattr(self, "_tracekit_fault"):
            module = _target(self.model_parts[0])
            module.forward = types.MethodType(_faulty_forward(kind, lambda: state["on"]), module)
            self._tracekit_fault = module
        state["on"] = dist.get_rank() == rank and self.step >= step
        return original(self, *args, **kwargs)

    Trainer.train_step = train_step
