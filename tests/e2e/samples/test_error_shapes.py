"""Issue 35: planted faults are named by their shape end to end (compare/matches.py, near.py,
patterns.py): data swapped between ranks and a gradient buffer not refreshed, both at step 2 of one
bf16 autocast recording (zero-code, 8 steps like the plain sample's shared recording), against the
clean bf16 recording (exact matches) and against the float32 reference (near matches: no value is
equal bit for bit); the verdict line, the first divergence, the JSON report (schema) and the
accessor carry the signature."""

import jsonschema
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.compare.near import NEAR_RATIO
from tracekit.schemas import load

from tests.e2e.samples.traced_layouts import STEPS, traced_reference

BF16 = ("--autocast", "bf16")
FAULTS = ("--fault", "swap_data=2", "--fault", "stale_grad=2")


def _faulty(recorded_sample):
    """The faulty bf16 recording (the clean one and the float32 reference are other tests' too)."""
    return recorded_sample("ddp", script="plain", steps=STEPS, extra=(*BF16, *FAULTS))[0]


def _named(report):
    by = {(s.step, s.kind): s for s in report.signatures if s.shape in ("swapped", "stale")}
    swapped, stale = by[(2, "outputs")], by[(2, "gradients")]
    assert swapped.shape == "swapped" and swapped.source_ranks == [[0, 1], [1, 0]]
    assert stale.shape == "stale" and stale.source_step == 1 and stale.all_ranks and stale.tensors == 4
    # step 1 is clean: nothing is named there
    assert not [s for s in report.signatures if s.step == 1]
    d = report.first_divergence
    assert (d.step, d.kind, d.signature.shape) == (2, "outputs", "swapped")
    doc = report.to_dict()
    jsonschema.validate(doc, load("diff-report"))
    assert doc["first_divergence"]["signature"]["text"].startswith("swapped: outputs")
    return swapped, stale


def test_swapped_data_and_a_stale_gradient_are_named(recorded_sample):
    ref = recorded_sample("ddp", script="plain", steps=STEPS, extra=BF16)[0]  # test_precision_workloads' too
    cand = _faulty(recorded_sample)
    swapped, stale = _named(tracekit.diff(ref, cand))
    assert swapped.near is None and stale.near is None  # the same arithmetic: bit for bit
    assert tracekit.open_diff(ref, cand).tracekit.first_divergence()["signature"].startswith("swapped: outputs")
    out = CliRunner().invoke(main, ["diff", ref, cand])
    assert out.exit_code == 1 and "gradients: stale: gradients on 4 tensors" in out.output
    # the same pair by magnitude alone fails too, without names
    assert tracekit.diff(ref, cand, structure=False).signatures == []


def test_against_the_float32_reference_they_are_near_matches(recorded_sample):
    ref = traced_reference(recorded_sample, "ddp")  # the plain sample's shared float32 recording
    swapped, stale = _named(tracekit.diff(ref, _faulty(recorded_sample)))
    # bf16 rounding away from the value it holds, and far closer to it than to its own
    assert swapped.near["rel_l2_err"] < 0.05 and stale.near["rel_l2_err"] < 0.05
    assert min(swapped.near["closer"], stale.near["closer"]) >= NEAR_RATIO
    out = CliRunner().invoke(main, ["diff", ref, _faulty(recorded_sample)])
    assert out.exit_code == 1
    assert "all ranks equal the reference's step 1 within their bounds (rel L2 err" in out.output
    assert "rank 0 holds rank 1's, rank 1 holds rank 0's reference value within its bound" in out.output


def test_rolled_rows_are_named_a_permutation(recorded_sample):
    """op=roll_rows: rank 1's ReLU returns its rows rolled by one from step 2, so the model's output
    holds the reference's rows in another order (its gradients differ otherwise)."""
    ref = recorded_sample("ddp")[0]
    cand = recorded_sample("ddp", extra=("--fault", "op=roll_rows:1:2"))[0]
    report = tracekit.diff(ref, cand)
    rolled = [s for s in report.signatures if s.shape == "permuted rows"]
    assert rolled and (rolled[0].step, rolled[0].kind, rolled[0].ranks) == (2, "outputs", [1])
    assert not [s for s in report.signatures if s.step == 1]
    d = report.first_divergence
    assert (d.step, d.kind, d.signature.shape) == (2, "outputs", "permuted rows")
    assert "rows match the reference's in another order on tensor output, rank 1 only (e.g. rank 1" in d.signature.text
    jsonschema.validate(report.to_dict(), load("diff-report"))
    out = CliRunner().invoke(main, ["diff", ref, cand])
    assert out.exit_code == 1 and "outputs: permuted rows: outputs rows match" in out.output
