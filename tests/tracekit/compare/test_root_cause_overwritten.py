"""An op that overwrites a tensor without reading it (zero_grad's zero_, fill_, copy_'s
destination) is not blamed for what the tensor held before the step: a replayed step restarts
from the reference's parameters and optimizer state, not from its gradient buffers, so a buffer a
faulty earlier step left behind differs, then is zeroed. Hand-made event streams, no torch."""

import pytest

from tracekit.compare.rootcause import compare_traces
from tracekit.store.trace_events import parse_events

from tests.tracekit.compare.event_streams import traced_tensor

STATS = {"old": [0.0, 1.0, 0.5, 10.0, 0, 0], "nan": [0.0, 1.0, 0.5, 10.0, 1, 0], "zero": [0.0, 0.0, 0.0, 0.0, 0, 0],
         "x": [-1.0, 2.0, 0.1, 7.0, 0, 0], "y": [-2.0, 3.0, 0.2, 9.0, 0, 0]}


def _t(value, producer=None, name=None):
    return traced_tensor(STATS, value, producer, name)


def _stream(buffer, op="aten.zero_.default", args=(), out="zero"):
    """The step starts by overwriting a gradient buffer the step before left (`buffer`), then
    computes from the batch into it."""
    return parse_events([  # as the store reads them back
        {"index": 0, "phase": "fwd", "module": "", "op": op, "call": 0, "args": list(args), "kwargs": {},
         "inputs": [_t(buffer, name="grad:w")], "outputs": [_t(out)], "src": None},
        {"index": 1, "phase": "fwd", "module": "0", "op": "aten.mm.default", "call": 0, "args": [], "kwargs": {},
         "inputs": [_t("x", name="batch")], "outputs": [_t("y")], "src": None},
        {"index": 2, "phase": "bwd", "module": "0", "op": "aten.add_.Tensor", "call": 0, "args": [], "kwargs": {},
         "inputs": [_t(out, 0), _t("y", 1)], "outputs": [_t("y")], "src": None},
    ])


@pytest.mark.parametrize("op, args", [("aten.zero_.default", ()), ("aten.fill_.Scalar", (0.0,))])
def test_a_differing_buffer_the_step_overwrites_names_nothing(op, args):
    tc = compare_traces(_stream("old", op, args), _stream("nan", op, args))
    assert tc.root_cause is None, tc.root_cause.to_dict()


def test_a_differing_buffer_the_step_reads_is_still_a_state_difference():
    """The same buffer read (an accumulation into it, no zeroing first): the step started from
    another state, and it says so."""
    ref, cand = _stream("old", "aten.mul_.Scalar", (1.0,), out="old"), _stream("nan", "aten.mul_.Scalar", (1.0,), out="nan")
    rc = compare_traces(ref, cand).root_cause
    assert rc is not None and (rc.kind, rc.event.op) == ("state", "aten.mul_.Scalar"), rc
