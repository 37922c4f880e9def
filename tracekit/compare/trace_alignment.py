"""Which candidate event is which reference event, inside one traced step.

Events pair within their unit, (phase, module path), in call order: the two units' op sequences
are aligned as sequences (difflib's longest matching blocks), so an extra op, a missing one, or a
fused kernel's different op list leaves the rest of the unit paired. (Pairing on the call index
of each op within its unit, as before, shifted every later call of the same op after one extra
call: an extra `view` paired the next views with the wrong tensors, whose shapes then hid the
fault.) Units that only one side has stay unpaired, and say so.
"""

from __future__ import annotations

from difflib import SequenceMatcher

from tracekit.store.trace_events import TraceEvent


def unit_of(e: TraceEvent) -> tuple:
    return (e.phase, e.module)


def pair_events(ref_events: list[TraceEvent], cand_events: list[TraceEvent]) -> dict[int, TraceEvent]:
    """candidate event index -> its reference event, for the events both sides share."""
    ref_units: dict[tuple, list[TraceEvent]] = {}
    cand_units: dict[tuple, list[TraceEvent]] = {}
    for e in ref_events:
        ref_units.setdefault(unit_of(e), []).append(e)
    for e in cand_events:
        cand_units.setdefault(unit_of(e), []).append(e)
    pairs: dict[int, TraceEvent] = {}
    for unit, cs in cand_units.items():
        rs = ref_units.get(unit)
        if not rs:
            continue
        ops_r, ops_c = [e.op for e in rs], [e.op for e in cs]
        if ops_r == ops_c:  # the usual case: the same ops in the same order
            pairs.update((c.index, r) for r, c in zip(rs, cs))
            continue
        for a, b, n in SequenceMatcher(None, ops_r, ops_c, autojunk=False).get_matching_blocks():
            for k in range(n):
                pairs[cs[b + k].index] = rs[a + k]
    return pairs


def mixed_units(ref_events: list[TraceEvent], cand_events: list[TraceEvent]) -> set[tuple]:
    """Units that ran compiled code (events called from inductor's code) on one side only: their
    op sequences are not the same program's (extern kernels against eager ops), so an op there
    that pairs with nothing has no counterpart to be judged against."""
    def compiled_units(events):
        out: dict[tuple, bool] = {}
        for e in events:
            u = unit_of(e)
            out[u] = out.get(u, False) or bool(e.compiled)
        return out
    ref, cand = compiled_units(ref_events), compiled_units(cand_events)
    return {u for u in set(ref) | set(cand) if ref.get(u, False) != cand.get(u, False)}
