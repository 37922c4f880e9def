"""A planted forward-op fault for the TorchTitan runner (`--fault ffn_act:RANK:STEP`), the
TorchTitan counterpart of samples' `--fault op=act:RANK:STEP`: on rank RANK, from step STEP on,
`layers.1.feed_forward` computes gelu where SwiGLU computes silu. Its parameters, names and
call structure stay as they are; only that one module's forward changes. `tracekit diff` of a
traced step must name rank RANK, that module and `aten.gelu` (tests/e2e/samples/test_torchtitan_locate.py).

TorchTitan's files are not edited: the runner wraps `Trainer.train_step`, which knows the step
(`self.step`) and the model (`self.model_parts`), and replaces the module's forward on first call.
"""

from __future__ import annotations

import re
import types

KINDS = ("ffn_act",)
MODULE = "layers.1.feed_forward"
_SPEC = re.compile(r"^(?P<kind>[a-z_]+):(?P<rank>\d+):(?P<step>\d+)$")


def parse(spec: str) -> tuple[int, int]:
    """(rank, step) of 'ffn_act:RANK:STEP'; ValueError naming the problem otherwise."""
    m = _SPEC.match(spec)
    if not m or m["kind"] not in KINDS or int(m["step"]) < 1:
        raise ValueError(f"--fault {spec!r}: expected ffn_act:RANK:STEP (STEP >= 1)")
    return int(m["rank"]), int(m["step"])


def _target(model):
    """The fault's module; activation checkpointing may wrap the block it sits in."""
    for name, module in model.named_modules():
        if name.replace("_checkpoint_wrapped_module.", "") == MODULE:
            return module
    raise RuntimeError(f"--fault: the model has no module {MODULE}")


def _faulty_forward(is_on):
    import torch.nn.functional as F

    def forward(self, x):
        act = F.gelu if is_on() else F.silu  # silu is what TorchTitan's FeedForward computes
        return self.w2(act(self.w1(x)) * self.w3(x))

    return forward


def install(rank: int, step: int) -> None:
    """Wrap TorchTitan's Trainer.train_step so the fault applies on RANK from STEP on."""
    import torch.distributed as dist
    from torchtitan.trainer import Trainer

    state = {"on": False}
    original = Trainer.train_step

    def train_step(self, *args, **kwargs):
        if not hasattr(self, "_tracekit_fault"):
            module = _target(self.model_parts[0])
            module.forward = types.MethodType(_faulty_forward(lambda: state["on"]), module)
            self._tracekit_fault = module
        state["on"] = dist.get_rank() == rank and self.step >= step
        return original(self, *args, **kwargs)

    Trainer.train_step = train_step
