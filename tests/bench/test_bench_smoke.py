"""Benches that nothing else runs, run at tiny sizes: a bench broken by a change in the library is
found here, not by the next person who needs its figures (bench_derived_loss.py's `per row`
variant had broken against the writer, unnoticed). Only that they run and print their figures is
checked; their numbers are for the docs, not for tests."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("bench, args, last", [
    ("bench_derived_loss.py", ["--ranks", "2", "--steps", "3", "--repeats", "1"], "per row / bulk:"),
    ("bench_spare_slab.py", ["--mb", "1", "--steps", "3", "--repeats", "1", "--train-ms", "1"],
     "training thread, without / spare:"),
    ("bench_object_queue.py", ["--entries", "2", "--repeats", "2", "--width", "64"], "wall, in line / queued:"),
    ("bench_fresh_memory.py", ["--mb", "4", "--block-mb", "1"], "first write"),
])
def test_the_bench_runs_and_prints_its_figures(bench, args, last, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", bench), *args], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].strip().startswith(last), done.stdout
