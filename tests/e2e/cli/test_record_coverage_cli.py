"""`tracekit record` and `tracekit show` state what a zero-code recording covers: how many of the
optimizer's parameters, which were left out and why (--strict: an error), the root model and what
its recorded output is. The script (tests/recorders/llama_like.py) never imports tracekit."""

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from tracekit import open_store
from tracekit.cli.main import main

from tests.paths import TESTS

LLAMA_LIKE = os.path.join(TESTS, "recorders", "llama_like.py")
N = 30  # TinyLlama's parameter tensors


def tracekit(*args):
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_record_line_and_show_state_the_coverage_and_the_output(tmp_path):
    store = str(tmp_path / "s")
    result = tracekit("record", "-o", store, "--", sys.executable, LLAMA_LIKE, "--chunked", "--free-param")
    assert result.returncode == 0, result.stderr
    *_, warning, last = result.stderr.strip().splitlines()
    assert warning == (f"tracekit record: warning: left out 1 of {N + 1} optimizer parameters: param{N} (2x3: owned by "
                       "no module called before the first optimizer step); see docs/ZEROCODE.md (--model, --strict)")
    assert f"deltas, {N} of {N + 1} optimizer parameters, " in last
    shown = CliRunner().invoke(main, ["show", store])  # in this process: a `tracekit show` costs ~0.6 CPU-s
    assert shown.exit_code == 0, shown.output
    assert "  root: TinyLlama\n" in shown.stdout
    assert f"  coverage: {N} of {N + 1} optimizer parameters (left out 1 of {N + 1}" in shown.stdout
    assert ("  output: what TinyLlama's forward returned; the loop also applied lm_head itself, outside that forward"
            in shown.stdout)
    assert open_store(store).rank(0).tensors("parameters")[5].name == "layers.0.attention.wo.weight"
    as_json = json.loads(CliRunner().invoke(main, ["show", "--json", store]).output)["coverage"]
    assert (as_json["recorded"], as_json["optimizer_params"], as_json["outside_calls"]) == (N, N + 1, ["lm_head"])
    assert as_json["left_out"] == [{"name": f"param{N}", "shape": [2, 3], "reason": as_json["left_out"][0]["reason"]}]


def test_strict_makes_a_left_out_parameter_an_error(tmp_path):
    store = str(tmp_path / "s")
    result = tracekit("record", "--strict", "-o", store, "--", sys.executable, LLAMA_LIKE, "--free-param")
    assert result.returncode != 0
    assert f"TracekitError: left out 1 of {N + 1} optimizer parameters: param{N}" in result.stderr
    assert "(--strict)" in result.stderr
