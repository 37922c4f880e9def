"""Benchmark (not a test): TorchTitan's llama3 debug model trained with and without `tracekit record`,
side by side in one run, on CPU/gloo through samples/torchtitan/train.py; prints times and ratios.

  whole command   wall time of `torchrun ...` against `tracekit record -o S -- torchrun ...`
                  (start-up, training, the recorder's flush and finalize)
  steps           TorchTitan's own log, rank 0: "Training starts" to the last step's line
  steps after 1   the first step's line to the last step's line (step 1 also compiles the
                  attention mask builder, which recording does not change)

Runs alternate (plain, recorded, plain, ...) so the machine's drift hits both; the best of each.

    python bench/bench_torchtitan.py [--ranks 2] [--steps 10] [--repeats 2] [--dir DIR] [-- TORCHTITAN FLAGS]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workdir import own_folder, remove_own  # noqa: E402  (this folder's)

RUNNER = os.path.join(ROOT, "samples", "torchtitan", "train.py")
STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_times(log: str) -> tuple[float, float, float]:
    """(training start, first step's line, last step's line) from TorchTitan's log, in seconds."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    start = re.search(STAMP + r" .*Training starts at step", plain)
    steps = re.findall(STAMP + r" .*step:\s+\d+\s+loss:", plain)
    if not start or not steps:
        raise SystemExit(f"error: no TorchTitan step lines in the output:\n{log[-3000:]}")
    return stamp(start.group(1)), stamp(steps[0]), stamp(steps[-1])


def run(cmd: list[str], cwd: str) -> tuple[float, str]:
    began = time.perf_counter()
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"error: exit {result.returncode}: {' '.join(cmd)}\n{result.stderr[-3000:]}")
    return wall, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the bench makes its folder (default: the temp folder)")
    parser.add_argument("flags", nargs="*", help="more TorchTitan flags, after --")
    args = parser.parse_args()
    work = own_folder(args.dir, "tracekit-bench-torchtitan")
    train = ["torchrun", "--standalone", f"--nproc-per-node={args.ranks}", RUNNER, "--module", "llama3",
             "--config", "llama3_debugmodel", "--training.seq-len", "64", "--training.local-batch-size", "2",
             "--training.steps", str(args.steps), "--debug.seed", "0", "--assets", os.path.join(work, "assets"),
             *args.flags]
    store = os.path.join(work, "store")
    record = ["tracekit", "record", "--force", "-o", store, "--"]
    best: dict[str, list[float]] = {"plain": [], "recorded": []}
    try:
        run(train, work)  # warm-up: assets, inductor cache for the mask builder, page cache
        for _ in range(args.repeats):
            for label, prefix in (("plain", []), ("recorded", record)):
                wall, log = run(prefix + train, work)
                start, first, last = log_times(log)
                figures = [wall, last - start, last - first]
                best[label] = [min(a, b) for a, b in zip(best[label], figures)] if best[label] else figures
                shutil.rmtree(store, ignore_errors=True)
    finally:
        remove_own(work)
    print(f"TorchTitan llama3 debug model, {args.ranks} ranks, {args.steps} steps, best of {args.repeats}")
    print(f"{'':16s} {'plain':>9s} {'recorded':>9s} {'ratio':>6s}")
    for i, name in enumerate(("whole command", "steps", "steps after 1")):
        plain, recorded = best["plain"][i], best["recorded"][i]
        print(f"{name:16s} {plain:8.2f}s {recorded:8.2f}s {recorded / plain:6.2f}")


if __name__ == "__main__":
    main()
