"""Planted op faults (--fault op=KIND:RANK:STEP[:LAST]): one op of the model computed wrongly on one
rank from step STEP on (to step LAST if given), the kind of fault a device port produces. The
root-cause search of `tracekit diff` must name the op and its module (tests/tracekit/compare/test_root_cause_faults.py).

  act          module 1 (the ReLU) computes leaky_relu(x, 0.01): a slightly wrong activation
  matmul_bf16  module 0 (the first Linear) computes its matmul in bfloat16 (inputs cast, output cast back)
  reduce_order module 2 (the second Linear) sums its inner products in reversed order (inputs flipped
               along the reduced dimension): the same math, rounded differently
  roll_rows    module 1 (the ReLU) returns its rows rolled by one (a layout bug): every summary of its
               output (min, max, mean, L2) is unchanged, so only --trace-full bytes can place it
  bwd_bf16     module 1 (the ReLU) is right in forward, but its backward rounds the gradient it
               passes on to bfloat16 (a backward-only fault: the forward trace matches)

The module's parameters, names and call structure stay as they are; only its forward changes.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

OP_FAULTS = ("act", "matmul_bf16", "reduce_order", "roll_rows", "bwd_bf16")
_MODULE_OF = {"act": 1, "matmul_bf16": 0, "reduce_order": 2, "roll_rows": 1, "bwd_bf16": 1}


class FaultSwitch:
    """On while the planted fault applies (this rank, from its step on, to `last` if given); the loop
    sets it each step."""

    def __init__(self, kind: str, rank: int, step: int, last: int | None = None):
        self.kind, self.rank, self.step, self.last = kind, rank, step, last
        self.on = False

    def update(self, rank: int, step: int) -> None:
        self.on = rank == self.rank and step >= self.step and (self.last is None or step <= self.last)


def _act(switch: FaultSwitch, original):
    def forward(self, x):
        if switch.on:
            return F.leaky_relu(x, 0.01)
        return original(x)
    return forward


def _matmul_bf16(switch: FaultSwitch, original):
    def forward(self, x):
        if switch.on:
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return F.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16), bias).to(x.dtype)
        return original(x)
    return forward


def _reduce_order(switch: FaultSwitch, original):
    def forward(self, x):
        if switch.on:
            return F.linear(x.flip(-1), self.weight.flip(-1), self.bias)
        return original(x)
    return forward


def _roll_rows(switch: FaultSwitch, original):
    def forward(self, x):
        if switch.on:
            return original(x).roll(1, 0)
        return original(x)
    return forward


class _ReluBf16Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.relu(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return (grad * (out > 0)).to(torch.bfloat16).to(grad.dtype)


def _bwd_bf16(switch: FaultSwitch, original):
    def forward(self, x):
        if switch.on:
            return _ReluBf16Backward.apply(x)
        return original(x)
    return forward


_FORWARDS = {"act": _act, "matmul_bf16": _matmul_bf16, "reduce_order": _reduce_order, "roll_rows": _roll_rows,
             "bwd_bf16": _bwd_bf16}


def install_op_fault(model: nn.Sequential, switch: FaultSwitch) -> None:
    """Replace the forward of the fault's module (before the model is wrapped or compiled). Two faults
    of one module wrap each other; each calls the forward it replaced while its switch is off."""
    module = model[_MODULE_OF[switch.kind]]
    module.forward = types.MethodType(_FORWARDS[switch.kind](switch, module.forward), module)
