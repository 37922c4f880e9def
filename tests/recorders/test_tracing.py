"""recorders/tracing.py's per-tensor summaries and hashes, without a recorder."""

import json

import pytest
import torch

from tracekit.recorders.tracing import _memory_order, summarize
from tracekit.schemas import load as load_schema
from tracekit.store.trace_events import parse_events


def _as_stored(events):
    """The recorder's events as the store keeps them (JSON) match the schema and parse typed."""
    jsonschema = pytest.importorskip("jsonschema")
    stored = json.loads(json.dumps(events))
    jsonschema.validate(stored, load_schema("trace-event"))
    return parse_events(stored)


def test_transposed_tensor_is_summarized_in_memory_order():
    a = torch.randn(50, 70)
    t, c = summarize(a.t()), summarize(a.t().contiguous())
    assert t["shape"] == c["shape"] == [70, 50]
    mn, mx, mean, l2, nan, inf = t["stats"]
    assert (mn, mx, nan, inf) == tuple(c["stats"][i] for i in (0, 1, 4, 5))
    assert mean == pytest.approx(c["stats"][2], rel=1e-5) and l2 == pytest.approx(c["stats"][3], rel=1e-6)
    # bytes hashed in place under a name that carries the layout: never called equal to another layout
    assert t["hash"].split(":")[0] == "xxh3_64@1,0" and c["hash"].split(":")[0] == "xxh3_64"
    assert summarize(a.clone().t())["hash"] == t["hash"]
    b = a.clone()
    b[3, 4] += 1
    assert summarize(b.t())["hash"] != t["hash"]


@pytest.mark.parametrize("make,dense", [
    (lambda: torch.randn(5, 7).t(), True),
    (lambda: torch.randn(2, 3, 4).permute(2, 0, 1), True),
    (lambda: torch.randn(4, 1, 3).transpose(0, 2), True),
    (lambda: torch.randn(5, 7)[:, ::2], False),
    (lambda: torch.randn(5, 7).t()[1:], False),
])
def test_memory_order_only_for_permuted_dense_blocks(make, dense):
    x = make()
    flat = _memory_order(x)
    assert (flat is not None) == dense
    if dense:
        assert sorted(flat.tolist()) == sorted(x.reshape(-1).tolist())


def test_strided_window_is_hashed_in_logical_order():
    a = torch.randn(6, 8)
    w = a[:, ::2]
    assert summarize(w)["hash"] == summarize(w.contiguous())["hash"]


def test_events_carry_non_tensor_arguments_as_values():
    """Scalars (alpha), dims and dtypes reach each event as comparable values; tensors as {"t": k}."""
    from tracekit.recorders.tracing import Tracer

    tracer = Tracer("ops", None)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    tracer.start(1)
    try:
        x.add(y, alpha=0.5)
        x.sum(dim=[0], dtype=torch.float64)
        x.to(torch.bfloat16)
    finally:
        trace = tracer.stop()
    by_op = {e["op"]: e for e in trace.events}
    add = by_op["aten.add.Tensor"]
    assert add["args"] == [{"t": 0}, {"t": 1}] and add["kwargs"] == {"alpha": 0.5}
    assert [t["shape"] for t in add["inputs"]] == [[3, 4], [3, 4]]
    s = by_op["aten.sum.dim_IntList"]
    assert s["args"][1:] == [[0]] and s["kwargs"] == {"dtype": {"dtype": "float64"}}
    assert s["outputs"][0]["dtype"] == "float64"
    cast = by_op["aten._to_copy.default"]
    assert cast["kwargs"]["dtype"] == {"dtype": "bfloat16"} and cast["outputs"][0]["dtype"] == "bfloat16"
    assert all(e["phase"] == "fwd" and e["src"] and "test_tracing.py" in e["src"] for e in trace.events)
    assert [e.op for e in _as_stored(trace.events)] == [e["op"] for e in trace.events]


def test_a_write_through_a_view_becomes_the_producer_of_its_base():
    """y[0] = nan through a view of y: the next reader of y is fed by that write (the select's
    fill_), not by the op that computed y; a reader of a disjoint part of the same storage is not."""
    from tracekit.recorders.tracing import Tracer

    tracer = Tracer("ops", None)
    g = torch.randn(4, 4)
    tracer.start(1)
    try:
        y = g * 2
        other = y[2:]  # rows 2-3: the write below never touches them
        y.view(-1)[0] = float("nan")
        y.sum()
        other.sum()
    finally:
        trace = tracer.stop()
    ops = [e["op"] for e in trace.events]
    write = next(e for e in trace.events if e["op"].startswith(("aten.fill_", "aten.copy_")))
    mul = ops.index("aten.mul.Tensor")
    total, part = [e for e in trace.events if e["op"] == "aten.sum.default"]
    assert total["inputs"][0]["producer"][0] == write["index"]
    assert total["inputs"][0]["stats"][4] == 1  # the NaN it reads
    assert part["inputs"][0]["producer"][0] != write["index"] and part["inputs"][0]["stats"][4] == 0
    assert trace.events[part["inputs"][0]["producer"][0]]["index"] > mul  # the slice of y, after the mul
    assert _as_stored(trace.events)[total["index"]].inputs[0].producer == (write["index"], 0)


def test_a_functional_collective_is_pending_until_its_wait():
    """A one-rank gloo group: the all-gather's output reads `pending` until wait_tensor returns
    (funcol's autograd wrapper read it in flight: its garbage made clean FSDP pairs differ);
    readers after the wait see its values, with the collective as their producer."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from tracekit.recorders.tracing import Tracer

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        tracer = Tracer("ops", None)
        x = torch.randn(8)
        tracer.start(1)
        try:
            out = funcol.all_gather_single(x, 0, dist.group.WORLD).wait()  # as DTensor's redistribute does
            (out * 1).sum()
        finally:
            trace = tracer.stop()
    finally:
        dist.destroy_process_group()
    by_op = {e["op"]: e for e in trace.events}
    gather = by_op["_c10d_functional.all_gather_into_tensor.default"]
    wait = by_op["_c10d_functional.wait_tensor.default"]
    assert gather["outputs"][0]["pending"] and wait["inputs"][0]["pending"] and wait["inputs"][0]["stats"] is None
    assert wait["outputs"][0]["stats"] is not None  # final once the wait returned
    mul = by_op["aten.mul.Tensor"]
    assert mul["inputs"][0]["producer"][0] == gather["index"]
    assert mul["inputs"][0]["hash"] == wait["outputs"][0]["hash"]
    assert _as_stored(trace.events)[gather["index"]].outputs[0].pending


def test_ddp_copying_reduced_gradients_back_is_backward_work():
    """DDP's reducer copies its all-reduced buckets into each .grad from an engine callback after
    the graph, when no autograd node runs: those copies are phase bwd (they read fwd before), at
    no module; the forward's ops stay fwd. A one-rank gloo group."""
    import torch.distributed as dist

    from tracekit.recorders.tracing import Tracer

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        model(torch.randn(2, 4)).sum().backward()  # DDP's first backward builds its buckets
        tracer = Tracer("ops", model)
        tracer.start(1)
        try:
            model(torch.randn(2, 4)).sum().backward()
        finally:
            trace = tracer.stop()
            tracer.close()
    finally:
        dist.destroy_process_group()
    ops = [(e["phase"], e["op"]) for e in trace.events]
    allreduce = ops.index(("bwd", "c10d.allreduce_.default"))
    after = trace.events[allreduce + 1:]
    assert any(e["op"] == "aten.copy_.default" for e in after)  # the copies into .grad
    assert all(e["phase"] == "bwd" and e["module"] == "" for e in after), [(e["phase"], e["op"]) for e in after]
    assert ("fwd", "aten.addmm.default") in ops
    assert _as_stored(trace.events)[allreduce].group == (0,)  # a collective's process group
