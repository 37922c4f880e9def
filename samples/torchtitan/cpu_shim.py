"""What TorchTitan 0.3.0 needs to train on a CPU-only host with gloo, applied at run time (no file
of TorchTitan's is edited). Each patch is a no-op where it is not needed, so the runner is the
same on a GPU host. See docs/TORCHTITAN.md for why each one is there.

1. device: with no accelerator, `torchtitan.tools.utils` falls back to device_type "cuda" and
   `torch.cuda.set_device` fails. The probe it imports answers "cpu" instead, and its device
   module is torch.cpu plus what TorchTitan's memory monitor asks of a device (name, capacity,
   memory stats: the host's RAM, no stats).
2. spmd backend: the default `spmd_types` backend fails at FSDP setup on CPU; the runner passes
   `--parallelism.spmd-backend partial_dtensor` unless the command names one (train.py).
3. attention: FlexAttention has no CPU backward. Each layer runs `scaled_dot_product_attention`
   with the same block-causal mask (the BlockMask's mask_mod, materialized), so the model computes
   the same function; only the kernel differs. Since only the mask_mod is used, the BlockMask is
   built eagerly for CPU tensors: TorchTitan builds it through `torch.compile(create_block_mask)`,
   which on CPU compiles it with inductor in every launch (~7 s of a 2-rank run's first step) for
   block indices the SDPA path never reads.
4. gloo has no PREMUL_SUM: TorchTitan sets FSDP2's gradient divide factor to 1.0, which FSDP2 sends
   as a PREMUL_SUM(1.0) reduce-scatter. On gloo, FSDP2 is told to reduce with SUM and divide after
   (its force-sum path), which with a factor of 1.0 divides by nothing: the same gradients.
5. `torch.distributed.set_timeout` is missing before torch nightly: it is supplied from
   `distributed_c10d._set_pg_timeout`, which sets a group's gloo/nccl default timeout.
6. the closing sleep: after the last step, rank 0 sleeps 2 s "for other ranks to complete"
   (`Trainer.train`), then training is over and nothing waits on it: torchrun waits for every rank
   anyway. On a CPU-only host that sleep is skipped (a third of a short run's last seconds).
7. start-up, on a CPU-only host: TorchTitan's modules call `torch.compile` as they are imported
   (FlexAttention's kernel, the block mask), which imports inductor's compiler and AOTAutograd
   whether or not anything is ever compiled, and its metrics module imports TensorBoard whether or
   not TensorBoard is turned on. While the runner imports TorchTitan, `torch.compile`
   hands back a function that calls the real `torch.compile` at its first call (which is when
   torch.compile compiles anyway), and metrics' `SummaryWriter` imports TensorBoard's when a writer
   is made. Unless the command asks for `--help`, TorchTitan's config parser (tyro) is not made
   to read each config class's source for its fields' help text (`inspect.getsource`, most of
   the parse's CPU time): the help text is empty, the parsed config the same.
   Nothing TorchTitan computes changes.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import torch.distributed as dist


def cpu_only() -> bool:
    from torch._utils import _get_available_device_type

    return _get_available_device_type() is None


def apply() -> list[str]:
    """Apply what this host needs, before TorchTitan is imported; the names of the patches applied."""
    applied = []
    if cpu_only():
        _device_falls_back_to_cpu()
        applied.append("device")
        # only where nothing calls what TorchTitan compiles at import (FlexAttention's kernel and
        # block mask: 3. above): on a GPU those calls run inside the user's compiled model, and a
        # deferred torch.compile there would be traced by dynamo
        _import_torchtitan_without_compiling()
        applied.append("lazy_imports")
        if _help_text_only_for_help(sys.argv[1:]):
            applied.append("no_help_text")
        _no_closing_sleep()
        applied.append("closing_sleep")
    _flex_attention_to_sdpa_on_cpu()
    applied.append("attention")
    _gloo_reduce_scatter_without_premul_sum()
    applied.append("premul_sum")
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = _set_timeout
        applied.append("set_timeout")
    return applied


class CpuDeviceModule:
    """torch.cpu, with the calls TorchTitan's metrics make of a device module answered for a host."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None):
        import types

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(name="cpu", total_memory=total)

    @staticmethod
    def current_device() -> int:
        return 0  # an index, as accelerators answer (torch.cpu answers "cpu"; barrier wants an int)

    @staticmethod
    def memory_stats(device=None) -> dict:
        return {}  # TorchTitan reports -1 for every figure missing here

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def _compile_at_first_call(real_compile):
    """torch.compile as a module calls it at import: for a function, one that calls
    real_compile(function, ...) the first time it is called and the compiled function from then on."""

    def compile(model=None, *args, **kwargs):
        if model is None or isinstance(model, torch.nn.Module) or not callable(model):
            return real_compile(model, *args, **kwargs)
        compiled = []

        @functools.wraps(model)
        def call(*a, **k):
            if not compiled:
                compiled.append(real_compile(model, *args, **kwargs))
            return compiled[0](*a, **k)

        return call

    return compile


def _summary_writer(*args, **kwargs):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(*args, **kwargs)


def _import_torchtitan_without_compiling(module: str = "torchtitan.train") -> None:
    """Import TorchTitan's trainer (module) with the module-level torch.compile calls deferred to
    their first call and TensorBoard imported when a writer is made (see 7. above)."""
    import importlib
    import types

    if module in sys.modules:
        return
    real_compile, name = torch.compile, "torch.utils.tensorboard"
    stub = None
    if name not in sys.modules:
        stub = sys.modules[name] = types.ModuleType(name)
        stub.SummaryWriter = _summary_writer

        def real(attribute):  # any other name: TensorBoard's own module, imported now
            if attribute.startswith("__"):  # what inspect asks of every module in sys.modules
                raise AttributeError(attribute)
            if sys.modules.get(name) is stub:
                del sys.modules[name]
            return getattr(importlib.import_module(name), attribute)

        stub.__getattr__ = real
    torch.compile = _compile_at_first_call(real_compile)
    try:
        importlib.import_module(module)  # the trainer and everything it imports
    finally:
        torch.compile = real_compile
        if stub is not None and sys.modules.get(name) is stub:
            del sys.modules[name]


def _help_text_only_for_help(argv: list[str]) -> bool:
    """Unless argv asks for help, tyro's help-text lookups (each config field's docstring and
    comments, from its class's source) answer nothing; True if so."""
    if any(a in ("-h", "--help") for a in argv):
        return False
    from tyro import _docstrings

    if not (hasattr(_docstrings, "get_field_docstring") and hasattr(_docstrings, "get_callable_description")):
        return False  # another tyro: left as it is
    _docstrings.get_field_docstring = lambda cls, field_name, markers: None
    _docstrings.get_callable_description = lambda f: ""
    return True


def _device_falls_back_to_cpu() -> None:
    import torch._utils

    probe, module_of = torch._utils._get_available_device_type, torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: probe() or "cpu"
    torch._utils._get_device_module = lambda name: CpuDeviceModule() if name == "cpu" else module_of(name)
    try:
        import torchtitan.tools.utils  # noqa: F401  (binds device_type, device_module once, at import)
    finally:
        torch._utils._get_available_device_type, torch._utils._get_device_module = probe, module_of


class _TimeWithoutSleep:
    """The time module as torchtitan.trainer sees it, but sleep returns at once: trainer.py's only
    sleep is rank 0's closing 2 s."""

    def __getattr__(self, name):
        import time

        return getattr(time, name)

    @staticmethod
    def sleep(seconds) -> None:
        pass


def _no_closing_sleep() -> None:
    from torchtitan import trainer

    trainer.time = _TimeWithoutSleep()


def _flex_attention_to_sdpa_on_cpu() -> None:
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    flex_forward = FlexAttention.forward

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, score_mod=None, scale=None,
                enable_gqa=False, out_transform=None, **kwargs):
        if q_BLNH.device.type != "cpu" or score_mod is not None or out_transform is not None:
            return flex_forward(self, q_BLNH, k_BLNH, v_BLNH, attention_masks=attention_masks,
                                score_mod=score_mod, scale=scale, enable_gqa=enable_gqa,
                                out_transform=out_transform, **kwargs)
        batch, length = q_BLNH.shape[0], q_BLNH.shape[1]
        # the BlockMask's own mask_mod (block-causal over packed documents) as a dense boolean mask
        mask = create_mask(attention_masks.mask_mod, batch, 1, length, length, device=q_BLNH.device)
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2),
                                             v_BLNH.transpose(1, 2), attn_mask=mask, scale=scale,
                                             enable_gqa=enable_gqa)
        return out.transpose(1, 2)

    FlexAttention.forward = forward
    _block_mask_eager_on_cpu()


def _block_mask_eager_on_cpu() -> None:
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import attention

    compiled = attention._compiled_create_block_mask  # create_attention_mask looks it up per call

    def create(mask_mod, B, H, Q_LEN, KV_LEN, device=None, **kwargs):
        build = create_block_mask if device is not None and torch.device(device).type == "cpu" else compiled
        return build(mask_mod, B, H, Q_LEN, KV_LEN, device=device, **kwargs)

    attention._compiled_create_block_mask = create


def _gloo_reduce_scatter_without_premul_sum() -> None:
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import fsdp

    disable_division = fsdp.disable_fsdp_gradient_division

    def disable_fsdp_gradient_division(model) -> None:
        disable_division(model)
        if dist.get_backend() == "gloo":
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division


def _set_timeout(timeout, group=None) -> None:
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timeout, group)
