"""The output of a training step without touching the script: the root model's forward output.

Zero-code recording does not know the model until the first optimizer step, but must already have
the output of the forward that preceded it. So `nn.Module.__call__` is wrapped: until the first
step the wrapper remembers the latest output of every module called *outermost* (not from inside
another module's call) in the forward phase (not from backward, where activation checkpointing
recomputes blocks); `settle()` then picks the root(s) among them from the optimizer's parameters
(roots.py), and from then on the wrapper keeps only the roots' outputs.

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
from tracekit.recorders.roots import Call, Found, find_roots

# Distinct modules whose outermost calls are remembered before the model is known (the model, a
# loss module, a head a chunked loss applies itself, ...); the least recently called goes first.
_MAX_CANDIDATES = 64


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


class OutermostCalls:
    """Finds the model among the outermost module calls, then keeps the output of its latest call."""

    def __init__(self):
        self._depth = threading.local()
        self._candidates: OrderedDict[int, Call] = OrderedDict()  # by id(module), least recent first
        self._calls = 0  # outermost calls seen, for each candidate's first-call order
        self._original_call = None
        self._wrapper = None
        self.settled = False  # past the first step: only the roots' calls matter (none: none do)
        self.roots: dict[int, str] = {}  # id(root module) -> its prefix ('' for a lone root)
        self._outputs: dict[str, tuple[Any, bool]] = {}  # prefix -> (output, made with grad)

    def discover(self) -> None:
        """Wrap nn.Module.__call__ (for the rest of the process; see the module docstring)."""
        original = torch.nn.Module.__call__
        is_compiling = torch.compiler.is_compiling
        in_backward = torch._C._current_graph_task_id  # -1 outside the autograd engine
        tracker = self

        def __call__(module, *args, **kwargs):
            if is_compiling():  # first, so dynamo reads nothing else (no guards on our state)
                return original(module, *args, **kwargs)
            if getattr(tracker._depth, "depth", 0) == 0 and (not tracker.settled or id(module) in tracker.roots):
                note_forward(module)  # the autocast state the forward runs under (precision.py)
            if tracker.settled:
                prefix = tracker.roots.get(id(module))
                if prefix is None or in_backward() != -1:  # not a root, or a recompute in backward
                    return original(module, *args, **kwargs)
                out = original(module, *args, **kwargs)
                tracker._keep(prefix, out, torch.is_grad_enabled())
                return out
            state = tracker._depth
            depth = getattr(state, "depth", 0)
            state.depth = depth + 1
            try:
                out = original(module, *args, **kwargs)
            finally:
                state.depth = depth
            if depth == 0 and in_backward() == -1:
                tracker._candidate(module, out)
            return out

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        self._original_call, self._wrapper = original, __call__
        torch.nn.Module.__call__ = __call__

    def _candidate(self, module: torch.nn.Module, out: Any) -> None:
        key = id(module)
        old = self._candidates.pop(key, None)
        self._calls += 1
        self._candidates[key] = Call(module, detached(out), torch.is_grad_enabled(),
                                     old.first if old is not None else self._calls)
        while len(self._candidates) > _MAX_CANDIDATES:
            self._candidates.popitem(last=False)

    def settle(self, optimizer_params: list, model_name: str | None = None) -> Found:
        """Pick the root(s) of the optimizer's parameters among the calls so far (roots.py), keep
        their calls' outputs for the current step, and from now on follow them alone.
        Raises TracekitError when --model names no module, or several."""
        calls = list(self._candidates.values())
        self._candidates.clear()
        self.settled = True
        found = find_roots(calls, optimizer_params, model_name)
        self.roots = {id(m): prefix for prefix, m in found.roots}
        by_call = {id(c.module): c for c in calls}
        self._outputs = {prefix: (by_call[id(m)].output, by_call[id(m)].grad)
                         for prefix, m in found.roots if id(m) in by_call}
        return found

    def _keep(self, prefix: str, out: Any, grad: bool) -> None:
        # The step's output is its latest training (grad-enabled) call; an evaluation call made
        # with grad disabled counts only when the step has no training call.
        kept = self._outputs.get(prefix)
        if grad or kept is None or not kept[1]:
            self._outputs[prefix] = (detached(out), grad)

    def take_output(self) -> Any:
        """The output kept for the step being recorded (several roots: a dict by prefix); the
        next step starts empty."""
        outputs, self._outputs = self._outputs, {}
        if len(self.roots) <= 1:
            return outputs[""][0] if "" in outputs else None
        return {prefix: out for prefix, (out, _) in outputs.items()} or None

    def stop(self) -> None:
        """Keep nothing more; the wrapper stays in place, passing calls through."""
        self.settled, self.roots = True, {}
        self._candidates.clear()
        self._outputs = {}

    def unwrap(self) -> None:
        """Stop and take the wrapper out, if nothing wrapped __call__ on top of it (tests, uninstall).
        Code compiled while it was in place recompiles."""
        self.stop()
        if self._wrapper is not None and torch.nn.Module.__call__ is self._wrapper:
            torch.nn.Module.__call__ = self._original_call
            self._wrapper = None
