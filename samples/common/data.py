"""Deterministic synthetic data: each step's global batch is a pure function of the step index.

Generated on the CPU with a generator seeded from the step, so it is identical in every run, on
every rank and on every device; each rank then takes its rows and moves them to its device.
"""

from __future__ import annotations

import torch

from .model import IN_FEATURES, OUT_FEATURES

GLOBAL_BATCH = 512
# Keeps the data streams of different steps apart from torch's default seed range of the model.
_DATA_SEED_BASE = 1_000_003


def global_batch(step: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (512, 128) for `step`; drawn in float32, then converted."""
    generator = torch.Generator(device="cpu").manual_seed(_DATA_SEED_BASE + step)
    inputs = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=generator)
    noise = torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=generator)
    # A learnable target (a fixed mix of the inputs plus a little noise) so the loss goes down.
    targets = torch.tanh(inputs.roll(shifts=1, dims=1)) + 0.1 * noise
    return inputs.to(dtype), targets.to(dtype)


def batch_slice(tensor: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """The `index`-th of `count` equal contiguous slices of the batch (rows)."""
    rows = tensor.shape[0]
    if rows % count:
        raise ValueError(f"a batch of {rows} samples does not split into {count} equal slices")
    size = rows // count
    return tensor[index * size : (index + 1) * size]
