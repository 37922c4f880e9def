"""The reference model: Sequential(Linear(128, 256), ReLU(), Linear(256, 128)), built on the CPU."""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 128
HIDDEN = 256
OUT_FEATURES = 128


def build_model(seed: int, dtype: torch.dtype = torch.float32, bias: bool = True) -> nn.Sequential:
    """Seed, then build on the CPU, so every rank and every run starts from the same parameters.

    The parameters are always drawn in float32 and then converted, so a float64 run starts from
    exactly the float32 run's values (an exact oracle for it). bias=False is simplefsdp_tp's variant.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN, bias=bias),
        nn.ReLU(),
        nn.Linear(HIDDEN, OUT_FEATURES, bias=bias),
    )
    return model.to(dtype)
