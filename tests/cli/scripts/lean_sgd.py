"""Plain SGD (no momentum) as a torch.optim.Optimizer that never imports torch._dynamo.

torch.optim.SGD's constructor (Optimizer.add_param_group is dynamo-disabled) and its step()
(`torch._dynamo.graph_break()`) import torch._dynamo: about 1.4 CPU-s of a ~3.5 CPU-s rank, in
every rank of every launch. The launcher tests' scripts train with this instead: the same update
(`p -= lr * grad`, what SGD computes on CPU), a subclass of torch.optim.Optimizer like any custom
optimizer, so zero-code recording hooks its step() (the global step hooks) as it hooks SGD's.
Tests that are about torch's own optimizers use them (samples/, tests/recorders/).
"""

import torch


class LeanSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})

    def add_param_group(self, param_group: dict) -> None:  # Optimizer's own is dynamo-disabled
        group = dict(param_group)
        group["params"] = list(group["params"])
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])

    def zero_grad(self, set_to_none: bool = True) -> None:  # Optimizer's own is dynamo-disabled
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
