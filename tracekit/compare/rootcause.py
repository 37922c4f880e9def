"""The root-cause op: where, inside one traced step, the candidate first computes differently.

Two traces of the same step (tracekit record --trace ops|modules) are aligned event by event
within each (phase, module path) unit, their op sequences matched in call order
(compare/trace_alignment.py): an extra or missing op leaves the rest of its unit paired. Unpaired events are reported
(`extra` in the candidate, `missing` from it), never a failure by themselves.

Then the candidate's events are walked in execution order, following the data flow each event
recorded (the event that produced each input):
  - a paired event whose inputs all match the reference within tolerance and whose output does
    not is a root cause: the op itself computes differently;
  - a paired event whose non-tensor arguments differ (a scalar such as alpha, a dim, a dtype) is a
    root cause on its own, whatever its tensors say;
  - an unpaired event (or a collective, whose outputs are not summarized while in flight) whose
    inputs match has no reference output to compare; it is judged through its consumers: when a
    paired consumer's input that it produced differs from the reference's, it is the root cause;
  - a paired event reading a tensor from before the step (a parameter, the batch) that already
    differs means the step started from a different state (`kind: "state"`): trace an earlier
    step, or replay this one from the reference (tracekit record --replay-from);
  - under inductor, whose generated kernels the dispatch mode never sees, an event called from
    inductor's code reading an unnamed tensor no event produced (or one changed since its producer
    by an unseen write) that differs is `kind: "compiled"`: the fault lies in a compiled kernel
    between the last matching event and it.
The first root cause in execution order is reported, then the chain of events that carried its
error on, down to the named tensors (gradients, parameters) the step-level diff compares.

Tensors are compared through their summaries (min, max, mean, L2 norm, NaN and Inf counts) and
hashes; where both stores kept a tensor's bytes (--trace-full), elementwise with the same rtol and
atol (compare_full). No torch import here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracekit.store.kinds import TRACE_BY_NAME
from tracekit.store.trace_events import TensorRef, TraceEvent
from tracekit.compare.tolerances import Tolerances
from tracekit.compare.trace_alignment import mixed_units, pair_events, unit_of
from tracekit.compare.unit_cause import narrowest_shared_unit

OK, BAD, UNKNOWN, SUSPECT = "ok", "bad", "unknown", "suspect"
# values made where the two traces do not pair one to one (compiled code against eager, a fused
# kernel: an unpaired op reading what unseen compiled code made, or in a unit compiled on one side
# only): no unpaired op there can be blamed; a difference they carry names the unit (unit_cause.py)
OPAQUE = "opaque"
CHAIN_LIMIT = 200  # events kept in a chain (the JSON says how many there were)
# ops that overwrite an input without reading its values: op -> the inputs overwritten (None: all).
# What such an input held before (a gradient buffer left by an earlier step, zeroed by zero_grad)
# is no part of what the op computes, so a difference there is neither a state difference nor an
# error the op carries on
OVERWRITTEN = {"aten.zero_.default": None, "aten._foreach_zero_.default": None, "aten.fill_.Scalar": (0,),
               "aten.fill_.Tensor": (0,), "aten.copy_.default": (0,)}


def event_key(e: TraceEvent) -> tuple:
    return (e.phase, e.module, e.op, e.call)


def event_label(e: TraceEvent) -> str:
    return f"{e.phase}:{e.module}:{e.op}#{e.call}"


@dataclass
class TensorCheck:
    status: str  # ok, bad, unknown (not comparable)
    reason: str = ""
    metrics: dict = field(default_factory=dict)


def _close(a: float, b: float, bound: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= bound


def compare_tensor_refs(ref: TensorRef, cand: TensorRef, rtol: float, atol: float) -> TensorCheck:
    """Judge one traced tensor of the candidate against the reference's, from summaries and hashes."""
    if ref.pending or cand.pending:
        return TensorCheck(UNKNOWN, "a collective's output (values not summarized in flight)")
    if ref.uninitialized or cand.uninitialized:
        return TensorCheck(UNKNOWN, "uninitialized memory (torch.empty and kin)")
    if ref.shape != cand.shape:
        return TensorCheck(UNKNOWN, f"shape {list(cand.shape)} vs {list(ref.shape)}")
    rs, cs = ref.stats, cand.stats
    dtype_differs = ref.dtype != cand.dtype
    rh, ch = ref.hash, cand.hash
    if not dtype_differs and rh is not None and rh == ch and ":" in rh:
        return TensorCheck(OK, "bitwise equal", {"max_stat_abs_err": 0.0, "rel_l2_err": 0.0})
    # hashes of one algorithm that differ: the bytes differ (else: no hash to go by, summaries decide)
    bytes_differ = rh is not None and ch is not None and ":" in rh and rh.split(":")[0] == ch.split(":")[0]
    if (ref.subclass or cand.subclass) and (rs is None or cs is None):
        return TensorCheck(UNKNOWN, "a tensor subclass (DTensor): judged through the local ops it runs")
    if rs is None or cs is None:
        status = BAD if (dtype_differs or rtol == atol == 0.0) else UNKNOWN
        return TensorCheck(status, "no summaries (empty or unsupported tensor)")
    rmin, rmax, rmean, rl2, rnan, rinf = rs
    cmin, cmax, cmean, cl2, cnan, cinf = cs
    n = 1
    for d in ref.shape:
        n *= d
    diffs = [abs(a - b) for a, b in ((cmin, rmin), (cmax, rmax), (cmean, rmean), (cl2, rl2))
             if math.isfinite(a) and math.isfinite(b)]
    metrics = {
        "max_stat_abs_err": max(diffs) if diffs else math.nan,
        "rel_l2_err": abs(cl2 - rl2) / rl2 if rl2 else (0.0 if cl2 == rl2 else math.inf),
        "ref": {"min": rmin, "max": rmax, "mean": rmean, "l2": rl2, "nan": rnan, "inf": rinf},
        "cand": {"min": cmin, "max": cmax, "mean": cmean, "l2": cl2, "nan": cnan, "inf": cinf},
    }
    if dtype_differs:
        return TensorCheck(BAD, f"dtype {cand.dtype} vs {ref.dtype}", metrics)
    if (rnan, rinf) != (cnan, cinf):
        return TensorCheck(BAD, f"NaN/Inf counts {cnan}/{cinf} vs {rnan}/{rinf}", metrics)
    if rtol == 0.0 and atol == 0.0 and (bytes_differ or rs != cs):
        return TensorCheck(BAD, "bytes differ (exact comparison)", metrics)
    # Summaries are aggregates: an elementwise atol would swamp them (1e-5 hides any error in
    # gradients of 1e-4). Each statistic may move by rtol of the tensor's scale (its RMS, or the
    # statistic itself when larger); atol applies only to tensors whose whole scale is below it.
    rms = abs(rl2) / math.sqrt(n) if n else 0.0
    floor = atol if rms < atol else 0.0
    ok = (_close(cmin, rmin, floor + rtol * max(abs(rmin), rms)) and _close(cmax, rmax, floor + rtol * max(abs(rmax), rms))
          and _close(cmean, rmean, floor + rtol * rms) and _close(cl2, rl2, floor * math.sqrt(n) + rtol * abs(rl2)))
    return TensorCheck(OK if ok else BAD, "within tolerance" if ok else "summaries differ beyond tolerance", metrics)


def _strip(v):
    """Non-tensor arguments as compared: devices and process groups never differ meaningfully."""
    if isinstance(v, (list, tuple)):
        return [_strip(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and set(v) & {"device", "group", "object"}:  # encoded values, see recorders/tracing.py
            return None
        return {k: _strip(x) for k, x in v.items()}
    return v


def argument_difference(ref: TraceEvent, cand: TraceEvent) -> str | None:
    """A description of the first differing non-tensor argument, or None."""
    ra, ca = _strip(ref.args), _strip(cand.args)
    for i, (r, c) in enumerate(zip(ra, ca)):
        if r != c:
            return f"argument {i}: {_show(c)} vs {_show(r)}"
    if len(ra) != len(ca):
        return f"{len(ca)} arguments vs {len(ra)}"
    rk = {k: _strip(v) for k, v in ref.kwargs.items()}
    ck = {k: _strip(v) for k, v in cand.kwargs.items()}
    for k in sorted(set(rk) | set(ck)):
        if rk.get(k) != ck.get(k):
            return f"{k}={_show(ck.get(k))} vs {_show(rk.get(k))}"
    return None


def _show(v) -> str:
    if isinstance(v, dict) and "t" in v and len(v) == 1:
        return f"<tensor {v['t']}>"
    return repr(v)


@dataclass
class RootCause:
    rank: int
    ref_rank: int
    step: int
    level: str
    kind: str  # "op", "argument", "extra op", "collective", "state", "compiled", "unit"
    event: TraceEvent  # the candidate's event (the one named)
    ref_event: TraceEvent | None  # its reference counterpart (None for an extra op)
    reason: str
    check: TensorCheck | None  # the comparison that showed the error
    seen_at: TraceEvent | None = None  # extra op / collective / state: the paired event where it showed
    chain: list[dict] = field(default_factory=list)
    chain_length: int = 0
    unit: dict | None = None  # kind "unit": the narrowest shared unit's op counts (unit_cause.py)

    def to_dict(self) -> dict:
        e = self.event
        return {
            "rank": self.rank, "ref_rank": self.ref_rank, "step": self.step, "level": self.level, "kind": self.kind,
            "phase": e.phase, "module": e.module, "op": e.op, "call": e.call,
            "index": e.index, "src": e.src, "reason": self.reason,
            "inputs": [_tensor_brief(t) for t in e.inputs],
            "outputs": [_tensor_brief(t) for t in e.outputs],
            "metrics": _plain_metrics(self.check.metrics) if self.check else {},
            "seen_at": _event_brief(self.seen_at) if self.seen_at else None,
            "chain": self.chain, "chain_length": self.chain_length, "unit": self.unit,
        }


def _plain_metrics(m: dict) -> dict:
    def fix(v):
        if isinstance(v, float) and not math.isfinite(v):
            return repr(v)
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v
    return fix(m)


def _tensor_brief(t: TensorRef) -> dict:
    out = {"shape": list(t.shape), "dtype": t.dtype, "device": t.device}
    if t.name:
        out["name"] = t.name
    return out


def _event_brief(e: TraceEvent) -> dict:
    out = {"index": e.index, "phase": e.phase, "module": e.module, "op": e.op, "call": e.call, "src": e.src}
    names = [t.name for t in e.outputs if t.name]
    if names:
        out["names"] = names
    return out


@dataclass
class TraceComparison:
    """One (rank, step, level): the alignment and, if found, the root cause."""

    rank: int
    ref_rank: int
    step: int
    level: str
    matched: int
    extra: dict[str, int]  # op -> count, in the candidate only
    missing: dict[str, int]  # op -> count, in the reference only
    not_comparable: int  # paired events with differing shapes (other sharding: ddp vs fsdp)
    root_cause: RootCause | None
    events: list[dict] = field(default_factory=list)  # per candidate event: where, paired, status, error

    def to_dict(self) -> dict:
        return {"rank": self.rank, "ref_rank": self.ref_rank, "step": self.step, "level": self.level,
                "matched": self.matched, "extra": self.extra, "missing": self.missing,
                "not_comparable": self.not_comparable,
                "root_cause": self.root_cause.to_dict() if self.root_cause else None}


def _count(events) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e.op] = out.get(e.op, 0) + 1
    return dict(sorted(out.items()))


def compare_full(ref: TensorRef, cand: TensorRef, rv, cv, rtol: float, atol: float) -> TensorCheck:
    """Judge one traced tensor elementwise from its bytes (both stores kept it, --trace-full):
    |cand - ref| <= atol + rtol * |ref| for every element, NaN where the reference has NaN; whole
    numbers and booleans must be equal. rv, cv: numpy values (bfloat16 widened exactly)."""
    import numpy as np

    if ref.dtype != cand.dtype:
        return TensorCheck(BAD, f"dtype {cand.dtype} vs {ref.dtype}")
    if rv.shape != cv.shape:
        return TensorCheck(UNKNOWN, f"shape {list(cv.shape)} vs {list(rv.shape)}")
    if rv.dtype.kind in "fc":
        r64, c64 = rv.astype(np.float64), cv.astype(np.float64)
        close = np.isclose(c64, r64, rtol=rtol, atol=atol, equal_nan=True)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(c64 - r64)
            finite = np.isfinite(diff)
            max_abs = float(diff[finite].max()) if finite.any() else 0.0
            rl2 = float(np.linalg.norm(r64[np.isfinite(r64)]))
            dl2 = float(np.linalg.norm(diff[finite]))
    else:
        close = rv == cv
        diff = np.abs(cv.astype(np.float64) - rv.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        rl2 = float(np.linalg.norm(rv.astype(np.float64)))
        dl2 = float(np.linalg.norm(diff))
    bad = int(close.size - np.count_nonzero(close))
    metrics = {"max_abs_err": max_abs, "rel_l2_err": dl2 / rl2 if rl2 else (0.0 if dl2 == 0 else math.inf),
               "max_stat_abs_err": math.nan, "elements_beyond": bad, "elements": int(close.size)}
    if bad:
        worst = np.unravel_index(int(np.argmin(close.reshape(-1))), close.shape) if close.ndim else ()
        return TensorCheck(BAD, f"elementwise: {bad} of {close.size} elements beyond rtol={rtol:g} atol={atol:g} "
                                f"(first at {list(map(int, worst))}, max |diff| {max_abs:.4g})", metrics)
    return TensorCheck(OK, "elementwise within tolerance", metrics)


def compare_traces(ref_events: list[TraceEvent], cand_events: list[TraceEvent], tolerances: Tolerances | None = None, *,
                   rank: int = 0, ref_rank: int = 0, step: int = 0, level: str = "ops",
                   ref_full=None, cand_full=None) -> TraceComparison:
    """Align two event streams of one step and search the root cause (see the module docstring).
    ref_full, cand_full: key -> numpy values of a tensor kept whole (--trace-full), or None; where
    both sides kept a tensor's bytes, it is judged elementwise instead of by its summaries."""
    tolerances = tolerances or Tolerances()
    pairs = pair_events(ref_events, cand_events)
    paired_ref = {id(r) for r in pairs.values()}
    extra = [c for c in cand_events if c.index not in pairs]
    missing = [r for r in ref_events if id(r) not in paired_ref]

    def check(r: TensorRef, c: TensorRef) -> TensorCheck:
        tol = tolerances.resolve(TRACE_BY_NAME[level].tolerance if level in TRACE_BY_NAME else "traces",
                                 r.dtype or "float32")
        chk = compare_tensor_refs(r, c, tol.rtol, tol.atol)
        if chk.status == OK and chk.reason == "bitwise equal" or not (r.full and c.full):
            return chk
        if ref_full is None or cand_full is None or chk.status == UNKNOWN and "shape" in chk.reason:
            return chk
        rv, cv = ref_full(r.full), cand_full(c.full)
        if rv is None or cv is None:
            return chk
        return compare_full(r, c, rv, cv, tol.rtol, tol.atol)

    status: dict[int, str] = {}  # candidate event index -> status of its outputs
    by_index = {c.index: c for c in cand_events}
    # the reference's tensors from before the step, by name: what an unpaired op's named leaf is judged against
    ref_leaves = {t.name: t for r in ref_events for t in r.inputs if t.name and t.producer is None}
    candidates: list[RootCause] = []
    not_comparable = 0
    first_out: dict[int, TensorCheck] = {}
    same: set[int] = set()  # paired events whose outputs equal the reference's bit for bit
    last_ok: TraceEvent | None = None  # the latest paired event whose inputs and outputs matched
    near_origin: dict[int, int] = {}  # event -> the unpaired op whose not-equal values it carries on
    via_view: set[int] = set()  # views of a tensor from before the step that differs: judged at their readers
    mixed = mixed_units(ref_events, cand_events)  # units compiled on one side only: no op-level pairing there

    def found(kind, event, ref_event, reason, chk, seen_at=None):
        candidates.append(RootCause(rank, ref_rank, step, level, kind, event, ref_event, reason, chk, seen_at))

    def unit_found(origin: int, consumer: TraceEvent, ref_consumer: TraceEvent, seen: str, chk: TensorCheck) -> None:
        """A difference made where the traces do not pair one to one: name the narrowest unit both
        sides share, never the unpaired op (its counterpart, if any, is unknown)."""
        unit = narrowest_shared_unit(by_index[origin], ref_events, cand_events, pairs, status, OPAQUE, last_ok)
        event = TraceEvent(index=origin, phase=unit["phase"], module=unit["module"], op="", call=unit["call"])
        counts = (f"reference {unit['ref_ops']} ops{_code(unit['ref_compiled'])} vs candidate {unit['cand_ops']}"
                  f"{_code(unit['cand_compiled'])}, {unit['paired']} paired")
        candidates.append(RootCause(rank, ref_rank, step, level, "unit", event, None,
                                    f"the first difference is inside module {unit['module'] or '(top level)'} "
                                    f"({unit['phase']}, call {unit['call']}); the ops there don't pair one to one "
                                    f"({counts}): narrowest shared unit; {seen}", chk, seen_at=consumer, unit=unit))

    def leaf_status(t: TensorRef) -> str:
        ref_leaf = ref_leaves.get(t.name) if t.name else None
        return check(ref_leaf, t).status if ref_leaf is not None else OK  # an unnamed leaf: assumed as given

    for c in cand_events:
        i = c.index
        r = pairs.get(i)
        inputs = c.inputs
        if r is None or c.group is not None:
            # an unpaired op or a collective: no output to compare; judged by its inputs here and
            # by its consumers later
            states = []
            for t in inputs:
                p = t.producer
                if p is None and not t.name and (c.compiled or t.unseen_write):
                    states.append(OPAQUE)  # made by compiled code the trace cannot see
                else:
                    states.append(status.get(p[0], UNKNOWN) if p else leaf_status(t))
            if r is not None and c.group is not None:
                checks = [check(rt, ct) for rt, ct in zip(r.inputs, inputs)]
                states = [ch.status if ch.status != UNKNOWN else s for ch, s in zip(checks, states)]
            if BAD in states:
                status[i] = BAD
            elif not all(s in (OK, SUSPECT, OPAQUE) for s in states):
                status[i] = UNKNOWN
            elif OPAQUE in states or r is None and unit_of(c) in mixed:
                status[i] = OPAQUE
            else:
                status[i] = SUSPECT
            continue
        rin = r.inputs
        if len(rin) != len(inputs):
            status[i] = UNKNOWN
            not_comparable += 1
            continue
        in_states = []
        near: list[tuple[int, int]] = []  # (input, unpaired origin) read within tolerance but not equal
        for k, (rt, ct) in enumerate(zip(rin, inputs)):
            if _overwritten(c, k):
                in_states.append(OK)
                continue
            chk = check(rt, ct)
            p = ct.producer
            pstat = status.get(p[0], UNKNOWN) if p else None
            if chk.status == BAD:
                if p is None and (c.compiled == "inductor" or ct.unseen_write) and not ct.name:
                    # inductor's own kernels run unseen: an input with no producer event was made
                    # by one of them (or before the step); the fault lies between the last event
                    # that still matched and this one
                    after = f" after {event_label(last_ok)}" if last_ok is not None else ""
                    found("compiled", c, r, f"input {k} differs: {chk.reason}; it was computed by compiled "
                                            f"(inductor) code the trace cannot see{after}", chk, seen_at=c)
                elif p is None and c.view or p is not None and p[0] in via_view and c.view:
                    # a view computes nothing and may show memory nothing wrote yet (FSDP2 allocates
                    # its unsharded parameters by resizing their storage, unseen, then copies into
                    # views of them as out= buffers): judged where a real op reads it
                    via_view.add(i)
                elif p is None or p[0] in via_view:
                    through = "" if p is None else f" (through the view {event_label(by_index[p[0]])})"
                    found("state", c, r, f"input {k}{_named(ct)}{through} differs already at the start of the step: "
                                         f"{chk.reason}", chk, seen_at=c)
                elif pstat == OPAQUE:
                    unit_found(p[0], c, r, f"its values reach {event_label(c)} as input {k}: {chk.reason}", chk)
                elif pstat == SUSPECT:
                    producer = by_index[p[0]]
                    kind = "collective" if producer.group is not None else "extra op"
                    found(kind, producer, pairs.get(p[0]), f"its output differs where {event_label(c)} reads it as "
                                                             f"input {k}: {chk.reason}", chk, seen_at=c)
                    status[p[0]] = BAD
            elif chk.status == OK and p is not None and chk.reason != "bitwise equal" and (
                    pstat in (SUSPECT, OPAQUE) or p[0] in near_origin):
                # within tolerance, not equal, and made by an unpaired op or a collective (or
                # carried from one): if this event's output then differs, that op is to blame
                near.append((k, p[0] if pstat in (SUSPECT, OPAQUE) else near_origin[p[0]]))
            elif chk.status == OK and pstat == SUSPECT:
                status[p[0]] = OK  # what it produced matches bit for bit: the unpaired op did no harm
            in_states.append(chk.status)
        out_checks = [check(rt, ct) for rt, ct in zip(r.outputs, c.outputs)]
        out_states = [ch.status for ch in out_checks]
        if out_checks:
            first_out[i] = out_checks[0]
        if all(ch.reason == "bitwise equal" for ch in out_checks):
            same.add(i)
        if UNKNOWN in in_states or UNKNOWN in out_states or len(r.outputs) != len(c.outputs):
            not_comparable += 1
        inputs_ok = all(s == OK for s in in_states)
        # arguments are compared where the event computes the same shapes from the same shapes: a
        # size argument of a differently sharded run (ddp vs fsdp) is layout, not numerics
        same_shapes = len(r.outputs) == len(c.outputs) and all(rt.shape == ct.shape for rt, ct in zip(r.outputs, c.outputs))
        arg = argument_difference(r, c) if UNKNOWN not in in_states and same_shapes else None
        if arg is not None:
            bad_out = next((ch for ch in out_checks if ch.status == BAD), None)
            found("argument", c, r, f"non-tensor {arg}", bad_out)
        elif inputs_ok and BAD in out_states and c.view:
            # a view computes nothing: it shows memory its input's summary did not cover (a window
            # of a larger buffer, allocated but not yet written): no verdict on what it shows
            out_states = [UNKNOWN if st == BAD else st for st in out_states]
        elif inputs_ok and BAD in out_states and near and status.get(near[0][1]) == OPAQUE:
            k, (kin, origin) = out_states.index(BAD), near[0]
            unit_found(origin, c, r, f"its values reach {event_label(c)} as input {kin} within tolerance but not "
                                     f"equal, and that event's output {k} then differs: {out_checks[k].reason}",
                       out_checks[k])
        elif inputs_ok and BAD in out_states and near:
            k, (kin, origin) = out_states.index(BAD), near[0]
            producer = by_index[origin]
            found("collective" if producer.group is not None else "extra op", producer, pairs.get(origin),
                  f"its output reaches {event_label(c)} as input {kin} within tolerance but not equal, and that "
                  f"event's output {k} then differs: {out_checks[k].reason}", out_checks[k], seen_at=c)
            status[origin] = BAD
        elif inputs_ok and BAD in out_states:
            k = out_states.index(BAD)
            found("op", c, r, f"inputs match, output {k} does not: {out_checks[k].reason}", out_checks[k])
        if near and out_states and all(s == OK for s in out_states):
            near_origin[i] = near[0][1]  # carries the unpaired op's not-equal values on
        if BAD in out_states:
            status[i] = BAD
        elif out_states and all(s == OK for s in out_states):
            status[i] = OK
            if inputs_ok:
                last_ok = c
        else:
            status[i] = UNKNOWN if UNKNOWN in out_states or UNKNOWN in in_states else OK

    root = min(candidates, key=lambda rc: rc.event.index) if candidates else None
    if root is not None:
        root.chain, root.chain_length = _chain(root.event, cand_events, same)
    rows = []
    for c in cand_events:
        chk = first_out.get(c.index)
        if chk is None and root is not None and root.event is c and root.check is not None:
            chk = root.check  # an unpaired root cause: its error as its consumer saw it
        m = chk.metrics if chk is not None else {}
        rows.append({"index": c.index, "phase": c.phase, "module": c.module, "op": c.op,
                     "call": c.call, "paired": c.index in pairs, "status": status.get(c.index, UNKNOWN),
                     "rel_l2_err": m.get("rel_l2_err", math.nan), "max_stat_abs_err": m.get("max_stat_abs_err", math.nan),
                     "root_cause": root is not None and root.event is c})
    return TraceComparison(rank, ref_rank, step, level, len(pairs), _count(extra), _count(missing),
                           not_comparable, root, rows)


def _overwritten(event: TraceEvent, k: int) -> bool:
    """Whether the event's input k is only written, never read (OVERWRITTEN)."""
    op = event.op
    if op not in OVERWRITTEN:
        return False
    which = OVERWRITTEN[op]
    return which is None or k in which


def _code(compiled: str | None) -> str:
    return f" (compiled: {compiled})" if compiled else " (eager)"


def _named(t: TensorRef) -> str:
    return f" ({t.name})" if t.name else ""


def _chain(root: TraceEvent, events: list[TraceEvent], same: set[int]) -> tuple[list[dict], int]:
    """The events downstream of the root (by data flow) whose outputs differ from the reference's at
    all (within tolerance or not): the path the error took to the step's named tensors."""
    tainted = {root.index}
    chain = []
    for e in events:
        if e.index <= root.index:
            continue
        if any(t.producer and t.producer[0] in tainted for t in e.inputs):
            if e.index not in same:
                tainted.add(e.index)
                chain.append(_event_brief(e))
    return chain[:CHAIN_LIMIT], len(chain)


def first_root_cause(comparisons: list[TraceComparison]) -> RootCause | None:
    """The root cause to name: the earliest traced step; there, an op's own error before a state
    difference, then execution order, then rank."""
    found = [tc.root_cause for tc in comparisons if tc.root_cause is not None]
    if not found:
        return None
    return min(found, key=lambda rc: (rc.step, rc.kind in ("state", "compiled"), rc.level != "ops", rc.event.index, rc.rank))


def render_root_cause(comparisons: list[TraceComparison], max_chain: int = 8, passed: bool = False) -> list[str]:
    """The human report's lines about traces: what was aligned, and the root cause. passed: the
    verdict passes, so a difference the traces show is only that, never a root cause."""
    if not comparisons:
        return []
    steps = sorted({tc.step for tc in comparisons})
    levels = sorted({tc.level for tc in comparisons})
    out = ["", f"Traces ({', '.join(levels)}) of step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}:"]
    for tc in comparisons:
        line = f"  step {tc.step} rank {tc.rank}: {tc.matched} events paired"
        if tc.extra:
            line += f", extra in candidate: {_ops(tc.extra)}"
        if tc.missing:
            line += f", missing from candidate: {_ops(tc.missing)}"
        if tc.not_comparable:
            line += f", {tc.not_comparable} not comparable (in-flight collective, uninitialized memory or other shapes)"
        out.append(line)
    rc = first_root_cause(comparisons)
    if rc is None:
        out.append("  no root cause: every paired event whose inputs match has matching outputs and arguments")
        return out
    e = rc.event
    where = f"rank {rc.rank}" + (f" (ref rank {rc.ref_rank})" if rc.ref_rank != rc.rank else "")
    if passed:
        out.append(f"  traces differ, values agree: first difference at step {rc.step}, {where}, module "
                   f"{e.module or '(top level)'!s}, {e.op} [{e.phase}, call {e.call}]: {rc.reason}")
        return out
    if rc.kind == "unit":  # no op to name: the ops there do not pair one to one
        out += ["", f"Root cause: step {rc.step}, {where}, inside module {e.module or '(top level)'!s} "
                    f"[{e.phase}, call {e.call}] (unit: the narrowest both traces share)"]
        out.append(f"  {rc.reason}")
    else:
        out += ["", f"Root cause: step {rc.step}, {where}, module {e.module or '(top level)'!s}, "
                    f"{e.op} [{e.phase}, call {e.call}] ({rc.kind})"]
        out.append(f"  {rc.reason}")
        ins = ", ".join(_brief(t) for t in e.inputs) or "-"
        outs = ", ".join(_brief(t) for t in e.outputs) or "-"
        out.append(f"  inputs: {ins}")
        out.append(f"  outputs: {outs}")
    if rc.check is not None and rc.check.metrics:
        m = rc.check.metrics
        ref, cand = m.get("ref", {}), m.get("cand", {})
        if "elements_beyond" in m:  # judged from the bytes both stores kept (--trace-full)
            out.append(f"  error (elementwise): {m['elements_beyond']} of {m['elements']} elements beyond tolerance, "
                       f"max |diff| {_g(m.get('max_abs_err'))}, rel L2 diff {_g(m.get('rel_l2_err'))}")
        else:
            out.append(f"  error: max |stat diff| {_g(m.get('max_stat_abs_err'))}, rel L2 diff {_g(m.get('rel_l2_err'))}; "
                       f"L2 {_g(ref.get('l2'))} -> {_g(cand.get('l2'))}, max {_g(ref.get('max'))} -> {_g(cand.get('max'))}")
    if e.src:
        out.append(f"  source: {e.src}")
    if rc.seen_at is not None and rc.seen_at is not e:
        out.append(f"  seen at: {event_label(rc.seen_at)}")
    if rc.chain_length:
        shown = rc.chain[:max_chain]
        named = [c for c in rc.chain[max_chain:] if c.get("names")]
        steps_ = [_chain_item(c) for c in shown]
        if named:
            steps_.append("...")
            steps_ += [_chain_item(c) for c in named[-4:]]
        out.append(f"  carried on by {rc.chain_length} event{'s' if rc.chain_length > 1 else ''}: " + " -> ".join(steps_))
    return out


def _ops(counts: dict[str, int]) -> str:
    items = [f"{op} x{n}" if n > 1 else op for op, n in counts.items()]
    return ", ".join(items[:4]) + (f", ... ({len(items)} ops)" if len(items) > 4 else "")


def _brief(t: TensorRef) -> str:
    s = f"{t.dtype}{list(t.shape)}"
    return s + (f" {t.name}" if t.name else "")


def _chain_item(c: dict) -> str:
    s = f"{c.get('module') or '.'}:{str(c.get('op')).removeprefix('aten.')}"
    if c.get("names"):
        s += f" => {', '.join(c['names'])}"
    return s


def _g(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.4g}"
