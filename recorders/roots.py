"""The model a zero-code recording names its tensors after, found from the optimizer's parameters.

The root is the module, among the outermost module calls made before the first optimizer step
(the forward phase only: activation checkpointing's recompute runs in backward and is not a
candidate), that owns *all* of the training optimizer's parameters. Not the last one called:
a chunked loss calls `lm_head` itself after the model, and a recompute calls one block at a time.
Among several such modules (a warm-up wrapper, an evaluation call), the latest grad-enabled one.

When no called module owns them all (a model and a separate head, each called by the loop),
the fewest called modules that own them together are the roots, each naming its tensors under
`<Class>.` (`<Class>_2.`, ... for a second root of the same class, in the order of their first
call). Parameters no called module owns are left out, each with its reason.

`--model NAME` names the root instead: a class name (of a called module or any module below one)
or an attribute path below a called module (`encoder`, `layers.0`, wrappers' parts skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tracekit.errors import TracekitError
from tracekit.recorders.names import canonical_name
from tracekit.store.coverage import (NAMED_BY_MODULE, NAMED_BY_POSITION, OUTPUT_NONE, OUTPUT_OBSERVED, OUTPUT_ROOT,
                                     Coverage, LeftOut, Root)

# Attributes holding the user's module inside torch.compile's and checkpoint_wrapper's wrappers
# (DDP's `module` is checked by class: a user module may well have a `module` attribute).
_INNER = ("_orig_mod", "_checkpoint_wrapped_module")


@dataclass
class Call:
    """An outermost module call made before the first step: the latest of that module's."""

    module: torch.nn.Module
    output: Any  # detached
    grad: bool  # made with grad enabled
    first: int  # order of the module's first call


@dataclass
class Found:
    roots: list[tuple[str, torch.nn.Module]]  # (prefix, module); one root has the prefix ''
    params: dict[str, torch.nn.Parameter] | list  # named tensors to record; a list: named by position
    coverage: Coverage


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside torch's wrappers (compile, checkpoint_wrapper, DDP, DataParallel)."""
    while True:
        attrs = _INNER + (("module",) if isinstance(module, (torch.nn.parallel.DistributedDataParallel,
                                                               torch.nn.DataParallel)) else ())
        inner = next((getattr(module, a) for a in attrs if isinstance(getattr(module, a, None), torch.nn.Module)), None)
        if inner is None:
            return module
        module = inner


def class_name(module: torch.nn.Module) -> str:
    """The user's class of a module: inside torch's wrappers, and under FSDP2's FSDP<Class> subclass."""
    for cls in type(unwrapped(module)).__mro__:
        if not cls.__module__.startswith("torch.distributed"):
            return cls.__name__
    return type(module).__name__


def _owned(module: torch.nn.Module, wanted: set[int]) -> set[int]:
    return {id(p) for p in module.parameters() if id(p) in wanted}


def _preferred(calls: list[Call]) -> list[Call]:
    """Training (grad-enabled) calls first, then evaluation ones; the latest first within each."""
    return [c for c in reversed(calls) if c.grad] + [c for c in reversed(calls) if not c.grad]


def find_roots(calls: list[Call], optimizer_params: list, model_name: str | None = None) -> Found:
    """The root module(s) of the optimizer's parameters among `calls` (in order of their last call)."""
    wanted = {id(p) for p in optimizer_params}
    if model_name:
        module = named_module(calls, model_name)
        roots = [(module, _owned(module, wanted))]
        reason = f"not in {class_name(module)} (--model {model_name})"
    else:
        roots = _cover(_preferred(calls), wanted)
        reason = "owned by no module called before the first optimizer step"
    if not roots:
        cov = Coverage(len(optimizer_params), len(optimizer_params), NAMED_BY_POSITION, output=OUTPUT_NONE)
        return Found([], list(optimizer_params), cov)
    first = {id(c.module): c.first for c in calls}
    roots.sort(key=lambda r: first.get(id(r[0]), 0))
    prefixes = _prefixes([m for m, _ in roots])
    params: dict[str, torch.nn.Parameter] = {}
    seen: set[int] = set()
    for prefix, (module, _) in zip(prefixes, roots):
        for name, p in module.named_parameters():
            if id(p) not in seen:  # a tensor shared by two roots is named under the first
                seen.add(id(p))
                full = prefix + canonical_name(name)
                if full in params:  # never one tensor recorded under another's name
                    raise TracekitError(f"two parameters share the name {full!r} once wrappers are stripped")
                params[full] = p
    left = [LeftOut(f"param{i}", tuple(p.shape), reason) for i, p in enumerate(optimizer_params) if id(p) not in seen]
    root_info = tuple(Root(class_name(m), prefix.rstrip("."), len(owned)) for prefix, (m, owned) in zip(prefixes, roots))
    outside = _outside_calls(calls, [m for m, _ in roots])
    cov = Coverage(len(optimizer_params), len(optimizer_params) - len(left), NAMED_BY_MODULE, root_info, tuple(left),
                   OUTPUT_ROOT, tuple(outside), f"--model {model_name}" if model_name else None)
    return Found([(p.rstrip("."), m) for p, (m, _) in zip(prefixes, roots)], params, cov)


def _cover(calls: list[Call], wanted: set[int]) -> list[tuple[torch.nn.Module, set[int]]]:
    """One called module owning all of `wanted` if there is one (the first in preference order),
    else the fewest called modules owning most of it together, largest first (greedy)."""
    owned = [(c.module, _owned(c.module, wanted)) for c in calls]
    whole = next(((m, o) for m, o in owned if o == wanted), None)
    if whole is not None or not wanted:
        return [whole] if whole is not None else []
    chosen, covered = [], set()
    for module, mine in sorted(owned, key=lambda mo: -len(mo[1])):  # stable: preference order among equals
        if mine - covered:
            chosen.append((module, mine))
            covered |= mine
    return chosen


def _prefixes(modules: list[torch.nn.Module]) -> list[str]:
    if len(modules) == 1:
        return [""]
    out, count = [], {}
    for m in modules:
        name = class_name(m)
        count[name] = count.get(name, 0) + 1
        out.append(f"{name}." if count[name] == 1 else f"{name}_{count[name]}.")
    return out


def _outside_calls(calls: list[Call], roots: list[torch.nn.Module]) -> list[str]:
    """Paths of the roots' submodules that the loop called itself, outside the roots' forward."""
    paths = {}
    for root in roots:
        for path, m in root.named_modules():
            if unwrapped(m) is not unwrapped(root):
                paths.setdefault(id(m), canonical_name(path))
    return sorted({paths[id(c.module)] for c in calls if id(c.module) in paths})


def named_module(calls: list[Call], name: str) -> torch.nn.Module:
    """The one module `--model NAME` names: by class name, or by attribute path below a called module."""
    found: dict[int, torch.nn.Module] = {}
    for call in _preferred(calls):
        for path, m in call.module.named_modules():
            key = id(unwrapped(m))  # a wrapper and its inner module are one match: the outermost kept
            if key not in found and name in (class_name(m), type(unwrapped(m)).__qualname__, canonical_name(path)):
                found[key] = m
    if len(found) == 1:
        return next(iter(found.values()))
    called = ", ".join(sorted({class_name(c.module) for c in calls})) or "none"
    if not found:
        raise TracekitError(f"--model {name}: no module of that class or attribute path was called before the first "
                            f"optimizer step (outermost calls: {called})")
    raise TracekitError(f"--model {name}: {len(found)} different modules match it; name the class or path of one "
                        f"(outermost calls: {called})")


def coverage_of(named: list, optimizer, model: torch.nn.Module | None) -> Coverage:
    """The explicit Recorder's coverage: which of `optimizer`'s parameters the recorded `named`
    (name, tensor) pairs hold; the output is what the script passes to observe()."""
    optimizer_params = [p for group in optimizer.param_groups for p in group["params"]]
    recorded = {id(p) for _, p in named}
    where = f"not a parameter of the {class_name(model)} given to Recorder" if model is not None else \
        "not among the parameters given to Recorder"
    left = [LeftOut(f"param{i}", tuple(p.shape), where) for i, p in enumerate(optimizer_params) if id(p) not in recorded]
    roots = (Root(class_name(model), "", len(optimizer_params) - len(left)),) if model is not None else ()
    return Coverage(len(optimizer_params), len(optimizer_params) - len(left), NAMED_BY_MODULE, roots, tuple(left),
                    OUTPUT_OBSERVED)
