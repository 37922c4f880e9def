import json
import os

import jsonschema
import numpy as np
import pytest
import torch

from tracekit import open_store
from tracekit.recorders import RecordConfig, Recorder
from tracekit.writer.handoff import Handoff, WriterFailed
from tracekit.schemas import load, part
from tracekit.store import create_store, finalize_store
from tracekit.store.tensors import from_torch
from tracekit.store.format import FORMAT_VERSION


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)


def _train(model, opt, steps, rec=None, clones=None, raise_at=None):
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 8, generator=g).to(next(model.parameters()).dtype)
        y = torch.randn(32, 4, generator=g).to(x.dtype)
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        if rec is not None:
            rec.observe(output=out, loss=loss)
        if clones is not None:
            clones[step] = {
                "output": out.detach().clone(), "loss": loss.detach().clone(),
                "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                "before": {n: p.detach().clone() for n, p in model.named_parameters()},
            }
        if raise_at == step:
            raise RuntimeError("boom")
        opt.step()
        opt.zero_grad()
        if clones is not None:
            clones[step]["after"] = {n: p.detach().clone() for n, p in model.named_parameters()}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recorded_tensors_equal_loop_tensors_bitwise(tmp_path, dtype):
    model = _model(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clones = {}
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
        _train(model, opt, 3, rec, clones)
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == [1, 2, 3]
    assert rank.steps("parameters") == [0, 1, 2, 3]
    for name, t in initial.items():
        assert np.array_equal(rank.read_bits("parameters", 0, name), _bits(t).reshape(-1))
    for step, c in clones.items():
        assert np.array_equal(rank.read_bits("outputs", step, "output"), _bits(c["output"]).reshape(-1))
        assert np.array_equal(rank.read_bits("loss", step, "loss"), _bits(c["loss"]).reshape(-1))
        for name in c["grads"]:
            assert np.array_equal(rank.read_bits("gradients", step, name), _bits(c["grads"][name]).reshape(-1))
            assert np.array_equal(rank.read_bits("parameters", step, name), _bits(c["after"][name]).reshape(-1))
            delta = c["after"][name] - c["before"][name]
            assert np.array_equal(rank.read_bits("deltas", step, name), _bits(delta).reshape(-1))
            assert rank.tensor("parameters", name).dtype == str(dtype).removeprefix("torch.")


def test_recording_does_not_change_training(tmp_path):
    results = []
    for store in (None, str(tmp_path / "s")):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Recorder(model, opt, store=store, config=RecordConfig()) as rec:
            _train(model, opt, 3, rec)
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_without_store_recorder_is_a_pass_through(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEKIT_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt) as rec:
        assert not rec.enabled
        _train(model, opt, 2, rec)
    assert os.listdir(tmp_path) == []


def test_store_comes_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STORE", str(tmp_path / "env_store"))
    monkeypatch.setenv("TRACEKIT_KINDS", "loss,parameters")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt) as rec:
        _train(model, opt, 2, rec)
    assert open_store(tmp_path / "env_store").rank(0).kinds == ["loss", "parameters"]


def test_every_params_and_kinds_select_what_is_written(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = RecordConfig(store=str(tmp_path / "s"), every=2, params=("2.*",), kinds=("gradients", "parameters"))
    with Recorder(model, opt, config=config) as rec:
        _train(model, opt, 5, rec)
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.kinds == ["gradients", "parameters"]
    assert rank.completed_steps == [2, 4]
    assert rank.steps("parameters") == [0, 2, 4]
    assert [t.name for t in rank.tensors("gradients")] == ["2.weight", "2.bias"]


def test_unselected_rank_writes_nothing(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = RecordConfig(store=str(tmp_path / "s"), ranks=frozenset({0}))
    with Recorder(model, opt, config=config, coords={"rank": 1}) as rec:
        _train(model, opt, 2, rec)
    assert open_store(tmp_path / "s").ranks == []


def test_exception_keeps_completed_steps_and_marks_failure(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(RuntimeError, match="boom"):
        with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
            _train(model, opt, 4, rec, raise_at=3)
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.status == "failed"
    assert rank.completed_steps == [1, 2]
    assert rank.steps("gradients") == [1, 2]


def test_wrapper_prefixes_are_stripped_from_names(tmp_path):
    model = _model()
    compiled_like = torch.nn.Module()
    compiled_like._orig_mod = model  # the attribute torch.compile uses for the wrapped module
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(compiled_like, opt, store=str(tmp_path / "s")) as rec:
        _train(model, opt, 1, rec)
    names = [t.name for t in open_store(tmp_path / "s").rank(0).tensors("parameters")]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_written_metadata_validates_against_schema(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, store=str(tmp_path / "s"), run_info={"mode": "plain", "seed": 0}) as rec:
        _train(model, opt, 2, rec)
    finalize_store(str(tmp_path / "s"), 0)
    schema = load("store-metadata")
    root = json.load(open(tmp_path / "s" / "zarr.json"))["attributes"]
    jsonschema.validate(root, schema)
    jsonschema.validate(json.load(open(tmp_path / "s" / "rank_0" / "zarr.json"))["attributes"], part(schema, "rank"))
    kind = json.load(open(tmp_path / "s" / "rank_0" / "gradients" / "zarr.json"))["attributes"]
    jsonschema.validate(kind, part(schema, "kind"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tracekit": {**root["tracekit"], "format_version": FORMAT_VERSION + 1}}, schema)


def _handoff(tmp_path, max_bytes, monkeypatch=None, mbps=None):
    if mbps is not None:
        monkeypatch.setenv("TRACEKIT_WRITE_MBPS", str(mbps))  # a slow disk, in the writer process
    create_store(str(tmp_path / "s"), {})
    return Handoff(str(tmp_path / "s"), 0, {"coords": {"rank": 0}}, max_bytes)


def test_handoff_bounds_spooled_bytes_and_keeps_order(tmp_path, monkeypatch):
    ho = _handoff(tmp_path, max_bytes=100_000, monkeypatch=monkeypatch, mbps=1)  # 40 ms per 40 kB entry
    values = [torch.full((10_000,), float(i)) for i in range(1, 9)]  # 40 kB each
    for i, v in enumerate(values, 1):
        ho.put(i, [("parameters", from_torch("w", v))], complete=True)
    assert 40_000 < ho.peak_pending <= 100_000  # entries did wait, and never more than the cap
    ho.close("finished")
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == list(range(1, 9)) and rank.status == "finished"
    for i, v in enumerate(values, 1):
        assert torch.equal(torch.from_numpy(rank.read("parameters", i, "w")), v)
    assert not os.path.exists(ho.spool)  # the spool is gone once written


def test_handoff_reports_a_writer_failure_at_the_next_handoff(tmp_path):
    ho = _handoff(tmp_path, max_bytes=1 << 20)
    ho.put(1, [("parameters", from_torch("w", torch.zeros(3)))], complete=True)
    ho.put(2, [("parameters", from_torch("w", torch.zeros(4)))], complete=True)  # the store refuses: shape changed
    with pytest.raises(WriterFailed, match="tensors changed between steps"):
        ho.flush()
    with pytest.raises(WriterFailed, match="tensors changed between steps"):
        ho.put(3, [("parameters", from_torch("w", torch.zeros(3)))], complete=True)
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == [1] and rank.status == "failed"


def test_provisional_capture_is_replaced_until_sealed_and_kept_if_never_sealed(tmp_path):
    ho = _handoff(tmp_path, max_bytes=1 << 20)
    ho.put(1, [("loss", from_torch("loss", torch.tensor(1.0)))], complete=True)
    ho.provisional(2, [("loss", from_torch("loss", torch.tensor(2.0)))])
    ho.provisional(2, [("loss", from_torch("loss", torch.tensor(2.5)))])  # a second optimizer of step 2
    ho.flush()  # sealed entries only: step 2 may still change
    ho.close("terminated")  # never sealed: the writer stores its last capture
    rank = open_store(tmp_path / "s").rank(0)
    assert rank.completed_steps == [1, 2] and rank.status == "terminated"
    assert float(rank.read("loss", 2, "loss")) == 2.5


def test_neuron_fallback_ops_and_version_are_recorded_with_a_fake_torch_neuronx(tmp_path, monkeypatch):
    import sys
    import types

    fake = types.ModuleType("torch_neuronx")
    fake.__version__ = "2.9.0.fake"
    fake.get_fallback_ops = lambda: ["aten::_fft_r2c", "aten::linalg_eigh"]
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
        _train(model, opt, 1, rec)
    attrs = open_store(tmp_path / "s").rank(0).attrs
    assert attrs["fallback_ops"] == ["aten::_fft_r2c", "aten::linalg_eigh"]
    assert attrs["versions"]["torch-neuronx"] == "2.9.0.fake"


def test_without_torch_neuronx_no_fallback_ops_are_claimed(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails, as on a CUDA or CPU machine
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, store=str(tmp_path / "s")) as rec:
        _train(model, opt, 1, rec)
    attrs = open_store(tmp_path / "s").rank(0).attrs
    assert "fallback_ops" not in attrs and "torch-neuronx" not in attrs["versions"]


def test_closed_recorders_do_not_keep_models_alive(tmp_path):
    import gc
    import weakref

    refs = []
    for i in range(3):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Recorder(model, opt, store=str(tmp_path / f"s{i}")) as rec:
            _train(model, opt, 1, rec)
        refs.append(weakref.ref(model))
        del model, opt, rec
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
