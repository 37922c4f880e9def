"""Typed trace events: what one traced op (or module call) recorded, parsed once by the store.

The recorder writes an event through `event_record` and each tensor it saw through
`tensor_record` (and `annotate`, for what it learns of a tensor later), so the keys are written
here and nowhere else; readers get `TraceEvent` and
`TensorRef` from `parse_events` (tracekit.store.traces.read_events) and use attributes. The
fields match schemas/trace-event.schema.json and docs/FORMAT.md ("Traces"); a value of the wrong
type is a ValueError/TypeError that read_events turns into one StoreError line. Fields a recorder
leaves out are None, False or empty (never a guessed value). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

N_STATS = 6  # min, max, mean, l2, nan count, inf count


def _is_int(v) -> bool:
    return type(v) is int  # JSON integers only: a bool is no integer here


def _ints(v, what: str) -> tuple[int, ...]:
    if type(v) is not list or not all(type(x) is int for x in v):
        raise ValueError(f"{what} is {v!r}, not a list of integers")
    return tuple(v)


def _str(key: str, v) -> str:
    if type(v) is not str:
        raise TypeError(f"{key!r} is a {type(v).__name__}, not a string")
    return v


def _bool(key: str, v) -> bool:
    if type(v) is not bool:
        raise TypeError(f"{key!r} is {v!r}, not a boolean")
    return v


def _int_list(key: str, v) -> tuple[int, ...]:
    return _ints(v, key)


def _producer(key: str, v) -> tuple[int, int | None]:
    if type(v) is not list or len(v) != 2 or type(v[0]) is not int or not (v[1] is None or type(v[1]) is int):
        raise ValueError(f"producer {v!r} is not [event, output or null]")
    return v[0], v[1]


# Optional fields of a tensor and of an event -> their check (a present null is the default);
# keys no field has are left alone: a newer recorder's additions do not make a store unreadable
_TENSOR_CHECKS = {"producer": _producer, "name": _str, "pending": _bool, "uninitialized": _bool, "subclass": _str,
                  "local": _bool, "global_shape": _int_list, "unseen_write": _bool, "full": _str}
_EVENT_CHECKS = {"src": _str, "group": _int_list, "view": _bool, "compiled": _str}
_NUMBERS = (int, float)


@dataclass(frozen=True)
class TensorRef:
    """One tensor an event read or wrote: its summaries and hash, never its data (`$defs/tensor`)."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    stats: tuple[float, ...] | None  # min, max, mean, l2, nan count, inf count; None: not summarized
    hash: str | None  # "xxh3_64:..." (or "xxh3_64@ORDER:...", "crc32:..." in older stores)
    # (event index, output position) that made it in this step; position None: the event wrote its
    # memory through an argument that is not one of its outputs (a view's base, an out= buffer)
    producer: tuple[int, int | None] | None = None
    name: str | None = None  # "param:NAME", "grad:NAME": the step-level tensor it is
    pending: bool = False  # a collective's output, not summarized in flight
    uninitialized: bool = False  # torch.empty and kin
    subclass: str | None = None  # a tensor subclass's class name (DTensor): judged through its local ops
    local: bool = False  # a DTensor's shard, summarized as the DTensor
    global_shape: tuple[int, ...] | None = None  # that DTensor's shape
    unseen_write: bool = False  # changed since its producer by a write the trace did not see
    full: str | None = None  # the key of its bytes under the step's full/ group (--trace-full)

    @classmethod
    def from_json(cls, t) -> "TensorRef":
        # (run for every tensor of every traced event: type() tests, and only the keys present)
        if type(t) is not dict:
            raise TypeError(f"a tensor is a {type(t).__name__}, not an object")
        shape, dtype, device, stats, digest = t.get("shape"), t.get("dtype"), t.get("device"), t.get("stats"), t.get("hash")
        if type(dtype) is not str or type(device) is not str:
            raise TypeError(f"tensor dtype/device {dtype!r}/{device!r} are not strings")
        if stats is not None:
            if type(stats) is not list or len(stats) != N_STATS or not all(type(x) in _NUMBERS for x in stats):
                raise ValueError(f"tensor stats {stats!r} are not {N_STATS} numbers")
            stats = tuple(stats)
        if digest is not None:
            _str("hash", digest)
        optional = {}
        if len(t) > 5:
            for key in t.keys() & _TENSOR_CHECKS.keys():
                if t[key] is not None:
                    optional[key] = _TENSOR_CHECKS[key](key, t[key])
        return cls(_ints(shape, "tensor shape"), dtype, device, stats, digest, **optional)


@dataclass(frozen=True, eq=False)
class TraceEvent:
    """One op (ops level) or module call (modules level) of a traced step (`$defs/event`). Events
    are compared by identity: two equal-looking events are still two calls."""

    index: int  # execution order within the step
    phase: str  # fwd, bwd, opt
    module: str  # canonical module path; "" outside any module
    op: str  # "aten.addmm.default"; "forward"/"backward" at module level
    call: int  # its count within (phase, module, op)
    args: tuple = ()  # non-tensor arguments as JSON values; tensors {"t": k}, devices, groups encoded
    kwargs: Mapping = field(default_factory=lambda: MappingProxyType({}))
    inputs: tuple[TensorRef, ...] = ()
    outputs: tuple[TensorRef, ...] = ()
    src: str | None = None  # the user's file:line
    group: tuple[int, ...] | None = None  # a collective's process-group ranks
    view: bool = False  # the op returns a view of an input
    compiled: str | None = None  # "inductor": called from inductor's generated code

    @classmethod
    def from_json(cls, e) -> "TraceEvent":
        if type(e) is not dict:
            raise TypeError(f"an event is a {type(e).__name__}, not an object")
        for key in ("index", "call"):
            if not _is_int(e.get(key)):
                raise TypeError(f"event {key} is {e.get(key)!r}, not an integer")
        for key in ("phase", "module", "op"):
            if type(e.get(key)) is not str:
                raise TypeError(f"event {key} is {e.get(key)!r}, not a string")
        args, kwargs, inputs, outputs = e.get("args", []), e.get("kwargs", {}), e.get("inputs", []), e.get("outputs", [])
        if type(args) is not list or type(kwargs) is not dict:
            raise TypeError("event args are not a list, or its kwargs not an object")
        if type(inputs) is not list or type(outputs) is not list:
            raise TypeError("event inputs or outputs are not a list")
        optional = {key: _EVENT_CHECKS[key](key, e[key]) for key in e.keys() & _EVENT_CHECKS.keys() if e[key] is not None}
        return cls(e["index"], e["phase"], e["module"], e["op"], e["call"], tuple(args), MappingProxyType(kwargs),
                   tuple(map(TensorRef.from_json, inputs)), tuple(map(TensorRef.from_json, outputs)), **optional)


def parse_events(raw) -> list[TraceEvent]:
    """A step's events as stored (a JSON list), typed; ValueError/TypeError names the first bad one."""
    if not isinstance(raw, list):
        raise TypeError("events are not a list")
    out = []
    for k, e in enumerate(raw):
        try:
            out.append(TraceEvent.from_json(e))
        except (TypeError, ValueError, KeyError) as err:
            raise type(err)(f"event {k}: {err}") from None
    return out


def tensor_record(shape, dtype: str, device: str, stats, hash: str | None, **flags) -> dict:
    """One tensor of an event as the recorder stores it. `flags`: the optional TensorRef fields
    (pending, uninitialized, subclass, local, global_shape, producer, name, unseen_write, full)."""
    unknown = flags and set(flags) - _TENSOR_OPTIONAL
    if unknown:
        raise TypeError(f"not a trace tensor field: {', '.join(sorted(unknown))}")
    return {"shape": list(shape), "dtype": dtype, "device": device, "stats": stats, "hash": hash, **flags}


def annotate(record: dict, **fields) -> dict:
    """Set optional fields of a tensor_record() in place, as the recorder learns them after the
    summary (its producer, its name, the key of its kept bytes); None removes one."""
    unknown = fields.keys() - _TENSOR_OPTIONAL
    if unknown:
        raise TypeError(f"not a trace tensor field: {', '.join(sorted(unknown))}")
    for key, value in fields.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def event_record(index: int, phase: str, module: str, op: str, call: int, args: list, kwargs: dict,
                 inputs: list, outputs: list, src: str | None, group=None, view: bool = False,
                 compiled: str | None = None) -> dict:
    """One event as the recorder stores it (inputs and outputs: tensor_record()s). Optional fields
    are left out when unset, as stores have always had them."""
    event = {"index": index, "phase": phase, "module": module, "op": op, "call": call,
             "args": args, "kwargs": kwargs, "inputs": inputs, "outputs": outputs, "src": src}
    if group is not None:
        event["group"] = group
    if view:
        event["view"] = True
    if compiled:
        event["compiled"] = compiled
    return event


_TENSOR_OPTIONAL = frozenset(f for f in TensorRef.__dataclass_fields__
                             if f not in ("shape", "dtype", "device", "stats", "hash"))
