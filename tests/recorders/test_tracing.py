"""recorders/tracing.py's per-tensor summaries and hashes, without a recorder."""

import pytest
import torch

from tracekit.recorders.tracing import _memory_order, summarize


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
