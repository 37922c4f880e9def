"""samples/device_check.py's dry run: without CUDA every candidate trains on the CPU, as its
reference did, so each check's diff must PASS bit for bit; on a lent GPU the same command gives
the CUDA verdicts (docs/TORCHTITAN.md, "On a lent GPU")."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests import paths

SCRIPT = f"{paths.SAMPLES}/device_check.py"


def test_the_dry_run_passes_each_check_bit_for_bit(tmp_path):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a CUDA host: the candidates would train on the GPU (not a dry run)")
    except ImportError:
        pass
    only = ["--only", "plain-fp32", "--only", "plain-bf16"]
    if importlib.util.find_spec("torchtitan") is not None:
        only += ["--only", "titan-eager"]
    done = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), "--steps", "1", *only],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == f"DONE device check: {len(only) // 2} check(s), no CUDA: candidates on the CPU"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cuda"] is False and summary["steps"] == 1
    for check in summary["checks"]:
        assert check["verdict"] == "PASS comparison ranks=1 steps=1", check
        assert "--exact" in check["steps"][-1]["command"]
    log = (tmp_path / "checks.log").read_text()
    # each reference recorded once (without CUDA plain-bf16 has a bf16 twin of its own as reference)
    assert log.count("record -o plain-cpu --") == 1 and log.count("record -o plain-cpu-bf16 --") == 1
    assert log.count("--autocast bf16") == 2
