"""Zero-code records the whole model, named as the user names it, whatever activation
checkpointing, a chunked loss or torch.compile do to the order of module calls (one process; the
FSDP2 run is in test_roots_torchrun.py). The model and loop mimic TorchTitan's: llama_like.py."""

import numpy as np
import pytest
import torch

from tracekit import open_store
from tracekit.errors import TracekitError
from tracekit.recorders import recorder as recorder_module
from tracekit.recorders.names import canonical_name
from tracekit.recorders.roots import Call, find_roots
from tracekit.store import create_store

from tests.recorders import llama_like
from tests.recorders.zerocode_runs import ORIGINAL_BACKWARD, ORIGINAL_CALL, ZeroCodeRun

STEPS = 2
N_PARAMS = 30  # llama_like.TinyLlama: embedding, 3 blocks of 9, norm, lm_head


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(recorder_module, "explicit_recorder_started", False)
    yield
    assert torch.nn.Module.__call__ is ORIGINAL_CALL and torch.autograd.backward is ORIGINAL_BACKWARD


def record(tmp_path, model, call=None, chunked=False, optimizer=None, name="zero", **env):
    """Train `model` for STEPS zero-code recorded; (rank view, forward outputs the loop got)."""
    path = str(tmp_path / name)
    create_store(path, {"launcher": "test"})
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-2)
    with ZeroCodeRun(path, TRACEKIT_KINDS="outputs,parameters,gradients", **env):
        outputs = llama_like.train(model if call is None else call, model, optimizer, STEPS, chunked=chunked)
    return open_store(path).rank(0), outputs


def user_names(model) -> list[str]:
    """The names the user's plain model has (no wrapper parts)."""
    return [canonical_name(n) for n, _ in model.named_parameters()]


PLAIN_NAMES = user_names(llama_like.build())


def eager_selective_chunked(shared_once):
    """record(llama_like.build("selective"), chunked=True), made once per test run (conftest's
    `shared_once`) for the tests that read this configuration (the whole-model test's cell and both
    compile tests' eager side): (rank view, forward outputs the loop got)."""
    def make(folder):
        _, outputs = record(folder, llama_like.build("selective"), chunked=True, name="eager")
        for step, out in enumerate(outputs, 1):
            np.save(folder / f"output-{step}.npy", out.numpy())
        return len(outputs)

    folder, steps = shared_once("roots-eager-selective-chunked", make)
    outputs = [torch.from_numpy(np.load(folder / f"output-{step}.npy")) for step in range(1, steps + 1)]
    return open_store(str(folder / "eager")).rank(0), outputs


@pytest.mark.parametrize("ac", llama_like.AC_MODES)
@pytest.mark.parametrize("chunked", [False, True], ids=["plain_loss", "chunked_loss"])
def test_whole_model_named_from_the_root_under_checkpointing_and_chunked_loss(tmp_path, shared_once, ac, chunked):
    if (ac, chunked) == ("selective", True):
        view, outputs = eager_selective_chunked(shared_once)
    else:
        view, outputs = record(tmp_path, llama_like.build(ac), chunked=chunked)
    cov = view.coverage
    assert (cov.recorded, cov.optimizer_params, cov.left_out) == (N_PARAMS, N_PARAMS, ())
    assert [r.class_name for r in cov.roots] == ["TinyLlama"]
    names = [t.name for t in view.tensors("parameters")]
    assert names == PLAIN_NAMES and "layers.2.attention.wo.weight" in names
    assert sorted(t.name for t in view.tensors("gradients")) == sorted(PLAIN_NAMES)
    # the output is what the root's forward returned (hidden states when the loss applies lm_head)
    assert list(view.read_kind("outputs", 1)) == ["output"]
    for step, out in enumerate(outputs, 1):
        assert np.array_equal(view.read("outputs", step, "output"), out.numpy())
    assert out.shape[-1] == (llama_like.DIM if chunked else llama_like.VOCAB)
    assert cov.outside_calls == (("lm_head",) if chunked else ())


@pytest.mark.parametrize("compiled", ["blocks", "model"])
def test_compile_records_the_same_tensors_as_eager(tmp_path, shared_once, compiled):
    eager_view, _ = eager_selective_chunked(shared_once)
    torch._dynamo.reset()
    if compiled == "blocks":  # TorchTitan's apply_compile: each block compiled in place, after AC
        model = llama_like.build("selective", compile_blocks=True)
        call = model
    else:  # the whole model behind an OptimizedModule (`_orig_mod.` in its parameter names)
        model = llama_like.build("none")
        call = torch.compile(model, backend="aot_eager")
    view, outputs = record(tmp_path, model, call=call, chunked=True, name="compiled")
    assert [t.name for t in view.tensors("parameters")] == [t.name for t in eager_view.tensors("parameters")]
    assert view.coverage.recorded == view.coverage.optimizer_params == N_PARAMS
    assert view.coverage.outside_calls == ("lm_head",)
    for step, out in enumerate(outputs, 1):
        assert np.array_equal(view.read("outputs", step, "output"), out.numpy())


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(llama_like.VOCAB, 3)

    def forward(self, x):
        return self.proj(x)


def test_a_model_and_a_separate_head_each_keep_their_names(tmp_path):
    model, head = llama_like.build(), Head()
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    both = lambda tokens: head(model(tokens))[..., :1].expand(-1, -1, llama_like.VOCAB)  # noqa: E731
    view, _ = record(tmp_path, model, call=both, optimizer=optimizer)
    cov = view.coverage
    assert cov.recorded == cov.optimizer_params == N_PARAMS + 2
    assert [(r.class_name, r.prefix, r.optimizer_params) for r in cov.roots] == [("TinyLlama", "TinyLlama", N_PARAMS),
                                                                                 ("Head", "Head", 2)]
    names = [t.name for t in view.tensors("parameters")]
    assert names == [f"TinyLlama.{n}" for n in PLAIN_NAMES] + ["Head.proj.weight", "Head.proj.bias"]
    # each root's own output, under its prefix: never one model's output as the other's
    outs = view.read_kind("outputs", 1)
    assert sorted(outs) == ["output.Head", "output.TinyLlama"]
    assert outs["output.TinyLlama"].shape[-1] == llama_like.VOCAB and outs["output.Head"].shape[-1] == 3


def test_a_parameter_no_called_module_owns_is_left_out_and_said(tmp_path):
    model = llama_like.build()
    temperature = torch.nn.Parameter(torch.ones(2, 3))  # updated, but owned by no module
    optimizer = torch.optim.SGD([*model.parameters(), temperature], lr=0.1)
    view, _ = record(tmp_path, model, optimizer=optimizer)
    cov = view.coverage
    assert (cov.recorded, cov.optimizer_params) == (N_PARAMS, N_PARAMS + 1)
    assert [(x.name, x.shape) for x in cov.left_out] == [(f"param{N_PARAMS}", (2, 3))]
    assert "no module called" in cov.left_out[0].reason
    with pytest.raises(TracekitError, match=f"left out 1 of {N_PARAMS + 1} optimizer parameters: param{N_PARAMS}"):
        model = llama_like.build()
        record(tmp_path, model, optimizer=torch.optim.SGD([*model.parameters(), temperature], lr=0.1),
               name="strict", TRACEKIT_STRICT="1")


@pytest.mark.parametrize("name", ["Block", "layers.1"])
def test_model_option_names_the_root_by_class_or_path(tmp_path, name):
    model = llama_like.build("full")  # the path skips checkpoint_wrapper's part; the class is inside it
    calls = [Call(model, None, True, 1)]
    params = list(model.parameters())
    if name == "Block":  # three blocks: ambiguous, said so rather than guessed
        with pytest.raises(TracekitError, match="3 different modules match"):
            find_roots(calls, params, name)
        return
    found = find_roots(calls, params, name)
    assert [t for t in found.params] == [n.removeprefix("layers.1.") for n in PLAIN_NAMES if n.startswith("layers.1.")]
    assert found.coverage.recorded == 9 and found.coverage.chosen_by == "--model layers.1"
    assert found.coverage.left_out[0].reason == "not in Block (--model layers.1)"
    with pytest.raises(TracekitError, match="--model Nothing: no module of that class"):
        find_roots(calls, params, "Nothing")


def test_model_option_through_zero_code(tmp_path):
    model, head = llama_like.build(), Head()
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    both = lambda tokens: head(model(tokens))[..., :1].expand(-1, -1, llama_like.VOCAB)  # noqa: E731
    view, outputs = record(tmp_path, model, call=both, optimizer=optimizer, TRACEKIT_MODEL="TinyLlama")
    assert [t.name for t in view.tensors("parameters")] == PLAIN_NAMES  # no prefix: the one root named
    assert view.coverage.recorded == N_PARAMS and view.coverage.chosen_by == "--model TinyLlama"
    assert [x.name for x in view.coverage.left_out] == [f"param{N_PARAMS}", f"param{N_PARAMS + 1}"]
    assert view.read_kind("outputs", 1)["output"].shape[-1] == llama_like.VOCAB  # the model's, not the head's


def test_model_option_sees_the_class_inside_fsdp2_and_checkpoint_wrappers(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg"), 1), rank=0, world_size=1)
    try:
        model = llama_like.build("full")
        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
        assert type(model).__name__ == "FSDPTinyLlama"
        found = find_roots([Call(model, None, True, 1)], list(model.parameters()), "TinyLlama")
        assert found.roots == [("", model)] and found.coverage.roots[0].class_name == "TinyLlama"
        assert list(found.params) == PLAIN_NAMES
        # a block: FSDPBlock inside CheckpointWrapper; the path and the class name find the same one
        by_path = find_roots([Call(model, None, True, 1)], list(model.parameters()), "layers.0")
        assert by_path.coverage.roots[0].class_name == "Block" and by_path.coverage.recorded == 9
    finally:
        dist.destroy_process_group()


def test_a_model_option_root_called_from_inside_has_its_output_from_step_2(tmp_path):
    model = llama_like.build()
    view, _ = record(tmp_path, model, TRACEKIT_MODEL="layers.1")
    assert [t.name for t in view.tensors("parameters")][:2] == ["attention_norm.weight", "attention.wq.weight"]
    assert view.coverage.recorded == 9 and len(view.coverage.left_out) == N_PARAMS - 9
    assert view.steps("outputs") == [2]  # step 1's forward ran before the root was known (docs/ZEROCODE.md)
    assert view.read_kind("outputs", 2)["output"].shape == (llama_like.BATCH, llama_like.SEQ, llama_like.DIM)
