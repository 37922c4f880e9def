"""The output of a training step without touching the script: the outermost module call's output.

Zero-code recording does not know the model until the first optimizer step, but must already have
the output of the forward that preceded it. So `nn.Module.__call__` is wrapped: until the first
step the wrapper remembers the output of every *outermost* module call (one not made from inside
another module's call); `settle()` then picks the call whose module owns the optimizer's
parameters, and from then on the wrapper keeps only that module's outputs.

Why a wrapper and not module hooks: global module hooks take every module off torch's fast call
path, and torch.compile guards on them, so removing them after the first step would recompile
the model (minutes for a large one); a hook on the model itself would be compiled away by
model.compile(). For the same reason the wrapper, once installed, stays for the life of the
process (torch.compile may have guarded on it): after the first step it costs one Python call
per module call (bench/zerocode_overhead.py measures it). Inside a compiled region it does
nothing (`torch.compiler.is_compiling()` is constant-folded by dynamo): no graph break.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from tracekit.recorders.precision import note_forward

# Outermost calls remembered before the model is known (the model, a loss module, ...).
_MAX_CANDIDATES = 8


def detached(obj: Any) -> Any:
    """The output's structure with every tensor detached: keeps the values, not the autograd graph.

    Mirrors materialize.flatten_output (dicts and dataclasses by key, sequences by index), so the
    recorded names are those the explicit Recorder gives the same output.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, dict):
        return {k: detached(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return tuple(detached(v) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return {k: detached(getattr(obj, k)) for k in obj.__dataclass_fields__}
    return None


def owns_any(module: torch.nn.Module, param_ids: set[int]) -> bool:
    return any(id(p) in param_ids for p in module.parameters())


class OutermostCalls:
    """Finds the model among the outermost module calls, then keeps the output of its latest call."""

    def __init__(self):
        self._depth = threading.local()
        self._candidates: OrderedDict[int, tuple[torch.nn.Module, Any, bool]] = OrderedDict()
        self._original_call = None
        self._wrapper = None
        self.settled = False  # past the first step: only `root`'s calls matter (None: none do)
        self.root: torch.nn.Module | None = None
        self._output: Any = None
        self._output_with_grad = False

    def discover(self) -> None:
        """Wrap nn.Module.__call__ (for the rest of the process; see the module docstring)."""
        original = torch.nn.Module.__call__
        is_compiling = torch.compiler.is_compiling
        tracker = self

        def __call__(module, *args, **kwargs):
            if is_compiling():  # first, so dynamo reads nothing else (no guards on our state)
                return original(module, *args, **kwargs)
            if getattr(tracker._depth, "depth", 0) == 0 and (not tracker.settled or module is tracker.root):
                note_forward(module)  # the autocast state the forward runs under (precision.py)
            if tracker.settled:
                if module is not tracker.root:
                    return original(module, *args, **kwargs)
                out = original(module, *args, **kwargs)
                tracker._keep(out, torch.is_grad_enabled())
                return out
            state = tracker._depth
            depth = getattr(state, "depth", 0)
            state.depth = depth + 1
            try:
                out = original(module, *args, **kwargs)
            finally:
                state.depth = depth
            if depth == 0:
                tracker._candidate(module, out)
            return out

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        self._original_call, self._wrapper = original, __call__
        torch.nn.Module.__call__ = __call__

    def _candidate(self, module: torch.nn.Module, out: Any) -> None:
        key = id(module)
        self._candidates.pop(key, None)
        self._candidates[key] = (module, detached(out), torch.is_grad_enabled())
        while len(self._candidates) > _MAX_CANDIDATES:
            self._candidates.popitem(last=False)

    def settle(self, param_ids: set[int]) -> torch.nn.Module | None:
        """Pick the model: the latest outermost call (with grad enabled, if any was) of a module
        owning one of param_ids; keep that call's output for the current step."""
        calls = list(reversed(self._candidates.values()))
        owners = [c for c in calls if c[2] and owns_any(c[0], param_ids)] or [
            c for c in calls if owns_any(c[0], param_ids)
        ]
        self._candidates.clear()
        if owners:
            self.root, self._output, self._output_with_grad = owners[0]
        self.settled = True
        return self.root

    def _keep(self, out: Any, grad: bool) -> None:
        # The step's output is its latest training (grad-enabled) call; an evaluation call made
        # with grad disabled counts only when the step has no training call.
        if grad or not self._output_with_grad:
            self._output, self._output_with_grad = detached(out), grad

    def take_output(self) -> Any:
        """The output kept for the step being recorded; the next step starts empty."""
        out, self._output, self._output_with_grad = self._output, None, False
        return out

    def stop(self) -> None:
        """Keep nothing more; the wrapper stays in place, passing calls through."""
        self.settled, self.root = True, None
        self._candidates.clear()
        self._output = None

    def unwrap(self) -> None:
        """Stop and take the wrapper out, if nothing wrapped __call__ on top of it (tests, uninstall).
        Code compiled while it was in place recompiles."""
        self.stop()
        if self._wrapper is not None and torch.nn.Module.__call__ is self._wrapper:
            torch.nn.Module.__call__ = self._original_call
            self._wrapper = None
