"""Replay: start every recorded step from a reference run's state, so each step's error is its own.

A candidate that drifts from its reference may compute one step wrong, or make a tiny error every
step that compounds. Replay tells them apart: before step k the rank's parameters (and optimizer
state, when the reference recorded it) are overwritten with the reference's values after step k-1,
so what the candidate records at step k is one step taken from the reference state.

The recorder calls `before_step(1)` in start() and `before_step(k + 1)` right after the optimizer
update of step k has been captured, on every rank (zero-code recording starts at the first
optimizer step, after step 1's backward, so there step 1 is the run's own and replay starts at 2).
The reference holds full tensors; each rank copies in its own local shard (DTensor, FSDP2) in
place, so the optimizer and FSDP keep their references to the same storage.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import torch

from tracekit.errors import TracekitError
from tracekit.store.location import canonical
from tracekit.store.kinds import INITIAL_STEP
from tracekit.launch.config import RecordConfig, format_step_range
from tracekit.launch.replay_check import PARAMETERS
from tracekit.recorders.coords import is_dtensor
from tracekit.recorders.optim_state import param_groups_of, state_tensors

if TYPE_CHECKING:  # the store's reader (and zarr) load in Replay.open: only a replaying rank pays for them
    from tracekit.store import RunStore

OPTIMIZER_STATE = "optimizer_state"


class ReplayError(TracekitError):
    """The reference cannot drive this replay (missing tensors, other shapes)."""


def _warn(msg: str) -> None:
    print(f"tracekit replay: {msg}", file=sys.stderr, flush=True)


def copy_full_into(target: torch.Tensor, full: torch.Tensor, what: str) -> None:
    """Overwrite `target` in place with the full tensor `full` (its local shard for a DTensor)."""
    if tuple(full.shape) != tuple(target.shape):
        raise ReplayError(f"{what}: the reference has shape {tuple(full.shape)}, this run {tuple(target.shape)}")
    with torch.no_grad():
        if is_dtensor(target):
            from torch.distributed.tensor import distribute_tensor

            local = target.to_local()  # under no_grad: the DTensor's own storage (a view of it)
            # src_data_rank=None: every rank holds the full tensor already, so slicing is local
            # and uses DTensor's own shard layout (the same torch.chunk split FSDP2 uses).
            shard = distribute_tensor(full.to(device=local.device, dtype=local.dtype), target.device_mesh,
                                      target.placements, src_data_rank=None).to_local()
            local.copy_(shard)
        else:
            target.copy_(full.to(device=target.device, dtype=target.dtype))


def _like(param: torch.Tensor, full: torch.Tensor, group: dict | None) -> torch.Tensor:
    """A new optimizer-state tensor for `param` holding `full` (state the candidate lacks yet)."""
    if tuple(full.shape) == tuple(param.shape) and full.dim() > 0:
        if is_dtensor(param):
            from torch.distributed.tensor import distribute_tensor

            return distribute_tensor(full.to(param.to_local().device), param.device_mesh, param.placements,
                                     src_data_rank=None)
        return full.to(param.device).clone()
    # scalars (Adam's step count) live on the CPU unless the optimizer is capturable or fused
    on_device = group is not None and (group.get("capturable") or group.get("fused"))
    return full.to(param.device if on_device else "cpu").clone()


class Replay:
    """Loads a reference store's state into a rank's parameters and optimizer before each replayed step."""

    def __init__(self, ref: RunStore, ref_rank: int, steps: tuple[int, int | None],
                 params: list[tuple[str, torch.Tensor]], optimizer_of):
        self.ref = ref
        self.ref_rank = ref_rank
        self.view = ref.rank(ref_rank)
        self.steps = steps
        self.params = params
        self._optimizer_of = optimizer_of  # a callable: the zero-code path may learn the optimizer late
        self.replayed: list[int] = []  # steps that ran from the reference state
        self._pending: int | None = None  # loaded for this step, which has not ended yet
        self._param_steps = set(self.view.steps(PARAMETERS))
        self._has_state = OPTIMIZER_STATE in self.view.kinds
        self._state_steps = set(self.view.steps(OPTIMIZER_STATE)) if self._has_state else set()
        self._warned: set[str] = set()

    @classmethod
    def open(cls, config: RecordConfig, rank: int, params, optimizer_of) -> "Replay":
        from tracekit.store import open_store

        ref = open_store(config.replay_from)
        if not ref.ranks:
            raise ReplayError(f"{config.replay_from} holds no ranks to replay from")
        # Every reference rank holds the full tensors; the same rank is the natural match, and a
        # reference with fewer ranks (or written by --ranks) is read from its lowest rank.
        ref_rank = rank if rank in ref.ranks else ref.ranks[0]
        view = ref.rank(ref_rank)
        if PARAMETERS not in view.kinds:
            raise ReplayError(f"{config.replay_from} rank {ref_rank} has no recorded parameters to replay from")
        recorded = {t.name for t in view.tensors(PARAMETERS)}
        missing = [n for n, _ in params if n not in recorded]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ReplayError(f"{config.replay_from} rank {ref_rank} has no parameters named "
                              f"{', '.join(missing[:3])}{more}; replay needs every parameter "
                              "(was the reference recorded with --params, or is it another model?)")
        return cls(ref, ref_rank, config.replay_steps, params, optimizer_of)

    def attrs(self) -> dict:
        """What the rank group records about the replay."""
        return {
            "replay_of": canonical(self.ref.path),
            "replay": {"steps": format_step_range(self.steps), "ref_rank": self.ref_rank,
                       "optimizer_state": self._has_state, "replayed_steps": list(self.replayed)},
        }

    def wants(self, step: int) -> bool:
        lo, hi = self.steps
        return step >= lo and (hi is None or step <= hi)

    def before_step(self, step: int) -> bool:
        """If `step` is replayed, load the reference state after step-1; True when it loaded.

        Called when step-1 has ended, which is when a load for step-1 counts as replayed (the load
        after a run's last step is for a step that never comes)."""
        if self._pending == step:
            # A second optimizer stepped in the same training step (zero-code brackets a step by the
            # training optimizer): its update would land on the reference state just loaded.
            raise ReplayError("replay restarts each step after one optimizer step, but another optimizer "
                              "stepped in the same training step; record this script with the explicit Recorder")
        if self._pending == step - 1:
            self.replayed.append(self._pending)
        self._pending = None
        if not self.wants(step):
            return False
        prev = step - 1
        if prev not in self._param_steps or (self._has_state and prev != INITIAL_STEP and prev not in self._state_steps):
            self._warn_once("missing", f"{self.ref.path} has no state after step {prev} (recorded with --every, "
                                       "or shorter); such steps run on from this run's own state")
            return False
        values = self.view.read_kind(PARAMETERS, prev)
        for name, p in self.params:
            copy_full_into(p, _tensor(values[name]), f"parameter {name}")
        if prev != INITIAL_STEP:
            self._load_optimizer_state(prev)
        self._pending = step
        return True

    def _load_optimizer_state(self, prev: int) -> None:
        optimizer = self._optimizer_of()
        if optimizer is None:
            return
        if not self._has_state:
            if state_tensors(optimizer, self.params):
                self._warn_once("no-state", f"{self.ref.path} has no optimizer_state; only parameters are restored, "
                                            "so momentum/Adam state is this run's own (record the reference with "
                                            "--kinds +optimizer_state for a true replay)")
            return
        values = self.view.read_kind(OPTIMIZER_STATE, prev)
        have = {n for n, _ in state_tensors(optimizer, self.params)}
        extra = sorted(have - set(values))
        if extra:
            raise ReplayError(f"{self.ref.path} step {prev} has no optimizer state {extra[0]} that this run's "
                              "optimizer keeps (another optimizer?)")
        groups = param_groups_of(optimizer)
        with torch.no_grad():
            for name, p in self.params:
                prefix = name + "."
                keys = [k[len(prefix):] for k in values if k.startswith(prefix) and "." not in k[len(prefix):]]
                if not keys:
                    continue
                state = optimizer.state[p]
                for key in keys:
                    full = _tensor(values[prefix + key])
                    if isinstance(state.get(key), torch.Tensor):
                        copy_full_into(state[key], full, f"optimizer state {prefix + key}")
                    else:
                        state[key] = _like(p, full, groups.get(id(p)))

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _warn(msg)


def _tensor(values: np.ndarray) -> torch.Tensor:
    # read_kind gives numpy values (bfloat16 widened exactly to float32); copy_ narrows them back
    # exactly into the target's dtype. A copy: zarr may hand out read-only buffers.
    return torch.from_numpy(np.array(values, copy=True))
