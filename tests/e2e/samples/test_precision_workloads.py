"""Low-precision candidates of the sample workloads against their float32 references (issue 35):
the precision context is recorded by both recorders, and the diff judges by the arithmetic."""

from click.testing import CliRunner

from tracekit import open_store
from tracekit.cli.main import main

from tests.e2e.samples.traced_layouts import STEPS, traced_reference


def diff(*args):
    result = CliRunner().invoke(main, ["diff", *map(str, args)])
    return result.exit_code, result.output.rstrip("\n").splitlines()


def test_fsdp_mixed_precision_passes_by_its_arithmetic_and_fails_by_float32s(recorded_sample):
    ref, _ = recorded_sample("fsdp")
    cand, _ = recorded_sample("fsdp", extra=("--mixed-precision", "bf16"))
    policy = open_store(cand).rank(1).precision.fsdp[""]
    assert policy == {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "float32"}
    code, lines = diff(ref, cand)
    assert code == 0, "\n".join(lines[-30:])
    assert "precision differs: fsdp mixed precision" in lines
    assert "precision rule: bfloat16 compute defaults for float32 tensors (cand: fsdp param_dtype=bfloat16)" in lines
    code, lines = diff("--precision", "fp32", ref, cand)
    assert code == 1 and lines[-1].startswith("FAIL comparison ranks=2 steps=3")


def test_zero_code_records_the_autocast_the_forward_ran_under(recorded_sample):
    ref = traced_reference(recorded_sample, "ddp")  # the plain sample's shared recording (STEPS steps)
    # test_error_shapes' bf16 reference too
    cand, _ = recorded_sample("ddp", script="plain", steps=STEPS, extra=("--autocast", "bf16"))
    assert open_store(cand).rank(0).precision.autocast == {"cpu": "bfloat16"}
    assert open_store(ref).rank(0).precision.autocast == {}
    code, lines = diff(ref, cand)
    assert code == 0, "\n".join(lines[-30:])
    assert any(line.startswith("  deltas: rounding-like") for line in lines)
