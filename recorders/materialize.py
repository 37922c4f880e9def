"""Turning live tensors into full CPU copies and named store entries.

Copies are taken on the training thread, so the recorded bits are exactly what the loop had at that
moment even if the loop later updates the tensors in place. Sharded DTensors (FSDP2, TP) are
gathered with full_tensor(), a collective: every rank must call it for the same tensors in the same
order, which is why rank selection drops writes but never gathers.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Iterator

import numpy as np
import torch

from tracekit.dtypes import torch_dtype_name
from tracekit.store import TensorData
from tracekit.recorders.coords import is_dtensor

# Wrapper modules insert these path components; dropping them lets a DDP, FSDP, compiled or plain
# run of the same model name its tensors the same way.
_WRAPPER_PARTS = {"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}


def canonical_name(name: str) -> str:
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    return ".".join(parts) or name


def select(names: list[str], globs: tuple[str, ...]) -> list[str]:
    if not globs:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def full_cpu(t: torch.Tensor, keep: bool = True) -> torch.Tensor | None:
    """A full, detached CPU copy; gathers DTensors. keep=False: gather if collective, copy nothing."""
    t = t.detach()
    if is_dtensor(t):
        t = t.full_tensor()
    if not keep:
        return None
    if t.device.type == "cpu":
        return t.clone(memory_format=torch.contiguous_format)
    return t.to("cpu").contiguous()


def to_store(name: str, t: torch.Tensor) -> TensorData:
    """A CPU tensor as a store entry, in storage dtype (bit patterns for dtypes numpy lacks)."""
    dtype = torch_dtype_name(t.dtype)
    if t.dtype == torch.bfloat16:
        data = t.view(torch.int16).numpy().view(np.uint16)
    elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        data = t.view(torch.uint8).numpy()
    else:
        data = t.numpy()
    return TensorData(name, dtype, tuple(t.shape), data)


def flatten_output(obj: Any, prefix: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """Named tensors inside a model output: a tensor, or tuples/lists/dicts/dataclasses of them."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten_output(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten_output(v, f"{prefix}.{i}")
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from flatten_output(getattr(obj, k), f"{prefix}.{k}")
