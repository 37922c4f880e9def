"""Root cause in every layout: planted faults x layouts (samples/plain, zero-code, torchrun).

Each layout's reference and candidates trace steps 2 and 3; every fault is planted at step 3 on
rank 1, so each candidate's step 2 is a clean traced pair (it must name nothing: 0 in N) and its
step 3 must name the planted rank, module, op and phase. One reference recording per layout; each
cell is one candidate recording, but for the RIDERS, which add their fault to another cell's
launch on another rank (CI time). fsdp runs with --log-norms: full_tensor() of every parameter in
the loop (async functional collectives inside the traced steps).
"""

from __future__ import annotations

import pytest

import tracekit
from tracekit.compare.rootcause import first_root_cause

TRACE = ("--trace", "ops", "--trace-steps", "2:3")
STEPS = 3
LAYOUT_ARGS = {"ddp": (), "fsdp": ("--log-norms",), "tp": (), "simplefsdp_tp": ()}

# fault -> (sample args, what is named: module, op (a prefix or prefixes), phase, kind)
FAULTS = {
    # forward op: module 1 computes leaky_relu instead of relu
    "forward op": (("--fault", "op=act:1:3"), ("1", "aten.leaky_relu", "fwd", "extra op")),
    # backward-only op: module 1's backward rounds its gradient to bfloat16
    "backward op": (("--fault", "op=bwd_bf16:1:3"), ("1", "aten._to_copy", "bwd", "extra op")),
    # in-place write through a view: one element of the first gradient set to NaN
    "inplace view": (("--fault", "nan_grad=1:3"), ("", ("aten.fill_", "aten.copy_"), "fwd", "extra op")),
    # a collective's input: rank 1's loss scaled before backward, so what it feeds the gradient
    # reduction differs; named on rank 1 (the scalar), never at the collective on rank 0
    "collective input": (("--fault", "loss_scale=1:3:1.5"), ("", "aten.mul.Tensor", "fwd", "argument")),
    # optimizer op: rank 1's update of its last parameter runs with 1.5x the learning rate (the
    # update op's alpha); the parameters before it update as the reference's do
    "optimizer op": (("--fault", "opt_lr=1:3:1.5"), ("", "aten.add_", "opt", "argument")),
}
# which cells run where: simplefsdp_tp replaces modules 0 and 2 (faults on module 1 only there)
CELLS = [(layout, fault) for layout in LAYOUT_ARGS for fault in FAULTS
         if not (layout == "simplefsdp_tp" and fault in ("inplace view", "collective input", "optimizer op"))
         and not (layout == "tp" and fault == "optimizer op")]  # (a launch per cell costs CI time)
# cells that share another cell's launch (no launch of their own): a second fault at step 3 on
# another rank, which the first fault's rank-1 error cannot reach before the second fault's own op.
# (layout, cell whose launch) -> (fault, rank, its args)
RIDERS = {
    # tp: rank 1's NaN is written after backward and its gradient sync, so rank 0's update of its
    # last parameter (1.5x lr) reads nothing of it
    ("tp", "inplace view"): ("optimizer op", 0, ("--fault", "opt_lr=0:3:1.5")),
    # simplefsdp_tp (2 x 2: tp groups {0, 1}, {2, 3}): rank 1's leaky ReLU reaches rank 3 only
    # through backward's dp reduce-scatter, after rank 3 scaled its loss in forward
    ("simplefsdp_tp", "forward op"): ("collective input", 3, ("--fault", "loss_scale=3:3:1.5")),
}


def _record(recorded_sample, layout, extra=()):
    return recorded_sample(layout, script="plain", steps=STEPS, extra=(*LAYOUT_ARGS[layout], *extra),
                           record_args=TRACE)[0]


@pytest.mark.parametrize("layout, fault", CELLS, ids=[
    f"{l}-{f.replace(' ', '_')}" + (f"+{RIDERS[l, f][0].replace(' ', '_')}" if (l, f) in RIDERS else "") for l, f in CELLS])
def test_planted_fault_is_named_and_the_clean_step_names_nothing(recorded_sample, layout, fault):
    args, (module, op, phase, kind) = FAULTS[fault]
    rider = RIDERS.get((layout, fault))
    ref = _record(recorded_sample, layout)
    cand = _record(recorded_sample, layout, (*args, *(rider[2] if rider else ())))
    report = tracekit.diff(ref, cand)
    clean = [tc for tc in report.traces if tc.step == 2]
    assert clean and all(tc.root_cause is None for tc in clean), [
        (tc.rank, tc.root_cause.to_dict()) for tc in clean if tc.root_cause]
    assert not report.passed
    rc = first_root_cause(report.traces)
    assert rc is not None and rc is report.root_cause
    got = (rc.step, rc.rank, rc.event.module, rc.event.phase, rc.kind)
    assert got == (3, 1, module, phase, kind) and rc.event.op.startswith(op), (got, rc.event.op, rc.reason)
    if rider:  # the riding cell: its own rank's root cause at step 3
        fault, rank, _ = rider
        _, (module, op, phase, kind) = FAULTS[fault]
        rc = next(tc.root_cause for tc in report.traces if (tc.step, tc.rank) == (3, rank))
        assert rc is not None, f"{fault}: nothing named on rank {rank}"
        got = (rc.event.module, rc.event.phase, rc.kind)
        assert got == (module, phase, kind) and rc.event.op.startswith(op), (fault, got, rc.event.op, rc.reason)
        # a rank with no fault of its own names at most the collective that brought it another's error
        others = {tc.rank: tc.root_cause for tc in report.traces if tc.step == 3 and tc.rank not in (1, rank)}
        assert all(rc is None or rc.kind == "collective" for rc in others.values()), {
            r: rc.to_dict() for r, rc in others.items() if rc}


def test_simplefsdp_tp_inplace_write_and_optimizer_op_in_one_launch(recorded_sample):
    """simplefsdp_tp (compiled, 2 x 2): two faults on two ranks of one candidate, each rank's own
    root cause checked: rank 0 writes a NaN into its first gradient through a view (after the
    gradient reductions, so nothing of it reaches another rank in the step), rank 1 updates its last
    parameter with 1.5x the learning rate. Ranks 2 and 3 and every rank's step 2 name nothing."""
    ref = _record(recorded_sample, "simplefsdp_tp")
    cand = _record(recorded_sample, "simplefsdp_tp", ("--fault", "nan_grad=0:3", "--fault", "opt_lr=1:3:1.5"))
    report = tracekit.diff(ref, cand)
    assert not report.passed
    by = {(tc.step, tc.rank): tc.root_cause for tc in report.traces}
    named = {k: (rc.event.module, rc.event.phase, rc.kind, rc.event.op) for k, rc in by.items() if rc}
    assert set(named) == {(3, 0), (3, 1)}, named  # 0 root causes in the 6 clean pairs
    module, phase, kind, op = named[(3, 0)]
    assert (module, phase, kind) == ("", "fwd", "extra op") and op.startswith(("aten.fill_", "aten.copy_")), named
    module, phase, kind, op = named[(3, 1)]
    assert (module, phase, kind) == ("", "opt", "argument") and op.startswith("aten.add_"), named
