"""Planted faults (--fault SPEC): small, known bugs that diff tests and demos must catch.

Specs (repeatable flag):
  lr_scale=F                 the optimizer's learning rate is multiplied by F
  loss_scale=RANK:STEP:F     that rank's local loss is multiplied by F before backward in that step
                             (the reported global loss is averaged from the scaled local losses)
  nan_grad=RANK:STEP         after backward (gradients already synchronized), one element of that
                             rank's first parameter's local gradient becomes NaN
  reported_loss_scale=STEP:F only the reported/recorded global loss is scaled; training is unchanged
  crash=RANK:STEP:HOW        that rank stops at the start of that step: HOW is raise (a RuntimeError),
                             exit (os._exit(3), no cleanup) or kill (SIGKILL to itself)
  grad_scale=RANK:STEP:F     after backward (gradients already synchronized), every local gradient of
                             that rank is multiplied by F in that step (a one-rank, one-step
                             relative perturbation F - 1 of each gradient tensor)
  opt_lr=RANK:STEP:F         that rank's optimizer step updates its last parameter with the learning
                             rate times F in that step (the other parameters as given): one wrong op
                             of the update, on one parameter and one rank
  stale_grad=STEP            in that step every rank's gradients are replaced, after backward and
                             synchronization, by its gradients of the step before (a buffer not refreshed)
  swap_data=STEP             in that step data-parallel ranks 0 and 1 train on each other's batch
                             slices (a data-sharding bug: rank 0's outputs are rank 1's)
  op=KIND:RANK:STEP[:LAST]   one op of the model is wrong on that rank from that step on (to step
                             LAST if given); KIND is act, matmul_bf16, reduce_order, roll_rows or
                             bwd_bf16 (see op_faults.py). Several op faults may be given if their
                             steps do not overlap (one wrong op per step)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Faults:
    lr_scale: float = 1.0
    loss_scale: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> F
    nan_grad: frozenset[tuple[int, int]] = frozenset()  # {(rank, step)}
    reported_loss_scale: dict[int, float] = field(default_factory=dict)  # step -> F
    grad_scale: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> F
    crash: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, step) -> raise | exit | kill
    # planted op faults, (kind, rank, first step, last step or None: to the end), steps disjoint
    op: tuple[tuple[str, int, int, int | None], ...] = ()
    stale_grad: frozenset[int] = frozenset()  # steps
    swap_data: frozenset[int] = frozenset()  # steps
    opt_lr: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> F for the last parameter

    def local_loss_factor(self, rank: int, step: int) -> float:
        return self.loss_scale.get((rank, step), 1.0)

    def wants_nan_grad(self, rank: int, step: int) -> bool:
        return (rank, step) in self.nan_grad

    def reported_loss_factor(self, step: int) -> float:
        return self.reported_loss_scale.get(step, 1.0)

    def grad_factor(self, rank: int, step: int) -> float:
        return self.grad_scale.get((rank, step), 1.0)

    def last_param_lr_factor(self, rank: int, step: int) -> float:
        return self.opt_lr.get((rank, step), 1.0)

    def crash_at(self, rank: int, step: int) -> str | None:
        return self.crash.get((rank, step))

    @property
    def any(self) -> bool:
        return self != Faults()


CRASHES = ("raise", "exit", "kill")


def _numbers(spec: str, value: str, kinds: tuple[type, ...]) -> list:
    parts = value.split(":")
    if len(parts) != len(kinds):
        shape = ":".join("F" if kind is float else "N" for kind in kinds)
        raise ValueError(f"bad fault {spec!r}: expected {shape} after '='")
    try:
        numbers = [kind(part) for kind, part in zip(kinds, parts)]
    except ValueError:
        raise ValueError(f"bad fault {spec!r}: {value!r} is not made of numbers") from None
    for kind, number in zip(kinds, numbers):
        if kind is int and number < 0:
            raise ValueError(f"bad fault {spec!r}: ranks and steps are non-negative")
    return numbers


def parse_faults(specs: list[str]) -> Faults:
    """Turn the --fault strings into a Faults value; raises ValueError with a one-line message."""
    lr_scale = 1.0
    loss_scale: dict[tuple[int, int], float] = {}
    nan_grad: set[tuple[int, int]] = set()
    reported: dict[int, float] = {}
    grad_scale: dict[tuple[int, int], float] = {}
    crash: dict[tuple[int, int], str] = {}
    opt_lr: dict[tuple[int, int], float] = {}
    op: list[tuple[str, int, int, int | None]] = []
    stale_grad: set[int] = set()
    swap_data: set[int] = set()
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"bad fault {spec!r}: expected NAME=VALUE")
        if name == "lr_scale":
            (factor,) = _numbers(spec, value, (float,))
            lr_scale *= factor
        elif name == "loss_scale":
            rank, step, factor = _numbers(spec, value, (int, int, float))
            loss_scale[(rank, step)] = loss_scale.get((rank, step), 1.0) * factor
        elif name == "nan_grad":
            rank, step = _numbers(spec, value, (int, int))
            nan_grad.add((rank, step))
        elif name == "reported_loss_scale":
            step, factor = _numbers(spec, value, (int, float))
            reported[step] = reported.get(step, 1.0) * factor
        elif name == "grad_scale":
            rank, step, factor = _numbers(spec, value, (int, int, float))
            grad_scale[(rank, step)] = grad_scale.get((rank, step), 1.0) * factor
        elif name == "opt_lr":
            rank, step, factor = _numbers(spec, value, (int, int, float))
            opt_lr[(rank, step)] = opt_lr.get((rank, step), 1.0) * factor
        elif name == "crash":
            rank_step, _, how = value.rpartition(":")
            if how not in CRASHES:
                raise ValueError(f"bad fault {spec!r}: the last field is one of {', '.join(CRASHES)}")
            rank, step = _numbers(spec, rank_step, (int, int))
            crash[(rank, step)] = how
        elif name == "op":
            from .op_faults import OP_FAULTS

            kind, _, rest = value.partition(":")
            if kind not in OP_FAULTS:
                raise ValueError(f"bad fault {spec!r}: the op fault is one of {', '.join(OP_FAULTS)}")
            if rest.count(":") == 2:
                rank, step, last = _numbers(spec, rest, (int, int, int))
                if last < step:
                    raise ValueError(f"bad fault {spec!r}: the last step comes before the first")
            else:
                (rank, step), last = _numbers(spec, rest, (int, int)), None
            for other in op:
                if (last is None or other[2] <= last) and (other[3] is None or step <= other[3]):
                    raise ValueError(f"bad fault {spec!r}: its steps overlap another op fault's (one per step)")
            op.append((kind, rank, step, last))
        elif name in ("stale_grad", "swap_data"):
            (step,) = _numbers(spec, value, (int,))
            (stale_grad if name == "stale_grad" else swap_data).add(step)
        else:
            raise ValueError(
                f"unknown fault {name!r}: use lr_scale, loss_scale, nan_grad, reported_loss_scale, grad_scale, opt_lr, crash, "
                "op, stale_grad or swap_data"
            )
    return Faults(lr_scale, loss_scale, frozenset(nan_grad), reported, grad_scale, crash, tuple(op), frozenset(stale_grad),
                  frozenset(swap_data), opt_lr)
