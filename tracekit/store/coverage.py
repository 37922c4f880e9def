"""Typed metadata of what a rank's recording covers: how many of the training optimizer's
parameters it records, under which model(s) they are named, which were left out and why, and
where the recorded output comes from.

Written by the recorder into the rank group's attributes under `coverage`; `from_attrs` checks
what it reads (a malformed value is a ValueError/TypeError/KeyError the reader turns into one
StoreError line). schemas/store-metadata.schema.json (`$defs` `coverage`) describes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEY = "coverage"  # the rank group's attribute

# How the recorded tensors got their names.
NAMED_BY_MODULE = "module"  # fully qualified names below the root module(s)
NAMED_BY_POSITION = "position"  # param0, param1, ...: no called module owns the optimizer's parameters

# Where the recorded `output` comes from.
OUTPUT_ROOT = "root_forward"  # what the root module's forward returned
OUTPUT_NONE = "none"  # no root module: no output is recorded
OUTPUT_OBSERVED = "observed"  # the explicit Recorder: what the script passed to observe()


def _int(v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{v!r} is not a count")
    return v


def _str(v) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    return v


def _strs(v) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise ValueError(f"{v!r} is not a list")
    return tuple(_str(s) for s in v)


@dataclass(frozen=True)
class Root:
    """A module the recorded names start from: its class, the prefix its tensors carry ('' when it
    is the only root) and how many of the optimizer's parameters it owns."""

    class_name: str
    prefix: str
    optimizer_params: int

    def to_attrs(self) -> dict:
        return {"class": self.class_name, "prefix": self.prefix, "optimizer_params": self.optimizer_params}

    @classmethod
    def from_attrs(cls, a: dict) -> "Root":
        return cls(_str(a["class"]), _str(a["prefix"]), _int(a["optimizer_params"]))


@dataclass(frozen=True)
class LeftOut:
    """An optimizer parameter the recording does not hold: its name (param{i}, its place in the
    optimizer's parameter groups, when no module names it), shape and why."""

    name: str
    shape: tuple[int, ...]
    reason: str

    def to_attrs(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "reason": self.reason}

    @classmethod
    def from_attrs(cls, a: dict) -> "LeftOut":
        if not isinstance(a["shape"], list):
            raise ValueError("shape is not a list")
        return cls(_str(a["name"]), tuple(_int(d) for d in a["shape"]), _str(a["reason"]))


@dataclass(frozen=True)
class Coverage:
    optimizer_params: int  # tensors the training optimizer updates (its param_groups)
    recorded: int  # of those, how many the recording names and holds
    named_by: str = NAMED_BY_MODULE
    roots: tuple[Root, ...] = ()
    left_out: tuple[LeftOut, ...] = ()
    output: str = OUTPUT_ROOT
    # submodules of a root that the loop also called outside the root's forward (a chunked loss
    # applying `lm_head` itself): their outputs are not the recorded output
    outside_calls: tuple[str, ...] = field(default=())
    chosen_by: str | None = None  # "--model NAME" when the user named the root

    @property
    def complete(self) -> bool:
        return self.recorded == self.optimizer_params

    def to_attrs(self) -> dict:
        out = {"optimizer_params": self.optimizer_params, "recorded": self.recorded, "named_by": self.named_by,
               "roots": [r.to_attrs() for r in self.roots], "left_out": [x.to_attrs() for x in self.left_out],
               "output": self.output, "outside_calls": list(self.outside_calls)}
        if self.chosen_by is not None:
            out["chosen_by"] = self.chosen_by
        return out

    @classmethod
    def from_attrs(cls, a) -> "Coverage":
        if not isinstance(a, dict):
            raise TypeError("coverage is not an object")
        roots, left = a.get("roots", []), a.get("left_out", [])
        if not isinstance(roots, list) or not isinstance(left, list):
            raise TypeError("roots and left_out must be lists")
        named_by, output = _str(a.get("named_by", NAMED_BY_MODULE)), _str(a.get("output", OUTPUT_ROOT))
        if named_by not in (NAMED_BY_MODULE, NAMED_BY_POSITION) or output not in (OUTPUT_ROOT, OUTPUT_NONE, OUTPUT_OBSERVED):
            raise ValueError(f"unknown named_by {named_by!r} or output {output!r}")
        chosen = a.get("chosen_by")
        cov = cls(_int(a["optimizer_params"]), _int(a["recorded"]), named_by,
                  tuple(Root.from_attrs(r) for r in roots), tuple(LeftOut.from_attrs(x) for x in left), output,
                  _strs(a.get("outside_calls", [])), None if chosen is None else _str(chosen))
        if cov.recorded > cov.optimizer_params:
            raise ValueError("more parameters recorded than the optimizer has")
        return cov
