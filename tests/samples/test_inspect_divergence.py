"""samples/inspect_divergence.py walks from FAIL to the planted fault's element, as documented."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sample_finds_the_planted_fault(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "samples", "inspect_divergence.py"), "--keep", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "FAIL comparison ranks=4 steps=5 violations=18 first_step=3"
    assert "first failing step: 3, ranks [2]" in lines
    assert "element (5, 1): |cand - ref| = 0.0135" in lines
    assert any(line.startswith("reference -0.02693119") and "(ratio 0.5)" in line for line in lines)
    assert lines[-1] == "found the planted fault"
    # the stores it kept are real tracekit stores, readable by the CLI
    from click.testing import CliRunner

    from tracekit.cli.main import main

    res = CliRunner().invoke(main, ["show", str(tmp_path / "cand"), "--json"])
    assert res.exit_code == 0 and '"device": "accel"' in res.output
