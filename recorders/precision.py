"""Capture the precision context of a rank (tracekit/store/precision.py): what its forward ran under.

Autocast is a thread-local state that exists only while the forward runs, so it is noted from
inside a forward: `note_forward(module)` is called by the zero-code wrapper of nn.Module.__call__
(outermost.py) and, for the explicit Recorder, by a forward pre-hook on the model. Both skip
compiled regions (nothing may run there), so a model that is only ever called from inside
torch.compile leaves autocast unknown (None), never wrongly "off". Everything else (FSDP2
policies, math flags, compiled regions) is read from the model and torch when the context is built.
"""

from __future__ import annotations

import sys
import threading

import torch

from tracekit.store.precision import PrecisionContext

# Device types whose autocast state is looked at (torch.is_autocast_enabled accepts these on
# any build; an unknown one raises and is skipped).
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla")


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def autocast_now() -> dict[str, str]:
    """The autocast regions active on this thread: device type -> dtype."""
    out = {}
    for device in _AUTOCAST_DEVICES:
        try:
            if torch.is_autocast_enabled(device):
                out[device] = _dtype_name(torch.get_autocast_dtype(device))
        except (RuntimeError, ValueError, TypeError, AttributeError):
            continue
    return out


class ForwardProbe:
    """What the forwards of a process ran under: the union of their autocast states, and the
    compiled wrappers (torch.compile's OptimizedModule) called at the outermost level."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seen = False
        self.autocast: dict[str, str] = {}
        self.compiled: dict[str, dict[str, str | None]] = {}

    def reset(self) -> None:
        with self._lock:
            self.seen, self.autocast, self.compiled = False, {}, {}

    def note_forward(self, module=None) -> None:
        if torch.compiler.is_compiling():  # constant-folded by dynamo: nothing below is traced
            return
        state = autocast_now()
        region = compiled_region(module) if module is not None else None
        with self._lock:
            self.seen = True
            for device, dtype in state.items():
                self.autocast.setdefault(device, dtype)
            if region is not None:
                self.compiled.setdefault(type(module).__name__, region)


PROBE = ForwardProbe()  # one per process: the wrapper of nn.Module.__call__ is one per process too


def note_forward(module=None) -> None:
    PROBE.note_forward(module)


def compiled_region(module) -> dict[str, str | None] | None:
    """{backend, mode} of a torch.compile'd module (an OptimizedModule, or one after module.compile()), else None."""
    ctx = getattr(module, "dynamo_ctx", None)
    if ctx is None:
        impl = getattr(module, "_compiled_call_impl", None)
        # module.compile() keeps no handle on its backend: compiled, backend unknown
        return None if impl is None else {"backend": None, "mode": None}
    backend = getattr(getattr(ctx, "callback", None), "_torchdynamo_orig_backend", None)
    backend = getattr(backend, "_torchdynamo_orig_backend", backend)
    name = getattr(backend, "_compiler_name", None) or getattr(backend, "compiler_name", None)
    config = getattr(backend, "config", None)  # inductor's options, where the mode set some
    mode = ",".join(f"{k}={v}" for k, v in sorted(config.items())) if isinstance(config, dict) and config else None
    return {"backend": name, "mode": mode}


def fsdp_policies(model) -> dict[str, dict[str, str | None]]:
    """Each fully_shard'ed module's MixedPrecisionPolicy dtypes, by module path; none while nothing
    in the process has imported torch.distributed.fsdp (no module can be fully_shard'ed before):
    a job without FSDP is spared its import, and DTensor's (~0.8 CPU-s of a rank's start-up)."""
    FSDPModule = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if FSDPModule is None:
        return {}
    out = {}
    for name, module in model.named_modules() if model is not None else ():
        if not isinstance(module, FSDPModule):
            continue
        try:
            policy = module._get_fsdp_state()._mp_policy
        except AttributeError:  # a torch whose FSDP2 keeps it elsewhere: said as unknown, not as none
            out[name] = {"param_dtype": "unknown", "reduce_dtype": "unknown", "output_dtype": "unknown"}
            continue
        out[name] = {f: _dtype_name(getattr(policy, f, None)) for f in ("param_dtype", "reduce_dtype", "output_dtype")}
    return out


def math_flags() -> dict[str, bool]:
    b = torch.backends
    flags = {
        "cuda_matmul_allow_tf32": b.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": b.cudnn.allow_tf32,
        "cudnn_enabled": b.cudnn.enabled,
        "cudnn_deterministic": b.cudnn.deterministic,
        "cudnn_benchmark": b.cudnn.benchmark,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda_matmul_allow_bf16_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cuda_matmul_allow_fp16_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
    }
    return {k: bool(v) for k, v in flags.items()}


def precision_context(model, device: str | None, backend: str | None, probe: ForwardProbe = PROBE) -> PrecisionContext:
    compiled = dict(probe.compiled)
    for name, module in model.named_modules() if model is not None else ():
        region = compiled_region(module)
        if region is not None:
            compiled.setdefault(name or type(module).__name__, region)
    return PrecisionContext(
        autocast=dict(probe.autocast) if probe.seen else None,
        fsdp=fsdp_policies(model),
        matmul_precision=torch.get_float32_matmul_precision(),
        flags=math_flags(),
        compiled=compiled,
        device=device,
        backend=backend,
    )
