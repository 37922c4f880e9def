"""Replay in-process (a world of one): exactness, one-step errors, step ranges, optimizer state."""

import numpy as np
import jsonschema
import pytest
import torch

from tracekit import open_store
from tracekit.schemas import load, part
from tracekit.errors import UsageError
from tracekit.recorders import RecordConfig, Recorder
from tracekit.launch.config import parse_step_range
from tracekit.recorders.replay import ReplayError

from tests.recorders.replay_runs import KINDS, STEPS, make_model, make_optimizer, record_run, train_step


@pytest.fixture
def runs(shared_once):
    """runs(optimizer): the folder of the recordings several tests read, made once per test run
    (conftest's `shared_once`; each recording starts a writer process): ref (a run), free (the
    candidate: the same run with a bfloat16 forward), rep (the candidate replayed from ref) and
    same (ref's own run replayed from ref), STEPS steps each. Read them, never write them."""
    def get(optimizer):
        def make(folder):
            record_run(folder / "ref", optimizer)
            record_run(folder / "free", optimizer, autocast=True)
            record_run(folder / "rep", optimizer, autocast=True, replay_from=str(folder / "ref"))
            record_run(folder / "same", optimizer, replay_from=str(folder / "ref"))

        return shared_once(f"replay-runs-{optimizer}", make)[0]

    return get


def _views(folder, *names):
    return [open_store(folder / name).rank(0) for name in names]


def _one_step_from(ref, step, optimizer, autocast=True):
    """Independently: the parameters after one candidate step taken from ref's state after step-1."""
    model = make_model()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(ref.read("parameters", step - 1, name).copy()))
    opt = make_optimizer(optimizer, model.parameters())
    if step > 1:  # the reference's optimizer state, loaded through torch's own load_state_dict
        state = ref.read_kind("optimizer_state", step - 1)
        sd = opt.state_dict()
        names = [n for n, _ in model.named_parameters()]
        sd["state"] = {i: {k.removeprefix(n + "."): torch.from_numpy(v.copy()) for k, v in state.items()
                           if k.removeprefix(n + ".") != k} for i, n in enumerate(names)}
        opt.load_state_dict(sd)
    train_step(model, opt, step, autocast)
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


def _max_err(a, b, step):
    return max(float(np.max(np.abs(a.read("parameters", step, t.name) - b.read("parameters", step, t.name))))
               for t in a.tensors("parameters"))


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_replay_of_a_run_against_itself_is_exact_at_every_step(runs, optimizer):
    ref, rep = _views(runs(optimizer), "ref", "same")
    assert rep.completed_steps == list(range(1, STEPS + 1))
    assert rep.attrs["replay"]["replayed_steps"] == list(range(1, STEPS + 1))
    assert set(rep.kinds) == set(ref.kinds) >= {"outputs", "loss", "gradients", "parameters", "deltas", "optimizer_state"}
    for kind in ref.kinds:
        assert rep.steps(kind) == ref.steps(kind)
        for step in ref.steps(kind):
            for t in ref.tensors(kind):
                assert np.array_equal(rep.read_bits(kind, step, t.name), ref.read_bits(kind, step, t.name)), (kind, step, t.name)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_replayed_error_at_step_k_is_the_error_of_one_step_from_the_reference_state(runs, optimizer):
    ref, free, rep = _views(runs(optimizer), "ref", "free", "rep")
    for step in range(1, STEPS + 1):
        expected = _one_step_from(ref, step, optimizer)
        for name, value in expected.items():
            assert np.array_equal(rep.read("parameters", step, name), value), (step, name)
    # the planted error is real, and only the free-running candidate accumulates it
    replayed = [_max_err(ref, rep, s) for s in range(1, STEPS + 1)]
    accumulated = [_max_err(ref, free, s) for s in range(1, STEPS + 1)]
    assert min(replayed) > 0
    assert accumulated[0] == replayed[0]  # step 1 starts from the same initial parameters either way
    assert accumulated[-1] > replayed[-1]


def test_replay_steps_limit_which_steps_restart_from_the_reference(runs, tmp_path):
    ref, free = _views(runs("momentum"), "ref", "free")
    rep = record_run(tmp_path / "rep", autocast=True, replay_from=str(runs("momentum") / "ref"), replay_steps=(3, 4))
    assert rep.attrs["replay"]["replayed_steps"] == [3, 4]
    names = [t.name for t in ref.tensors("parameters")]
    for step in (1, 2):  # before the range: the candidate's own trajectory, bit for bit
        for name in names:
            assert np.array_equal(rep.read_bits("parameters", step, name), free.read_bits("parameters", step, name))
    for step in (3, 4):
        expected = _one_step_from(ref, step, "momentum")
        for name in names:
            assert np.array_equal(rep.read("parameters", step, name), expected[name])
    # step 5 runs on from the candidate's own state after step 4, not from the reference's
    not_replayed = _one_step_from(ref, 5, "momentum")
    assert not all(np.array_equal(rep.read("parameters", 5, n), not_replayed[n]) for n in names)


def test_optimizer_state_is_recorded_under_parameter_names(tmp_path):
    model = make_model()
    opt = make_optimizer("adam", model.parameters())
    with Recorder(model, opt, config=RecordConfig(store=str(tmp_path / "s"), kinds=KINDS)) as rec:
        train_step(model, opt, 1, False, rec)
        expected = {f"{n}.{k}": v.clone() for n, p in model.named_parameters() for k, v in opt.state[p].items()}
    view = open_store(tmp_path / "s").rank(0)
    assert view.steps("optimizer_state") == [1]
    assert {t.name for t in view.tensors("optimizer_state")} == set(expected)
    assert "0.weight.exp_avg_sq" in expected and "2.bias.step" in expected
    for name, value in expected.items():
        assert np.array_equal(view.read("optimizer_state", 1, name), value.numpy())


def test_replay_is_recorded_in_root_and_rank_metadata(runs, tmp_path):
    ref = str(runs("momentum") / "ref")  # STEPS steps: a replay of 2 steps replays step 2 only
    rep = record_run(tmp_path / "rep", steps=2, replay_from=ref, replay_steps=(2, None))
    store = open_store(tmp_path / "rep")
    assert store.meta["replay_of"] == ref
    assert rep.attrs["replay_of"] == ref
    assert rep.attrs["replay"] == {"steps": "2:", "ref_rank": 0, "optimizer_state": True, "replayed_steps": [2]}
    schema = load("store-metadata")
    jsonschema.validate(rep.attrs, part(schema, "rank"))
    jsonschema.validate({"tracekit": store.meta}, schema)


def test_reference_lacking_a_parameter_is_refused_with_names(tmp_path):
    record_run(tmp_path / "ref", steps=1, params=("0.*",))
    with pytest.raises(ReplayError, match=r"no parameters named 2\.weight, 2\.bias"):
        record_run(tmp_path / "rep", steps=1, replay_from=str(tmp_path / "ref"))


def test_reference_without_optimizer_state_restores_parameters_and_says_so(tmp_path, capsys):
    model = make_model()
    opt = make_optimizer("momentum", model.parameters())
    with Recorder(model, opt, config=RecordConfig(store=str(tmp_path / "ref"))) as rec:
        for step in (1, 2):
            train_step(model, opt, step, False, rec)
    rep = record_run(tmp_path / "rep", steps=2, autocast=True, replay_from=str(tmp_path / "ref"))
    assert "no optimizer_state" in capsys.readouterr().err
    assert rep.attrs["replay"]["replayed_steps"] == [1, 2]
    assert rep.attrs["replay"]["optimizer_state"] is False


def test_steps_the_reference_lacks_run_on_from_the_candidate_state(runs, tmp_path, capsys):
    ref = runs("momentum") / "ref"  # STEPS steps
    rep = record_run(tmp_path / "rep", steps=STEPS + 2, replay_from=str(ref))
    # step STEPS + 1 starts from the ref's last step, STEPS + 2 from a state it lacks
    assert rep.attrs["replay"]["replayed_steps"] == list(range(1, STEPS + 2))
    assert f"no state after step {STEPS + 1}" in capsys.readouterr().err


@pytest.mark.parametrize("spec, expected", [
    (None, (1, None)), ("3:7", (3, 7)), ("3:", (3, None)), (":4", (1, 4)), ("5", (5, 5)),
])
def test_step_range_parsing(spec, expected):
    assert parse_step_range(spec) == expected


@pytest.mark.parametrize("spec", ["0:3", "5:2", "a:b", "1:2:3"])
def test_bad_step_ranges_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_step_range(spec)


def test_record_command_refuses_bad_replay_settings_in_one_line(runs, tmp_path):
    from click.testing import CliRunner

    from tracekit.cli.main import main

    ref, out = str(runs("momentum") / "ref"), str(tmp_path / "out")  # STEPS steps
    cases = [
        (["--replay-from", ref, "-o", ref], "is the output store itself"),
        (["--replay-steps", "2:3", "-o", out], "--replay-steps needs --replay-from"),
        (["--replay-from", ref, "--replay-steps", "3:1", "-o", out], "need 1 <= A <= B"),
        (["--replay-from", str(tmp_path / "nope"), "-o", out], "no such store"),
        # issue 39: steps past the reference's states used to run with nothing replayed, exit 0
        (["--replay-from", ref, "--replay-steps", f"{STEPS + 2}:", "-o", out], f"holds states up to step {STEPS}"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["record", *args, "--", "python", "-c", "raise SystemExit(7)"])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()
    assert open_store(ref).rank(0).completed_steps == list(range(1, STEPS + 1))  # the reference is untouched


def test_zero_code_replay_restarts_steps_from_the_second_on(runs, tmp_path, monkeypatch):
    """The zero-code bootstrap starts the recorder at the first optimizer step, after step 1's
    backward: step 1 is the run's own, every later step restarts from the reference."""
    from tracekit.recorders import recorder as recorder_module, zerocode
    from tracekit.launch.config import ENV_KINDS, ENV_REPLAY_FROM, ENV_REPLAY_STEPS, ENV_STORE

    ref, free = _views(runs("momentum"), "ref", "free")
    monkeypatch.setenv("RANK", "0")  # a worker of the recorded job
    # an explicit Recorder that ran in this process (the shared runs', another test's) makes the bootstrap stand down
    monkeypatch.setattr(recorder_module, "explicit_recorder_started", False)
    env = {ENV_STORE: str(tmp_path / "zc"), ENV_KINDS: ",".join(KINDS),
           ENV_REPLAY_FROM: str(runs("momentum") / "ref"), ENV_REPLAY_STEPS: "1:"}
    assert zerocode.install(env) is not None
    try:
        model = make_model()
        opt = make_optimizer("momentum", model.parameters())
        for step in range(1, STEPS + 1):
            train_step(model, opt, step, autocast=True)
    finally:
        zerocode.uninstall()
    rep = open_store(tmp_path / "zc").rank(0)
    assert rep.completed_steps == list(range(1, STEPS + 1))
    assert rep.attrs["replay"]["replayed_steps"] == list(range(2, STEPS + 1))
    for name in (t.name for t in ref.tensors("parameters")):
        assert np.array_equal(rep.read_bits("parameters", 1, name), free.read_bits("parameters", 1, name))
    for step in range(2, STEPS + 1):
        for name, value in _one_step_from(ref, step, "momentum").items():
            assert np.array_equal(rep.read("parameters", step, name), value), (step, name)


def test_report_plots_local_against_accumulated_error(runs, tmp_path):
    from tracekit.report import write_report
    from tracekit.report.html import fmt
    from tracekit.report.replay import replay_errors

    folder = runs("momentum")
    ref, free, rep = _views(folder, "ref", "free", "rep")
    rows, notes = replay_errors(str(folder / "ref"), str(folder / "free"), str(folder / "rep"))
    assert notes == [] and [r.step for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r.accumulated == pytest.approx(_max_err(ref, free, r.step), rel=1e-12)
        assert r.local == pytest.approx(_max_err(ref, rep, r.step), rel=1e-12)
    # a store that is not a replay of REF is flagged, not silently plotted as local error
    assert "does not record being a replay" in replay_errors(str(folder / "ref"), str(folder / "free"),
                                                             str(folder / "free"))[1][0]
    out = tmp_path / "r.html"
    write_report(str(folder / "ref"), str(folder / "free"), str(out), replay=str(folder / "rep"),
                 kinds=["parameters"])
    page = out.read_text()
    assert "Replay: local against accumulated error" in page
    assert f'<td class="num">{fmt(rows[-1].local)}</td>' in page
