"""An optimizer's per-parameter state tensors by name: `<param>.momentum_buffer`, `<param>.exp_avg`, ...

Recorded as the `optimizer_state` kind (after each step) so that a replay can restore it: restoring
parameters but not the momentum or Adam moments would not restart a step from the reference state.
"""

from __future__ import annotations

import torch


def state_tensors(optimizer, params: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """('<param>.<key>', tensor) for every tensor in the optimizer's state, in parameter order.

    Keys are sorted so every rank lists them in the same order (gathering DTensor state is a
    collective). Non-tensor entries (plain numbers some optimizers keep) are left out.
    """
    if optimizer is None:
        return []
    out = []
    for name, p in params:
        state = optimizer.state.get(p)  # .get: never insert into the optimizer's defaultdict
        if not state:
            continue
        for key in sorted(state):
            value = state[key]
            if isinstance(value, torch.Tensor):
                out.append((f"{name}.{key}", value))
    return out


def param_groups_of(optimizer) -> dict[int, dict]:
    """id(param) -> its param group (for capturable/fused flags that decide where scalars live)."""
    if optimizer is None:
        return {}
    return {id(p): group for group in optimizer.param_groups for p in group["params"]}
