"""The narrowest unit both traces share, for a difference made where they do not pair one to one.

Compiled code against eager (inductor's extern kernels against aten ops), a fused kernel, an
extra cast: the candidate's ops in a region have no one-to-one counterparts, so no unpaired op
there can be blamed. What can be said is where: the innermost module path, in the phase and the
module's call (the n-th time that phase entered the module), that holds every unpaired op which
made the differing values, and that the reference also ran. Said with the op counts of both sides
there, and how many of them paired.

Compiled code the trace cannot see (inductor's kernels) may have made the region's inputs: then
the difference may come from any code that ran since the last event whose values matched, even a
compiled module that dispatched no op at all (a fused ReLU): the unit widens to hold that event
too, or to the top level when no event of the phase matched before it.
"""

from __future__ import annotations

from tracekit.store.trace_events import TensorRef, TraceEvent


def _within(module: str, path: str) -> bool:
    return path == "" or module == path or module.startswith(path + ".")


def _common_path(paths: list[str]) -> str:
    parts = [p.split(".") if p else [] for p in paths]
    out: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def _calls(events: list[TraceEvent], phase: str, path: str) -> list[list[TraceEvent]]:
    """The events of each call of module `path` in `phase`: a call starts where the stream enters
    the module (an event of it in that phase after one that is not)."""
    calls: list[list[TraceEvent]] = []
    inside = False
    for e in events:
        here = e.phase == phase and _within(e.module, path)
        if here and not inside:
            calls.append([])
        if here:
            calls[-1].append(e)
        inside = here
    return calls


def _unseen(e: TraceEvent, t: TensorRef) -> bool:
    """An input made by code the trace cannot see (the same test as compare_traces')."""
    return t.producer is None and not t.name and bool(e.compiled or t.unseen_write)


def _region(origin: TraceEvent, by_index: dict[int, TraceEvent], pairs: dict, status: dict,
            opaque: str) -> tuple[list[TraceEvent], bool]:
    """The origin and the unpaired, opaque events upstream of it (what made its values), and
    whether any of them read what unseen compiled code made."""
    seen, todo, out, unseen = {origin.index}, [origin], [], False
    while todo:
        e = todo.pop()
        out.append(e)
        for t in e.inputs:
            p = t.producer
            unseen = unseen or _unseen(e, t)
            if p and p[0] not in seen and p[0] not in pairs and status.get(p[0]) == opaque and p[0] in by_index:
                seen.add(p[0])
                todo.append(by_index[p[0]])
    return out, unseen


def narrowest_shared_unit(origin: TraceEvent, ref_events: list[TraceEvent], cand_events: list[TraceEvent],
                          pairs: dict, status: dict, opaque: str, last_ok: TraceEvent | None = None) -> dict:
    """{phase, module, call, ref_ops, cand_ops, paired, ref_compiled, cand_compiled} of the
    innermost unit holding the region that made `origin`'s values, run by both sides. last_ok:
    the latest event before it whose inputs and outputs matched (where unseen code may start)."""
    by_index = {e.index: e for e in cand_events}
    region, unseen = _region(origin, by_index, pairs, status, opaque)
    phase = origin.phase
    paths = [e.module for e in region if e.phase == phase]
    if unseen:
        if last_ok is None or last_ok.phase != phase:
            paths.append("")  # unseen code since the phase began: any module of it
        else:
            paths += [e.module for e in cand_events if last_ok.index <= e.index < origin.index and e.phase == phase]
    path = _common_path(paths)
    while path and not any(e.phase == phase and _within(e.module, path) for e in ref_events):
        path = path.rpartition(".")[0]  # the reference never ran it: its parent is what both share
    cand_calls = _calls(cand_events, phase, path)
    k = next((n for n, call in enumerate(cand_calls) if any(e is origin for e in call)), 0)
    ref_calls = _calls(ref_events, phase, path)
    cand_unit = cand_calls[k] if k < len(cand_calls) else []
    ref_unit = ref_calls[k] if k < len(ref_calls) else []
    return {"phase": phase, "module": path, "call": k, "ref_ops": len(ref_unit), "cand_ops": len(cand_unit),
            "paired": sum(1 for e in cand_unit if e.index in pairs),
            "ref_compiled": next((e.compiled for e in ref_unit if e.compiled), None),
            "cand_compiled": next((e.compiled for e in cand_unit if e.compiled), None)}
