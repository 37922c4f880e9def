"""Planted faults are caught at the right place: a tiny data-parallel training run in-process,
recorded with the writer, once as the reference and once with a fault."""

import numpy as np
import pytest
import torch

import tracekit
from tracekit.testing import assert_stores_close, write_store

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 16


def train(world=2, steps=6, lr=0.1, lr_scale=1.0, loss_scale=None, nan_grad=None, reported_loss_scale=None, target_scale=3.0):
    """Simulated DDP: each rank sees its slice of a fixed global batch, gradients are averaged.

    Computed in float64 and recorded in float32, so runs with different world sizes record the
    same full tensors. Faults: lr_scale (the candidate's SGD uses lr * lr_scale),
    loss_scale=(rank, step, factor) scales one rank's local loss before backward,
    nan_grad=(rank, step) puts a NaN in one rank's averaged gradient (and so in its update),
    reported_loss_scale=(step, factor) scales only the recorded loss.
    """
    g = torch.Generator().manual_seed(0)
    init = {"0.weight": torch.randn(HIDDEN, IN, generator=g, dtype=torch.float64) * 0.5,
            "0.bias": torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1,
            "2.weight": torch.randn(OUT, HIDDEN, generator=g, dtype=torch.float64) * 0.5,
            "2.bias": torch.zeros(OUT, dtype=torch.float64)}
    params = [{k: v.clone() for k, v in init.items()} for _ in range(world)]  # one replica per rank
    f32 = lambda t: t.detach().to(torch.float32).numpy().copy()  # noqa: E731
    data = {r: {0: {"parameters": {k: f32(v) for k, v in init.items()}}} for r in range(world)}
    per = BATCH // world
    for step in range(1, steps + 1):
        gs = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(BATCH, IN, generator=gs, dtype=torch.float64)
        y = torch.randn(BATCH, OUT, generator=gs, dtype=torch.float64) * target_scale
        outs, local_losses, grads = [], [], []
        for r in range(world):
            p = {k: v.clone().requires_grad_(True) for k, v in params[r].items()}
            xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
            h = torch.relu(xs @ p["0.weight"].T + p["0.bias"])
            out = h @ p["2.weight"].T + p["2.bias"]
            loss = ((out - ys) ** 2).mean()
            scaled = loss * (loss_scale[2] if loss_scale and loss_scale[:2] == (r, step) else 1.0)
            scaled.backward()
            outs.append(out)
            local_losses.append(loss.detach())
            grads.append({k: v.grad for k, v in p.items()})
        avg = {k: sum(gr[k] for gr in grads) / world for k in init}
        global_loss = sum(local_losses) / world
        for r in range(world):
            g_r = {k: v.clone() for k, v in avg.items()}
            if nan_grad == (r, step):
                g_r["0.weight"][0, 0] = float("nan")
            before = params[r]
            params[r] = {k: before[k] - lr * lr_scale * g_r[k] for k in init}
            reported = global_loss * (reported_loss_scale[1] if reported_loss_scale and reported_loss_scale[0] == step else 1.0)
            data[r][step] = {
                "outputs": {"output": f32(outs[r])},
                "loss": {"loss": np.float32(reported.item())},
                "gradients": {k: f32(v) for k, v in g_r.items()},
                "parameters": {k: f32(v) for k, v in params[r].items()},
                "deltas": {k: f32(params[r][k] - before[k]) for k in init},
            }
    return data


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("ref") / "s", train(), run={"device": "cpu", "backend": "gloo"})


def _cand(tmp_path, **fault):
    return write_store(tmp_path / "cand", train(**fault), run={"device": "cpu", "backend": "gloo"})


def test_identical_stores_pass_exactly(ref, tmp_path):
    cand = _cand(tmp_path)
    report = tracekit.diff(ref, cand, exact=True)
    assert report.passed and report.status == "pass" and report.exit_code == 0
    assert report.summary_line == "PASS comparison ranks=2 steps=6"
    assert report.first_divergence is None and report.violations == []
    assert report.steps == [0, 1, 2, 3, 4, 5, 6]
    assert [r.step for r in report.loss_table] == [1, 2, 3, 4, 5, 6]
    assert all(r.abs_diff == 0 and r.passed for r in report.loss_table)
    assert all(s.max_abs_err == 0 and s.passed for s in report.summary)
    kinds = {s.kind for s in report.summary}
    assert kinds == {"outputs", "loss", "gradients", "parameters", "deltas"}
    assert_stores_close(ref, cand, exact=True)


def test_learning_rate_one_percent_off(ref, tmp_path):
    report = tracekit.diff(ref, _cand(tmp_path, lr_scale=1.01))
    d = report.first_divergence
    assert (report.status, d.step, d.kind) == ("fail", 1, "parameters")
    assert d.ranks == [0, 1]
    assert d.tensor == "0.weight" and set(d.tensors) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert d.worst.abs_err > 1e-5
    step1 = {s.kind: s.passed for s in report.summary if s.step == 1}
    assert step1 == {"outputs": True, "loss": True, "gradients": True, "parameters": False, "deltas": False}
    assert report.summary_line.startswith("FAIL comparison ranks=2 steps=6 violations=")
    assert report.summary_line.endswith(" first_step=1")


def test_learning_rate_one_percent_off_with_small_updates(tmp_path):
    """Updates of ~1e-5 (the reference workloads' size): the update is off by less than float32's
    default atol of 1e-5, so the parameters' own default (atol 1e-7) is what catches it at step 1."""
    ref = write_store(tmp_path / "ref", train(steps=2, lr=3e-4, target_scale=1.0))
    cand = write_store(tmp_path / "cand", train(steps=2, lr=3e-4, target_scale=1.0, lr_scale=1.01))
    d = tracekit.diff(ref, cand).first_divergence
    assert (d.step, d.kind) == (1, "parameters") and d.worst.abs_err < 1e-5
    # torch's atol alone (the norm rule off) sees it a step late, and in the wrong place
    elementwise_only = tracekit.diff(ref, cand, tol={"parameters": (1.3e-6, 1e-5, float("inf"))}).first_divergence
    assert (elementwise_only.step, elementwise_only.kind) == (2, "outputs")
    # with the default norm rule, torch's atol no longer hides it
    with_torch_atol = tracekit.diff(ref, cand, tol={"parameters": (1.3e-6, 1e-5)}).first_divergence
    assert (with_torch_atol.step, with_torch_atol.kind) == (1, "parameters") and with_torch_atol.metrics.norm_failed


def test_one_ranks_loss_scaled_in_step_5(ref, tmp_path):
    report = tracekit.diff(ref, _cand(tmp_path, loss_scale=(1, 5, 1.001)))
    d = report.first_divergence
    assert (d.step, d.kind) == (5, "gradients")
    assert d.ranks == [0, 1]  # averaged gradients carry the fault to every rank
    assert all(s.passed for s in report.summary if s.step < 5)
    assert all(r.passed for r in report.loss_table if r.step <= 5)
    assert report.summary_line.endswith("first_step=5")


def test_nan_in_one_ranks_gradient(ref, tmp_path):
    report = tracekit.diff(ref, _cand(tmp_path, nan_grad=(1, 3)))
    d = report.first_divergence
    assert (d.step, d.kind, d.tensor, d.ranks, d.rank) == (3, "gradients", "0.weight", [1], 1)
    assert d.worst.index == (0, 0) and np.isnan(d.worst.cand) and np.isfinite(d.worst.ref)
    assert d.metrics.nonfinite == 1 and d.metrics.violations == 1
    # NaN is never equal to a number, even with --equal-nan
    assert tracekit.diff(ref, _cand(tmp_path / "again", nan_grad=(1, 3)), equal_nan=True).first_divergence.step == 3


def test_only_the_reported_loss_scaled(ref, tmp_path):
    report = tracekit.diff(ref, _cand(tmp_path, reported_loss_scale=(2, 1.001)), details="all")
    d = report.first_divergence
    assert (d.step, d.kind, d.ranks) == (2, "loss", [0, 1])
    failing = {(r.step, r.kind) for r in report.violations}
    assert failing == {(2, "loss")}
    row = report.loss_table[1]
    assert row.step == 2 and not row.passed and row.rel_diff == pytest.approx(1e-3, rel=1e-3)
    assert len(report.results) == 2 * (4 + 6 * (1 + 1 + 4 + 4 + 4))  # every comparison kept with details="all"


def test_a_run_that_stopped_early_is_structural(ref, tmp_path):
    cand = write_store(tmp_path / "short", train(steps=3))
    report = tracekit.diff(ref, cand)
    assert report.status == "error" and report.exit_code == 2 and not report.passed
    assert report.summary == [] and report.steps == []
    (p,) = report.structural
    assert (p.problem, p.side, p.steps, p.ranks) == ("missing_steps", "cand", [4, 5, 6], [0, 1])
    assert "cand ranks 0-1 lack steps 4-6" in p.message
    common = tracekit.diff(ref, cand, allow_missing=True)
    # a partial comparison says what it left out: a plain PASS line is for complete comparisons only
    assert common.status == "pass" and common.summary_line == "PASS comparison ranks=2 steps=3 missing_steps=3"
    d = common.to_dict()
    assert d["skipped"][0]["steps"] == [4, 5, 6]
    assert d["missing"] == [{"problem": "missing_steps", "side": "cand", "ranks": [[0, 1]],
                             "kinds": ["outputs", "loss", "gradients", "parameters", "deltas"],
                             "steps": [[4, 6]], "tensor": None}]
    assert d["missing_counts"] == {"missing_steps": 3}
    assert tracekit.diff(ref, ref).summary_line == "PASS comparison ranks=2 steps=6"  # complete: plain line
    with pytest.raises(AssertionError, match="lack steps 4-6"):
        assert_stores_close(ref, cand)


def test_fail_fast_stops_at_the_first_violating_step(ref, tmp_path):
    report = tracekit.diff(ref, _cand(tmp_path, lr_scale=1.01), fail_fast=True)
    assert report.steps == [0, 1] and report.stopped_early
    assert report.summary_line.endswith("steps=1 violations=16 first_step=1")  # parameters and deltas, 4 tensors x 2 ranks


def test_assert_stores_close_names_the_divergence(ref, tmp_path):
    with pytest.raises(AssertionError) as e:
        assert_stores_close(ref, _cand(tmp_path, nan_grad=(1, 3)))
    text = str(e.value)
    assert "First divergence: step 3, gradients, tensor '0.weight', rank 1" in text
    assert text.rstrip().endswith("first_step=3")


def test_tolerances_per_kind_can_let_a_fault_through(ref, tmp_path):
    cand = _cand(tmp_path, reported_loss_scale=(2, 1.001))
    assert tracekit.diff(ref, cand, tol={"loss": (2e-3, 0)}).passed
    assert tracekit.diff(ref, cand, tol=["loss=2e-3,0"]).passed
    assert not tracekit.diff(ref, cand, tol={"gradients": (2e-3, 0)}).passed


def test_progress_counts_every_byte_compared(ref, tmp_path):
    calls = []
    report = tracekit.diff(ref, _cand(tmp_path), progress=lambda done, total: calls.append((done, total)), jobs=2)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and len(calls) > 10
    assert calls[-1] == (report.bytes_compared, report.bytes_compared)
    # both sides x 2 ranks x (initial parameters + 6 steps of gradients, parameters, deltas, outputs, loss)
    params = sum(a.nbytes for a in train(steps=0)[0][0]["parameters"].values())
    per_step = 3 * params + (BATCH // 2) * OUT * 4 + 4
    # format 2: tensors equal by content hash on both sides are decided without reading
    assert report.bytes_compared + report.bytes_identical_by_hash == 2 * 2 * (params + 6 * per_step)
    assert report.bytes_identical_by_hash >= 2 * 2 * params  # the initial parameters are the same
