"""Zero-code recording in-process: the step state machine, the model and output it finds, stand-down
and failure handling. The bootstrap and real torchrun jobs are in tests/tracekit/launch/test_bootstrap.py
and test_zerocode_torchrun.py."""

import numpy as np
import pytest
import torch

from tracekit import open_store
from tracekit.recorders import Recorder
from tracekit.recorders import recorder as recorder_module
from tracekit.writer.handoff import WriterFailed
from tracekit.recorders.outermost import OutermostCalls
from tracekit.recorders.zerocode import ZeroCode
from tracekit.store import create_store, finalize_store, is_store

ORIGINAL_CALL = torch.nn.Module.__call__
ORIGINAL_BACKWARD = torch.autograd.backward
KINDS = ("outputs", "loss", "gradients", "parameters", "deltas")


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    monkeypatch.setenv("RANK", "0")  # a worker of a world of one, as far as zero-code can tell
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(recorder_module, "explicit_recorder_started", False)
    yield
    assert torch.nn.Module.__call__ is ORIGINAL_CALL and torch.autograd.backward is ORIGINAL_BACKWARD


def store_at(tmp_path, name="zero"):
    path = str(tmp_path / name)
    create_store(path, {"launcher": "test"})
    return path


class ZeroCodeRun:
    """ZeroCode installed for the duration of a with block, as the bootstrap would install it; the
    store is then finalized as `tracekit record` finalizes it (which derives the global loss)."""

    def __init__(self, store, **env):
        self.store = store
        self.zero = ZeroCode({"TRACEKIT_STORE": store, **env})

    def __enter__(self):
        return self.zero.install()

    def __exit__(self, *exc):
        try:
            self.zero._at_exit()
        finally:
            self.zero.stand_down(final=True)
        if self.zero.recorder is not None and exc[0] is None and is_store(self.store):
            finalize_store(self.store, 0)


def model_of(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


def train(call, optimizers, steps, rec=None, loss_fn=torch.nn.functional.mse_loss):
    outputs = []
    for step in range(1, steps + 1):
        x, y = batch(step)
        out = call(x)
        loss = loss_fn(out, y)
        loss.backward()
        outputs.append((out.detach().clone() if isinstance(out, torch.Tensor) else None, loss.detach().clone()))
        if rec is not None:
            rec.observe(output=out, loss=loss)
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad()
    return outputs


def assert_same_bits(a, b, kinds=KINDS):
    ra, rb = open_store(a).rank(0), open_store(b).rank(0)
    assert ra.completed_steps == rb.completed_steps
    for kind in kinds:
        assert ra.steps(kind) == rb.steps(kind), kind
        for step in ra.steps(kind):
            got, want = ra.read_kind(kind, step), rb.read_kind(kind, step)
            assert sorted(got) == sorted(want), (kind, step)
            for name in got:
                same = np.array_equal(ra.read_bits(kind, step, name), rb.read_bits(kind, step, name))
                assert same, (kind, step, name)


def test_zero_code_records_what_the_explicit_recorder_records(tmp_path):
    explicit = str(tmp_path / "explicit")
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Recorder(model, opt, store=explicit) as rec:
        train(model, [opt], 3, rec)

    recorder_module.explicit_recorder_started = False
    zero = store_at(tmp_path)
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ZeroCodeRun(zero) as run:
        steps = train(model, [opt], 3)
    assert_same_bits(zero, explicit)
    view = open_store(zero).rank(0)
    assert view.attrs["run"]["recorded_by"] == "zero-code" and view.status == "finished"
    # the loss is the scalar backward ran on; with one rank the global loss (its mean) is that value
    for step, (_, loss) in enumerate(steps, 1):
        assert np.array_equal(view.read("loss", step, "loss"), loss.numpy())
    assert run.training is opt


class Wrapper(torch.nn.Module):
    """A wrapper module around the model (like DDP): the outermost call is the wrapper's."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return {"logits": self.module(x), "extra": (x.sum(),)}


def test_output_is_the_outermost_call_owning_the_trained_parameters(tmp_path):
    zero = store_at(tmp_path)
    model = Wrapper(model_of())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_module = torch.nn.MSELoss()  # an outermost call too, but it owns no parameter
    with torch.no_grad():
        model(torch.ones(2, 8))  # an evaluation call before training: not the step's output
    with ZeroCodeRun(zero):
        steps = train(model, [opt], 2, loss_fn=lambda out, y: loss_module(out["logits"], y))
    view = open_store(zero).rank(0)
    assert sorted(view.read_kind("outputs", 1)) == ["output.extra.0", "output.logits"]
    for step in (1, 2):
        x, _ = batch(step)
        assert np.array_equal(view.read("outputs", step, "output.extra.0"), x.sum().numpy())
    # parameter names drop the wrapper's "module." prefix, as the explicit Recorder's do
    assert [t.name for t in view.tensors("parameters")] == ["0.weight", "0.bias", "2.weight", "2.bias"]


class Both(torch.optim.Optimizer):
    """A container that steps inner optimizers (torchtitan's OptimizersContainer does the same)."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__([p for o in inner for g in o.param_groups for p in g["params"]], {})

    def step(self, closure=None):
        for o in self.inner:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.inner:
            o.zero_grad(set_to_none)


@pytest.mark.parametrize("layout", ["siblings", "container"])
def test_several_optimizers_make_one_step(tmp_path, layout):
    zero = store_at(tmp_path)
    model = model_of()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.01)
    optimizers = [first, second] if layout == "siblings" else [Both([first, second])]
    with ZeroCodeRun(zero):
        train(model, optimizers, 3)
    view = open_store(zero).rank(0)
    assert view.completed_steps == [1, 2, 3]
    for step in (1, 2, 3):
        params, before = view.read_kind("parameters", step), view.read_kind("parameters", step - 1)
        deltas = view.read_kind("deltas", step)
        for name in ("0.weight", "2.weight"):  # both optimizers' updates are in the step
            assert np.any(deltas[name] != 0), (step, name)
            assert np.array_equal(deltas[name], params[name] - before[name])


def test_optimizer_setting_names_the_training_optimizer(tmp_path):
    zero = store_at(tmp_path)
    model = model_of()
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # stepped first, not training
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with ZeroCodeRun(zero, TRACEKIT_OPTIMIZER="Adam") as run:
        train(model, [probe, opt], 2)
    assert run.training is opt
    view = open_store(zero).rank(0)
    assert view.completed_steps == [1, 2] and view.attrs["run"]["optimizer"] == "Adam"


def test_explicit_recorder_makes_zero_code_stand_down(tmp_path):
    store = store_at(tmp_path)
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ZeroCodeRun(store) as run:
        with Recorder(model, opt, store=store) as rec:
            train(model, [opt], 2, rec)
        assert run.stood_down and run.recorder is None and not run.calls.roots
        assert torch.autograd.backward is ORIGINAL_BACKWARD
    assert open_store(store).ranks == [0]
    assert open_store(store).rank(0).completed_steps == [1, 2]


def test_compiled_model_is_recorded_without_graph_break_or_recompile(tmp_path):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    zero = store_at(tmp_path)
    model = model_of()
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # fullgraph: a graph break raises
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ZeroCodeRun(zero):
        steps = train(compiled, [opt], 3)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompile after the first step
    view = open_store(zero).rank(0)
    assert view.completed_steps == [1, 2, 3]
    assert [t.name for t in view.tensors("parameters")] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for step, (out, _) in enumerate(steps, 1):
        assert np.array_equal(view.read("outputs", step, "output"), out.numpy())


def test_failure_is_reported_once_and_training_goes_on(tmp_path, capfd):
    not_a_store = tmp_path / "file"
    not_a_store.write_text("not a store")
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ZeroCodeRun(str(not_a_store)) as run:
        steps = train(model, [opt], 3)
    assert run.failed and len(steps) == 3
    err = capfd.readouterr().err
    assert err.count("tracekit: zero-code recording failed on rank 0") == 1, err
    assert "goes on without recording" in err and "Traceback" not in err


def test_strict_failure_fails_the_step(tmp_path):
    not_a_store = tmp_path / "file"
    not_a_store.write_text("not a store")
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ZeroCodeRun(str(not_a_store), TRACEKIT_STRICT="1"):
        with pytest.raises(Exception, match="not a directory"):
            train(model, [opt], 1)


def test_writer_failure_mid_run_keeps_gathering_but_writes_nothing_more(tmp_path, capfd):
    zero = store_at(tmp_path)
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ZeroCodeRun(zero) as run:
        train(model, [opt], 2)  # step 1 is sealed when step 2's backward starts
        run.recorder.flush()
        # a batch of another size: the store keeps one shape per tensor, so the writer process fails
        model(torch.ones(5, 8)).square().mean().backward()  # seals step 2
        opt.step()
        opt.zero_grad()
        train(model, [opt], 1)  # seals step 3, whose write fails in the writer process
        with pytest.raises(WriterFailed, match="tensors changed between steps"):
            run.recorder.flush()
        train(model, [opt], 2)  # handing over step 4 meets the failure
        assert run.failed and not run.stood_down  # still drives the recorder (its collectives)
    assert capfd.readouterr().err.count("zero-code recording failed") == 1
    rank = open_store(zero).rank(0)
    assert rank.completed_steps == [1, 2] and rank.status == "failed"


def test_outermost_calls_ignore_nested_calls_then_follow_the_model():
    calls = OutermostCalls()
    other, outer = model_of(), Wrapper(model_of(1))
    twin, evaluator = Wrapper(outer.module), Wrapper(outer.module)  # other modules around the same parameters
    calls.discover()
    try:
        twin(torch.ones(1, 8))  # an earlier call (a warm-up)
        outer(torch.ones(1, 8))  # the training call: the latest with grad enabled
        other(torch.ones(1, 8))  # a later outermost call, of another model
        with torch.no_grad():
            evaluator(torch.ones(1, 8))  # the latest owning call, but an evaluation
        assert calls.settle(list(outer.parameters())).roots == [("", outer)]
        assert set(calls.take_output()) == {"logits", "extra"}
        outer(torch.zeros(1, 8))
        twin(torch.ones(1, 8))
        assert calls.take_output()["extra"][0].item() == 0.0 and calls.take_output() is None
    finally:
        calls.unwrap()


def test_compiled_optimizer_step_is_reported_not_broken(tmp_path, capfd):
    def compiled_steps(run=None):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = model_of()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = torch.compile(opt.step, backend="eager")  # traces the global optimizer hooks too
        for _ in range(3):
            model(torch.ones(2, 8)).sum().backward()
            step()
            opt.zero_grad()
        return set(torch._dynamo.utils.counters["graph_break"])

    torch_own = compiled_steps()  # torch's optimizer breaks the graph itself
    with ZeroCodeRun(store_at(tmp_path)) as run:
        assert compiled_steps() == torch_own  # our hooks compiled to nothing
    assert run.compiled_optimizer and run.failed
    assert capfd.readouterr().err.count("the optimizer step runs under torch.compile") == 1


def test_reentrant_checkpoint_backward_is_not_the_loss(tmp_path):
    zero = store_at(tmp_path)
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def call(x):  # reentrant checkpointing runs torch.autograd.backward on (1, 1) outputs in the backward pass
        return torch.utils.checkpoint.checkpoint(lambda x: model(x)[:1, :1], x.requires_grad_(), use_reentrant=True)

    with ZeroCodeRun(zero):
        steps = train(call, [opt], 2, loss_fn=lambda out, y: (out - y[:1, :1]).sum())
    view = open_store(zero).rank(0)
    for step, (_, loss) in enumerate(steps, 1):
        assert np.array_equal(view.read("loss", step, "loss"), loss.numpy())


def test_an_optimizer_step_that_raised_does_not_end_recording(tmp_path):
    class Flaky(torch.optim.SGD):
        boom = False

        def step(self, closure=None):
            if self.boom:
                raise RuntimeError("transient failure inside step")
            return super().step(closure)

    model = model_of()
    opt = Flaky(model.parameters(), lr=0.1)
    store = store_at(tmp_path)
    with ZeroCodeRun(store):
        for step in range(1, 6):
            x, y = batch(step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.boom = step == 2  # the pre hooks ran, then step() raised: torch skips the post hooks
            try:
                opt.step()
            except RuntimeError:
                pass
            opt.zero_grad()
    assert open_store(store).rank(0).completed_steps == [1, 2, 3, 4]  # the four updates that happened


def test_replay_refuses_a_second_optimizer_in_the_step(tmp_path, capfd):
    from tracekit.store.tensors import from_torch
    from tracekit.store import RankWriter

    model = model_of()
    ref = store_at(tmp_path, "ref")
    writer = RankWriter(ref, 0, {"coords": {"rank": 0}})
    for step in range(4):
        writer.write(step, "parameters", [from_torch(n, torch.full_like(p.detach(), float(step)))
                                          for n, p in model.named_parameters()])
        if step:
            writer.complete_step(step)
    writer.close()
    first, second = torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[2].parameters(), lr=0.1)
    with ZeroCodeRun(store_at(tmp_path, "rep"), TRACEKIT_REPLAY_FROM=ref) as run:
        train(model, [first, second], 3)
    assert run.failed
    assert "another optimizer stepped after the training optimizer in a replayed step" in capfd.readouterr().err


def test_a_chunked_loss_is_recorded_as_the_total_the_loop_logs(tmp_path):
    """torchtitan's chunked loss runs backward() per chunk and then on the total (step_loss.py):
    zero-code records the total once, not the sum of every backward() scalar (twice the loss)."""
    from tests.recorders.test_step_loss import StepLoss, batch, chunked_step, model_of as chunked_model

    zero = store_at(tmp_path)
    decoder, head = chunked_model()
    opt = torch.optim.SGD([*decoder.parameters(), *head.parameters()], lr=0.1)
    logged = []
    with ZeroCodeRun(zero):
        for step in (1, 2):
            logged.append(chunked_step(decoder, head, *batch(step), StepLoss()))
            opt.step()
            opt.zero_grad()
    view = open_store(zero).rank(0)
    for step, want in enumerate(logged, 1):
        assert view.read_bits("loss", step, "loss").tobytes() == want.numpy().tobytes()
        assert view.read_bits("local_loss", step, "local_loss").tobytes() == want.numpy().tobytes()
