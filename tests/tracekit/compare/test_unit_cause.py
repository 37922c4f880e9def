"""The narrowest shared unit (tracekit/compare/unit_cause.py), on hand-made event streams: a
compiled feed-forward (2 extern ops, inductor) against its eager form (7 ops), inside the second
call of layers.1. No torch: the streams are what a trace stores."""

from tracekit.compare.rootcause import compare_traces
from tracekit.store.trace_events import parse_events

from tests.tracekit.compare.event_streams import traced_tensor

STATS = {"a": [0.0, 1.0, 0.5, 10.0, 0, 0], "b": [0.0, 2.0, 0.9, 17.0, 0, 0]}


def _t(value, producer=None, name=None):
    return traced_tensor(STATS, value, producer, name)


def _stream(ff_ops, out_value, compiled=None):
    """attention (paired), then the feed-forward's ops (each reads the one before), then the
    norm after it (paired) reading the feed-forward's last output; layers.1 runs twice."""
    events = []

    def add(module, op, inputs, value, **kw):
        events.append({"index": len(events), "phase": "fwd", "module": module, "op": op, "call": 0, "args": [],
                       "kwargs": {}, "inputs": inputs, "outputs": [_t(value)], "src": None, **kw})
        return len(events) - 1

    for call in range(2):  # layers.1 runs twice: the fault is in the second call
        prev = add("layers.1.attention", "aten.mm.default", [_t("a", name="batch")], "a")
        for k, op in enumerate(ff_ops):
            last = k == len(ff_ops) - 1
            value = out_value if (call == 1 and last) else "a"
            extra = {"compiled": compiled} if compiled else {}
            prev = add("layers.1.feed_forward", op, [_t("a", prev)], value, **extra)
        add("layers.1.norm", "aten.mul.Tensor", [_t(out_value if call == 1 else "a", prev)], out_value if call == 1 else "a")
    return parse_events(events)  # as the store reads them back


def test_a_difference_inside_a_unit_whose_ops_do_not_pair_names_the_unit_never_an_op():
    eager = ["aten.mm.default", "aten.t.default", "aten.add.Tensor", "aten.silu.default", "aten.mul.Tensor",
             "aten.mm.default", "aten.view.default"]
    ref = _stream(eager, "a")
    cand = _stream(["aten.mm.out", "aten.addmm.out"], "b", compiled="inductor")
    tc = compare_traces(ref, cand)
    rc = tc.root_cause
    assert rc is not None and rc.kind == "unit"
    assert (rc.event.module, rc.event.phase, rc.event.call, rc.event.op) == ("layers.1.feed_forward", "fwd", 1, "")
    assert rc.unit["ref_ops"] == 7 and rc.unit["cand_ops"] == 2 and rc.unit["paired"] == 0
    assert "reference 7 ops (eager) vs candidate 2 (compiled: inductor)" in rc.reason
    assert rc.seen_at.module == "layers.1.norm"  # where it showed, a paired event
    # what could not be paired is said, never an error
    assert tc.extra == {"aten.addmm.out": 2, "aten.mm.out": 2} and tc.missing["aten.mm.default"] == 4


def test_the_same_streams_without_a_difference_name_nothing():
    eager = ["aten.mm.default", "aten.silu.default", "aten.mul.Tensor"]
    tc = compare_traces(_stream(eager, "a"), _stream(["aten.mm.out"], "a", compiled="inductor"))
    assert tc.root_cause is None and tc.extra and tc.missing


def test_an_eager_extra_op_in_a_unit_both_ran_eagerly_is_still_named():
    """A cast the reference never does, in eager code on both sides: the op is named (extra op)."""
    ref = _stream(["aten.mm.default"], "a")
    cand = _stream(["aten.mm.default", "aten._to_copy.default"], "b")
    rc = compare_traces(ref, cand).root_cause
    assert rc is not None and (rc.kind, rc.event.op, rc.event.module) == ("extra op", "aten._to_copy.default", "layers.1.feed_forward")
