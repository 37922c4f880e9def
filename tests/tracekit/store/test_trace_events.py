"""Typed trace events (tracekit/store/trace_events.py): parsed once where the store reads them,
fields matching schemas/trace-event.schema.json, a malformed event one StoreError line."""

import dataclasses

import numpy as np
import pytest

from tracekit.errors import StoreError
from tracekit.schemas import load as load_schema
from tracekit.store import open_store
from tracekit.store.trace_events import TensorRef, TraceEvent, annotate, event_record, parse_events, tensor_record
from tracekit.store.traces import read_events
from tracekit.testing import write_store


def _tensor(**kw):
    return tensor_record([2, 3], "float32", "cpu", [0.0, 1.0, 0.5, 2.0, 0, 0], "xxh3_64:00", **kw)


def _events():
    return [event_record(0, "fwd", "layer", "aten.mm.default", 0, [{"t": 0}], {}, [_tensor(name="param:w")],
                         [_tensor()], "train.py:3"),
            event_record(1, "fwd", "", "aten.add.Tensor", 0, [{"t": 0}, 1.0], {"alpha": 2}, [_tensor(producer=[0, 0]), _tensor(producer=[0, None])],
                         [_tensor(pending=True)], None, group=[0, 1], view=True, compiled="inductor")]


def _store(path, events):
    data = {0: {s: {"loss": {"loss": np.float32(s)}} for s in (1, 2)}}
    return write_store(path, data, traces={0: {2: {"ops": events}}})


def test_fields_match_the_schema():
    defs = load_schema("trace-event")["$defs"]
    assert {f.name for f in dataclasses.fields(TraceEvent)} == set(defs["event"]["properties"])
    assert {f.name for f in dataclasses.fields(TensorRef)} == set(defs["tensor"]["properties"])


def test_the_store_reads_typed_events(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(_events(), load_schema("trace-event"))  # what the recorder's functions write
    first, second = read_events(open_store(_store(tmp_path / "s", _events())).rank(0).group, "ops", 2)
    assert (first.index, first.module, first.op, first.src, first.inputs[0].name) == (0, "layer", "aten.mm.default",
                                                                                      "train.py:3", "param:w")
    assert first.outputs[0].shape == (2, 3) and first.outputs[0].producer is None and first.group is None
    assert second.inputs[0].producer == (0, 0) and second.inputs[1].producer == (0, None) and second.outputs[0].pending and second.group == (0, 1)
    assert second.view and second.compiled == "inductor" and second.kwargs["alpha"] == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.op = "aten.add.Tensor"  # frozen: what the store parsed is what every reader sees


@pytest.mark.parametrize("damage,named", [
    (lambda e: e[1].pop("phase"), "event 1: event phase"),
    (lambda e: e[0]["outputs"][0].update(stats=[1.0, 2.0]), "event 0: tensor stats"),
    (lambda e: e[1]["inputs"][0].update(producer=["0", 0]), "event 1: producer"),
    (lambda e: e[0].update(inputs={"t": 0}), "event 0: event inputs"),
])
def test_a_malformed_event_is_one_store_error(tmp_path, damage, named):
    events = _events()
    damage(events)
    with pytest.raises(StoreError, match=f"trace of ops at step 2: malformed events \\({named}"):
        read_events(open_store(_store(tmp_path / "s", events)).rank(0).group, "ops", 2)


def test_the_recorder_functions_own_the_keys():
    with pytest.raises(TypeError, match="not a trace tensor field: stat"):
        tensor_record([1], "float32", "cpu", None, None, stat=True)
    assert parse_events([event_record(0, "opt", "", "aten.add_.Tensor", 0, [], {}, [], [], None)])[0].view is False
    t = annotate(_tensor(), producer=[3, 0], name="grad:w")
    assert TensorRef.from_json(annotate(t, producer=None)).producer is None and TensorRef.from_json(t).name == "grad:w"
    with pytest.raises(TypeError, match="not a trace tensor field: owner"):
        annotate(t, owner="x")
