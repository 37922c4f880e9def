"""samples/inspect_divergence.py walks from FAIL to the planted fault's element, as documented."""

import os
import re
import subprocess
import sys

from tests.paths import REPO

ROOT = REPO


def test_sample_finds_the_planted_fault(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "samples", "inspect_divergence.py"), "--keep", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "FAIL comparison ranks=4 steps=5 violations=18 first_step=3"
    assert "first failing step: 3, ranks [2]" in lines
    # The values depend on this machine's BLAS kernels; their relations do not: the planted fault halves
    # one element (the candidate's one-ulp wobble aside), so cand / ref is 0.5 and |cand - ref| is |ref| / 2.
    err = float(next(re.fullmatch(r"element \(5, 1\): \|cand - ref\| = (\S+)", l) for l in lines
                     if l.startswith("element ")).group(1))
    values = next(re.fullmatch(r"reference (\S+), candidate (\S+) \(ratio (\S+)\)", l) for l in lines
                  if l.startswith("reference "))
    ref, cand, ratio = (float(v) for v in values.groups())
    assert ref != 0 and abs(cand / ref - 0.5) < 1e-6 and ratio == 0.5
    assert abs(err - abs(cand - ref)) <= 5e-3 * abs(cand - ref)  # printed to 3 significant digits
    assert lines[-1] == "found the planted fault"
    # the stores it kept are real tracekit stores, readable by the CLI
    from click.testing import CliRunner

    from tracekit.cli.main import main

    res = CliRunner().invoke(main, ["show", str(tmp_path / "cand"), "--json"])
    assert res.exit_code == 0 and '"device": "accel"' in res.output
