"""Issue 35: planted faults are named by their shape end to end (compare/matches.py, patterns.py):
data swapped between ranks and a gradient buffer not refreshed, both at step 2 of one recording,
against the shared ddp reference; the verdict line, the first divergence, the JSON report (schema)
and the accessor carry the signature."""

import jsonschema
from click.testing import CliRunner

import tracekit
from tracekit.cli.main import main
from tracekit.schemas import load

FAULTS = ("--fault", "swap_data=2", "--fault", "stale_grad=2")


def test_swapped_data_and_a_stale_gradient_are_named(recorded_sample):
    ref = recorded_sample("ddp")[0]
    cand = recorded_sample("ddp", extra=FAULTS)[0]
    report = tracekit.diff(ref, cand)
    by = {(s.step, s.kind): s for s in report.signatures}
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
    assert tracekit.open_diff(ref, cand).tracekit.first_divergence()["signature"].startswith("swapped: outputs")
    out = CliRunner().invoke(main, ["diff", ref, cand])
    assert out.exit_code == 1 and "gradients: stale: gradients on 4 tensors" in out.output
    # the same pair by magnitude alone fails too, without names
    assert tracekit.diff(ref, cand, structure=False).signatures == []


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
