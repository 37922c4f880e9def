"""A synthetic 64-rank, 10-step store written through the writer API; diff, show and open timed.

Every rank records the tutorial model's tensors (Linear(128,256)+Linear(256,128): gradients,
parameters, deltas; outputs (512/N x 128); loss), DDP-style: parameters, gradients and deltas are
equal on all ranks, outputs differ per rank. The candidate equals the reference except rank 5's
gradients from step 4 on. Prints write time and store size, then wall time and peak RSS of
`tracekit diff REF CAND`, `tracekit show REF` and `tracekit.open(REF)` (+ one tensor computed),
each in its own process.

    python bench/bench_scale.py [--ranks 64] [--steps 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = {"0.weight": (256, 128), "0.bias": (256,), "2.weight": (128, 256), "2.bias": (128,)}


def build(path: str, ranks: int, steps: int, drift_rank: int | None) -> float:
    from tracekit.store import RankWriter, TensorData, create_store

    t = time.perf_counter()
    create_store(path, {"command": ["bench_scale"]}, force=True)
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r}})
        for s in range(0, steps + 1):
            rng = np.random.default_rng([s])
            params = {n: rng.standard_normal(shape, dtype=np.float32) for n, shape in SHAPES.items()}
            w.write(s, "parameters", [TensorData(n, "float32", v.shape, v) for n, v in params.items()])
            if s == 0:
                continue
            grads = {n: v * np.float32(0.01) for n, v in params.items()}
            if drift_rank == r and s >= 4:
                grads["0.weight"] = grads["0.weight"] * np.float32(1.001)
            out = np.random.default_rng([s, r]).standard_normal((512 // ranks or 1, 128), dtype=np.float32)
            w.write(s, "outputs", [TensorData("output", "float32", out.shape, out)])
            w.write(s, "loss", [TensorData("loss", "float32", (), np.array(1.0 / s, np.float32))])
            w.write(s, "gradients", [TensorData(n, "float32", v.shape, v) for n, v in grads.items()])
            w.write(s, "deltas", [TensorData(n, "float32", v.shape, -v) for n, v in grads.items()])
            w.complete_step(s)
        w.close()
    return time.perf_counter() - t


PEAK = "next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:'))"
TIMED = {
    "diff": "from tracekit.cli.main import main\nimport sys\ntry:\n    main(['diff', REF, CAND])\nexcept SystemExit:\n    pass",
    "show": "from tracekit.cli.main import main\ntry:\n    main(['show', REF])\nexcept SystemExit:\n    pass",
    "open": "import tracekit\ntree = tracekit.open(REF)\ng = tree['gradients']['0.weight']\nfloat(g.isel(rank=-1, step=-1).sum())",
}


def timed(name: str, ref: str, cand: str) -> tuple[float, int]:
    code = (f"import sys, time, io, contextlib\nsys.path.insert(0, {ROOT!r})\nREF, CAND = {ref!r}, {cand!r}\n"
            "t = time.perf_counter()\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
            + "\n".join("    " + line for line in TIMED[name].splitlines())
            + f"\nprint(time.perf_counter() - t, {PEAK})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    sec, peak = out.stdout.split()[-2:]
    return float(sec), int(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="tracekit-scale-")
    ref, cand = os.path.join(base, "ref"), os.path.join(base, "cand")
    wt = build(ref, a.ranks, a.steps, None)
    build(cand, a.ranks, a.steps, 5)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ref) for f in fs)
    files = sum(len(fs) for _, _, fs in os.walk(ref))
    print(f"{a.ranks} ranks x {a.steps} steps: written in {wt:.1f} s, {size / 2**20:.1f} MiB in {files} files")
    for name in TIMED:
        sec, peak = timed(name, ref, cand)
        print(f"  {name:5s} {sec:7.2f} s  peak RSS {peak / 2**20:6.0f} MiB")
    if a.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
