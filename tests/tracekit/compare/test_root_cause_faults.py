"""Root cause to the op: planted op faults are named with their op and module, eager and compiled
(aot_eager), and clean pairs name nothing. In-process, one rank: the sample model and its
planted faults (samples/common/op_faults.py) recorded with tracekit's Recorder and --trace ops."""

import hashlib
import json
import os
import sys

import jsonschema
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tracekit
from tracekit.recorders import RecordConfig, Recorder
from tracekit.schemas import load
from tracekit.store import open_store
from tracekit.store.traces import read_events, trace_steps

from tests.paths import SAMPLES

sys.path.insert(0, SAMPLES)
from common.model import build_model  # noqa: E402
from common.op_faults import FaultSwitch, install_op_fault  # noqa: E402

FAULT_STEP = 2


def record(path, fault=None, compiled=False, lr=0.01, steps=3, trace_steps=(FAULT_STEP, FAULT_STEP), level="ops",
           fault_step=FAULT_STEP, replay_from=None, replay_steps=(1, None), trace_full=(), log_factor=None,
           nan_grad=False):
    """compiled: False (eager), True or "aot_eager", or "inductor". log_factor: each step also
    computes loss * log_factor for a log line, feeding nothing the diff compares. nan_grad: from
    fault_step on, one element of module 0's weight gradient becomes NaN, written through a view."""
    model = build_model(0)
    switch = None
    if fault is not None:
        switch = FaultSwitch(fault, 0, fault_step)
        install_op_fault(model, switch)
    if compiled:
        # a fresh dynamo per run: each model's fault switch is a new guard on the same code, and
        # recompiles pile up to dynamo's limit (then it runs eagerly) across the module's runs
        torch._dynamo.reset()
    run = torch.compile(model, backend="aot_eager" if compiled is True else compiled) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    config = RecordConfig(store=str(path), trace=level, trace_steps=trace_steps, replay_from=replay_from,
                          replay_steps=replay_steps, trace_full=tuple(trace_full))
    with Recorder(model, opt, config=config) as rec:
        for step in range(1, steps + 1):
            if switch is not None:
                switch.update(0, step)
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
            out = run(x)
            loss = F.mse_loss(out, y)
            loss.backward()
            if nan_grad and step >= fault_step:
                with torch.no_grad():
                    model[0].weight.grad.view(-1)[5] = float("nan")
            if log_factor is not None:
                print(f"scaled loss {float(loss.detach() * log_factor)}", file=open(os.devnull, "w"))
            rec.observe(output=out, loss=loss)
            opt.step()
            opt.zero_grad()
    return str(path)


def _line_of(code: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip() == code)


@pytest.fixture(scope="module")
def runs(shared_once):
    """runs(fault, compiled, **record's arguments) -> a store, recorded once per test run whichever
    pytest-xdist worker asks first (conftest's shared_once): this module's tests read the same few
    runs, and a worker that runs some of them reads the others' runs instead of recording (and
    compiling) them again. The stores are only read."""
    cache = {}

    def get(fault=None, compiled=False, **kw):
        key = (fault, compiled, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kw.items())))
        if key not in cache:
            name = f"root-cause-{fault or 'clean'}-{compiled or 'eager'}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"
            def make(folder):
                record(folder / "s", fault, compiled, **kw)  # the store is the result: nothing else to keep

            folder, _ = shared_once(name, make)
            cache[key] = str(folder / "s")
        return cache[key]

    return get


# (fault, exact comparison, expected root cause: kind, module, op)
EXPECTED = {
    "act": (False, "extra op", "1", "aten.leaky_relu.default"),
    "matmul_bf16": (False, "extra op", "0", "aten._to_copy.default"),
    # the same math rounded differently: only an exact comparison can see it
    "reduce_order": (True, "extra op", "2", "aten.flip.default"),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_planted_op_fault_is_named(runs, fault, compiled):
    exact, kind, module, op = EXPECTED[fault]
    report = tracekit.diff(runs(None, compiled), runs(fault, compiled), exact=exact)
    rc = report.root_cause
    assert rc is not None, f"no root cause for {fault}"
    assert (rc.step, rc.kind, rc.event.module, rc.event.op, rc.event.phase) == (FAULT_STEP, kind, module, op, "fwd")
    # the error is carried on to the step-level tensors the diff compares
    named = {n for c in rc.chain for n in c.get("names", [])}
    assert {"grad:0.weight", "param:0.weight"} <= named or {"grad:2.weight", "param:2.weight"} <= named
    if fault == "matmul_bf16":
        assert rc.event.outputs[0].dtype == "bfloat16"
    assert not report.passed or exact  # the faults are visible at step level under default tolerances


def test_reduce_order_is_no_root_cause_within_tolerance(runs):
    """Rounding differences are within the default tolerances: no op is blamed for them."""
    report = tracekit.diff(runs(None), runs("reduce_order"))
    assert report.traces and report.root_cause is None


def test_a_nan_written_through_a_view_of_a_gradient_is_named(runs):
    """The write (a fill_ through a view of the gradient) is what the optimizer's update reads:
    it is named, not the backward op that computed the gradient before it."""
    report = tracekit.diff(runs(None), runs(None, nan_grad=True))
    rc = report.root_cause
    assert rc is not None and rc.kind == "extra op" and rc.event.op in ("aten.fill_.Scalar", "aten.copy_.default")
    assert rc.step == FAULT_STEP and rc.seen_at.phase == "opt" and "NaN" in rc.reason
    assert "grad:0.weight" in {n for c in rc.chain for n in c.get("names", [])} or rc.seen_at.op.startswith("aten.add_")


def test_passing_verdict_names_no_root_cause_where_traces_differ(runs):
    """The candidate's log line computes loss * 3 where the reference's computes loss * 2: the
    traces differ (an argument), the trained values do not. A PASS never carries a root cause:
    the difference is reported as such (text and JSON), and the JSON's root_cause is null."""
    report = tracekit.diff(runs(None, log_factor=2.0), runs(None, log_factor=3.0))
    assert report.passed and report.root_cause is None
    td = report.trace_difference
    assert (td.step, td.kind, td.event.op, td.event.phase) == (FAULT_STEP, "argument", "aten.mul.Tensor", "fwd")
    from tracekit.compare.render import render

    text = render(report)
    assert "Root cause:" not in text
    assert "traces differ, values agree: first difference at step 2, rank 0, module (top level), aten.mul.Tensor" in text
    doc = report.to_dict()
    assert doc["root_cause"] is None and doc["trace_difference"]["op"] == "aten.mul.Tensor"
    jsonschema.validate(json.loads(json.dumps(doc)), load("diff-report"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_clean_pairs_name_no_root_cause(runs, tmp_path, compiled):
    ref = runs(None, compiled)
    again = record(tmp_path / "again", None, compiled)
    report = tracekit.diff(ref, again, exact=True)
    assert report.passed and report.traces
    assert report.root_cause is None
    for tc in report.traces:
        assert tc.matched > 0 and not tc.extra and not tc.missing


def test_eager_against_compiled_names_nothing(runs):
    """aot_eager runs the same aten ops as eager (differently arranged): no false root cause."""
    report = tracekit.diff(runs(None, False), runs(None, True))
    assert report.traces and report.root_cause is None


def test_learning_rate_error_is_a_scalar_argument_of_the_update(runs, tmp_path):
    cand = record(tmp_path / "lr", lr=0.0101, trace_steps=(1, 1))
    ref = runs(None, False, trace_steps=(1, 1))
    rc = tracekit.diff(ref, cand).root_cause
    assert rc is not None and (rc.step, rc.kind, rc.event.phase) == (1, "argument", "opt")
    assert rc.event.op == "aten.add_.Tensor" and "alpha" in rc.reason
    assert "-0.0101" in rc.reason and "-0.01" in rc.reason


def test_root_cause_in_json_report_and_accessor(runs):
    ref, cand = runs(None), runs("act")
    report = tracekit.diff(ref, cand)
    doc = json.loads(json.dumps(report.to_dict()))
    jsonschema.validate(doc, load("diff-report"))
    assert doc["root_cause"]["op"] == "aten.leaky_relu.default" and doc["root_cause"]["module"] == "1"
    assert [t["step"] for t in doc["traces"]] == [FAULT_STEP]
    ds = tracekit.open_diff(ref, cand)
    assert ds.tracekit.root_cause()["op"] == "aten.leaky_relu.default"
    ev = ds.tracekit.events()
    root = ev.where(ev.root_cause, drop=True)
    assert list(root.op.values) == ["aten.leaky_relu.default"] and list(root.module.values) == ["1"]
    # everything before the root cause matches the reference
    before = ev.sel(event=ev.event < int(root.event[0]))
    assert set(before.status.values) <= {"ok", "unknown"}


def test_trace_stream_content(runs):
    rank = open_store(runs(None)).rank(0)
    assert trace_steps(rank.group, "ops") == [FAULT_STEP]
    assert "traces" not in rank.kinds  # traces are not a tensor kind: the tensor diff never sees them
    events = read_events(rank.group, "ops", FAULT_STEP)
    phases = [e.phase for e in events]
    assert phases.index("bwd") > phases.index("fwd") and phases.index("opt") > phases.index("bwd")
    assert phases == sorted(phases, key=["fwd", "bwd", "opt"].index)  # forward, backward, update in order
    addmm = [e for e in events if e.op == "aten.addmm.default" and e.phase == "fwd"]
    assert [e.module for e in addmm] == ["0", "2"]
    x = addmm[0].inputs[1]
    assert x.shape == (64, 128) and x.dtype == "float32" and x.device == "cpu" and len(x.stats) == 6 and x.hash
    # the user's line: the forward's ops point at the model's call, the update's at opt.step()
    here = os.path.basename(__file__)
    assert {e.src.rsplit("/", 1)[-1] for e in addmm} == {f"{here}:{_line_of('out = run(x)')}"}
    assert {e.src.rsplit("/", 1)[-1] for e in events if e.phase == "opt"} == {f"{here}:{_line_of('opt.step()')}"}
    updates = [e for e in events if e.phase == "opt" and e.op.startswith("aten.add_")]
    assert {e.outputs[0].name for e in updates} == {f"param:{n}" for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert all(e.kwargs.get("alpha") == -0.01 for e in updates)
    # a tensor's producer is an earlier event
    assert all(t.producer[0] < e.index for e in events for t in e.inputs if t.producer is not None)


def test_summaries_are_the_tensor_values(runs):
    """min/max/mean/L2 of a traced output are those of the tensor the model computed."""
    rank = open_store(runs(None)).rank(0)
    events = read_events(rank.group, "ops", FAULT_STEP)
    model = build_model(0)
    g = torch.Generator().manual_seed(1)
    x1, y1 = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    F.mse_loss(model(x1), y1).backward()
    opt.step()
    g = torch.Generator().manual_seed(2)
    x2 = torch.randn(64, 128, generator=g)
    h = model[0](x2).detach().double()
    first = next(e for e in events if e.op == "aten.addmm.default")
    mn, mx, mean, l2, nan, inf = first.outputs[0].stats
    assert (mn, mx, nan, inf) == (h.min().item(), h.max().item(), 0, 0)
    # sums accumulate in float32 (see recorders/tracing.py): float32 rounding of a float64 reference
    assert mean == pytest.approx(h.mean().item(), rel=1e-5) and l2 == pytest.approx(h.norm().item(), rel=1e-6)


def test_module_level_trace_names_the_module(runs):
    report = tracekit.diff(runs(None, level="modules"), runs("act", level="modules"))
    rc = report.root_cause
    assert rc is not None and (rc.level, rc.kind, rc.event.module, rc.event.op) == ("modules", "op", "1", "forward")
    events = read_events(open_store(runs(None, level="modules")).rank(0).group, "modules", FAULT_STEP)
    assert [(e.phase, e.module) for e in events if e.op == "forward"] == [("fwd", "0"), ("fwd", "1"), ("fwd", "2"), ("fwd", "")]
    # backward: the gradient each module's backward computed for its input (module 0's and the
    # root's input, the batch, needs none)
    assert [e.module for e in events if e.op == "backward"] == ["2", "1"]


def test_module_level_trace_names_the_module_of_a_backward_only_fault(runs):
    """Module 1's backward rounds the gradient it passes on to bfloat16 (its forward is right): the
    module named is 1, in backward, not module 0 whose output gradient carries the error."""
    report = tracekit.diff(runs(None, level="modules"), runs("bwd_bf16", level="modules"))
    rc = report.root_cause
    assert rc is not None and (rc.level, rc.kind, rc.event.module, rc.event.op, rc.event.phase) == (
        "modules", "op", "1", "backward", "bwd")


def test_op_level_trace_names_the_op_of_a_backward_only_fault(runs):
    report = tracekit.diff(runs(None), runs("bwd_bf16"))
    rc = report.root_cause
    assert rc is not None and (rc.event.module, rc.event.phase) == ("1", "bwd")
    # the casts are extra ops: the one whose output a paired op reads is named (the cast back)
    assert rc.kind == "extra op" and rc.event.op == "aten._to_copy.default"
    assert "bfloat16" in {t.dtype for t in rc.event.inputs + rc.event.outputs}


def test_unlisted_trace_step_is_ignored(runs, tmp_path):
    """A step whose events were written but never listed (a crash in between) does not exist."""
    import shutil

    import zarr

    path = tmp_path / "copy"
    shutil.copytree(runs(None), path)
    g = zarr.open_group(str(path / "rank_0" / "traces" / "ops"), mode="r+")
    g.attrs["steps"] = []
    rank = open_store(path).rank(0)
    assert trace_steps(rank.group, "ops") == []
    assert tracekit.diff(runs(None), str(path)).traces == []


def test_replayed_step_starts_from_the_reference_state(runs, tmp_path):
    """The fault acts from step 1, so step 2 of the candidate starts from other parameters. Replayed
    from the reference (--replay-from REF --replay-steps 2:2), step 2 starts from REF's state: every
    event before the faulty op is bitwise equal, and the op is still named."""
    ref = runs(None)
    plain = record(tmp_path / "plain", "act", fault_step=1)
    replayed = record(tmp_path / "replayed", "act", fault_step=1, replay_from=ref, replay_steps=(2, 2))
    for cand, clean_start in ((plain, False), (replayed, True)):
        report = tracekit.diff(ref, cand, allow_missing=True)
        rc = report.root_cause
        assert (rc.step, rc.event.module, rc.event.op) == (2, "1", "aten.leaky_relu.default")
        ds = tracekit.open_diff(ref, cand, allow_missing=True)
        ev = ds.tracekit.events()
        addmm = ev.where((ev.op == "aten.addmm.default") & (ev.module == "0"), drop=True)
        assert float(addmm.max_stat_abs_err[0]) == 0.0 if clean_start else float(addmm.max_stat_abs_err[0]) > 0.0


def test_report_has_the_root_cause_and_a_per_module_error_plot(runs):
    pytest.importorskip("matplotlib")
    from tracekit.report import build_report
    from tracekit.report.traces import module_errors

    report, html, _ = build_report(runs(None), runs("act"))
    assert "Traces: the root-cause op" in html and "Root cause: step 2, rank 0, module 1" in html
    assert 'alt="error per module"' in html
    order, errs = module_errors(report.traces[0])
    assert order[:3] == ["(top)", "0", "1"] or order[:3] == ["0", "1", "2"]
    fwd = dict(zip(order, errs["fwd"]))
    # forward: module 0 computes as the reference does; the error appears at module 1, the fault
    assert fwd["0"] == 0.0 and fwd["1"] > 0.0 and fwd["2"] > 0.0


# --trace-full: where both stores kept a tensor's bytes, it is judged elementwise. roll_rows keeps
# every summary of module 1's output (a permutation of its rows), so summaries cannot place it.
def test_trace_full_bytes_place_a_fault_summaries_cannot_see(runs):
    ref, cand = runs(None, trace_full=("*",)), runs("roll_rows", trace_full=("*",))
    rc = tracekit.diff(ref, cand).root_cause
    assert rc is not None and (rc.step, rc.kind, rc.event.module, rc.event.op) == (FAULT_STEP, "extra op", "1", "aten.roll.default")
    assert "elementwise" in rc.reason and rc.check.metrics["elements_beyond"] > 0
    # the same pair through summaries only: the roll's output matches them but its hash does not;
    # where the rolled rows meet the unrolled targets the output differs, and the roll (an extra
    # op whose not-equal values got there) is named, from summaries alone
    plain = tracekit.diff(runs(None), runs("roll_rows")).root_cause
    assert plain is not None and (plain.event.module, plain.event.op) == ("1", "aten.roll.default")
    assert "within tolerance but not equal" in plain.reason


def test_trace_full_clean_pair_names_nothing(runs, tmp_path):
    again = record(tmp_path / "again", trace_full=("*",))
    report = tracekit.diff(runs(None, trace_full=("*",)), again)
    assert report.traces and report.root_cause is None


def test_trace_full_elementwise_uses_the_tolerance():
    """Bytes are compared with the kind's rtol/atol, not bitwise: a change inside rtol passes."""
    import numpy as np

    from tracekit.compare.rootcause import compare_full
    from tracekit.store.trace_events import TensorRef

    ref = TensorRef((4,), "float32", "cpu", None, None)
    r = np.array([1.0, 2.0, 3.0, np.nan], dtype=np.float32)
    assert compare_full(ref, ref, r, r * (1 + 1e-7), rtol=1e-5, atol=0.0).status == "ok"
    bad = r.copy()
    bad[1] = 2.1
    chk = compare_full(ref, ref, r, bad, rtol=1e-5, atol=0.0)
    assert chk.status == "bad" and chk.metrics["elements_beyond"] == 1 and "[1]" in chk.reason
    nan_moved = np.array([1.0, 2.0, np.nan, 3.0], dtype=np.float32)
    assert compare_full(ref, ref, r, nan_moved, rtol=1e-5, atol=0.0).status == "bad"


# inductor: its generated kernels are not aten ops, so the mode sees only the ops inductor's code
# calls (extern kernels such as addmm.out/mm.out, fallbacks) and the eager code around the model.
# A fault fused into a kernel is placed between the last event that matched and the first event
# reading what the kernel computed (kind "compiled"); module paths are not known there.
INDUCTOR_EXPECTED = {  # fault: (exact comparison, call index of the fwd addmm.out that reads the fault first)
    "act": (False, 1),  # the ReLU is fused into a kernel between module 0's and module 2's matmul
    "matmul_bf16": (False, 0),  # the casts are fused; module 0's matmul itself runs in bfloat16
    "reduce_order": (True, 1),
}


@pytest.fixture(scope="module")
def inductor():
    import shutil

    try:
        torch._dynamo.reset()
        torch.compile(lambda x: x.sin() + 1, backend="inductor")(torch.ones(3))
    except Exception as e:  # no C++ compiler, or inductor broken on this platform
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        pytest.skip(f"inductor cannot compile on this machine (C++ compiler: {shutil.which('g++') or 'none'}): {first}")
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("fault", sorted(INDUCTOR_EXPECTED))
def test_inductor_places_the_fault_between_visible_ops(runs, inductor, fault):
    exact, call = INDUCTOR_EXPECTED[fault]
    report = tracekit.diff(runs(None, "inductor"), runs(fault, "inductor"), exact=exact)
    rc = report.root_cause
    assert rc is not None
    assert (rc.step, rc.kind, rc.event.phase, rc.event.op, rc.event.call) == (FAULT_STEP, "compiled", "fwd", "aten.addmm.out", call)
    assert rc.event.compiled == "inductor" and "inductor" in rc.reason
    if fault == "matmul_bf16":
        assert rc.event.outputs[0].dtype == "bfloat16"


def test_inductor_clean_pair_names_nothing_and_hides_fused_ops(runs, inductor, tmp_path):
    ref = runs(None, "inductor")
    report = tracekit.diff(ref, record(tmp_path / "again", None, "inductor"), exact=True)
    assert report.passed and report.traces and report.root_cause is None
    events = read_events(open_store(ref).rank(0).group, "ops", FAULT_STEP)
    ops = {e.op for e in events}
    # what inductor hides: the ReLU (fused into a kernel); what it shows: its extern matmuls, the
    # loss and the optimizer's update (outside the compiled model)
    assert not any("relu" in op or "threshold" in op for op in ops)
    assert {"aten.addmm.out", "aten.mm.out", "aten.mse_loss.default", "aten.add_.Tensor"} <= ops
    assert all(e.compiled == "inductor" for e in events if e.op in ("aten.addmm.out", "aten.mm.out"))


def test_inductor_candidate_against_an_eager_reference_names_the_shared_unit_not_an_op(runs, inductor):
    """Compiled against eager: the ops do not pair one to one (extern addmm.out against addmm,
    the ReLU fused away), so no unpaired op is blamed (addmm.out of module 2 was, before); the
    unit both share and holding the fault (module 1, fused) is named, with each side's op count."""
    report = tracekit.diff(runs(None), runs("act", "inductor"))
    rc = report.root_cause
    assert not report.passed and rc is not None
    assert (rc.step, rc.kind, rc.event.phase, rc.event.op) == (FAULT_STEP, "unit", "fwd", "")
    assert "1".startswith(rc.event.module)  # module 1 or a module holding it: never module 2's matmul
    doc = json.loads(json.dumps(report.to_dict()))
    jsonschema.validate(doc, load("diff-report"))
    unit = doc["root_cause"]["unit"]
    assert unit["cand_compiled"] == "inductor" and unit["ref_compiled"] is None
    assert unit["paired"] < unit["cand_ops"] and unit["ref_ops"] > 0
    assert f"reference {unit['ref_ops']} ops (eager) vs candidate {unit['cand_ops']} (compiled: inductor)" in rc.reason
    from tracekit.compare.render import render

    assert "Root cause: step 2, rank 0, inside module" in render(report) and "aten.addmm.out [fwd" not in render(report)
    # the clean compiled candidate against the same eager reference names nothing
    clean = tracekit.diff(runs(None), runs(None, "inductor"))
    assert clean.traces and clean.root_cause is None


def test_a_rank_knows_from_its_listing_whether_it_holds_traces(runs, tmp_path):
    """The diff looks for traces only on ranks whose listing (made at open) holds a traces group."""
    from tracekit.testing import write_store

    traced = open_store(runs(None))
    assert traced.ranks and all(traced.rank(r).traced for r in traced.ranks)
    plain = open_store(write_store(tmp_path / "plain", {0: {1: {"loss": {"loss": np.float32(1.0)}}}}))
    assert not plain.rank(0).traced
    assert tracekit.diff(plain, plain).traces == []
