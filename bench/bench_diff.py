"""Benchmark of `tracekit diff` (not a test): throughput against raw reads, and peak memory.

Builds two stores of about --size-mb each with the writer (a candidate that differs from the
reference by float32 rounding noise everywhere, so no shortcut applies), then measures in
separate processes:
  raw   numpy.fromfile of every chunk file of both stores (the bytes the diff must read);
  diff  tracekit.diff of the two stores;
and prints both throughputs (bytes of tensor data per second), their ratio (target >= 0.9 in
format 2, whose reads also check every object's hash) and the diff's peak RSS (target: bounded).

--identical adds the case content hashes are for: a store diffed against an identical copy,
in format 1 (every byte read) and format 2 (decided by hash) on the same data, side by side,
with the speedup (target >= 10x).

    python bench/bench_diff.py --size-mb 1024 --dir /tmp/tracekit-bench [--format 1|2] [--identical]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KINDS = ("gradients", "parameters", "deltas")


def build(path: str, size_bytes: int, ranks: int, steps: int, tensors: int, noise: float, seed: int,
          version: int = 2) -> int:
    """Write a store of ~size_bytes; the candidate (noise > 0) is the reference plus relative noise.

    Every (rank, step, kind, tensor) gets its own random data, so format 2 stores every byte too
    (no dedup) and both formats hold the same bytes."""
    from tracekit.store import RankWriter, TensorData, create_store

    per_row = size_bytes // (ranks * steps * len(KINDS))
    numel = max(tensors, per_row // 4 // tensors)
    create_store(path, {"mode": "ddp"}, force=True, format_version=version)
    written = 0
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r}})
        for s in range(1, steps + 1):
            for k, kind in enumerate(KINDS):
                row = []
                for t in range(tensors):
                    rng = np.random.default_rng([seed, r, s, k, t])
                    x = rng.standard_normal(numel, dtype=np.float32)
                    if noise:
                        # reproduce the reference, then move each element by a few ulps
                        x = np.random.default_rng([0, r, s, k, t]).standard_normal(numel, dtype=np.float32)
                        x *= np.float32(1) + np.float32(noise) * rng.standard_normal(numel, dtype=np.float32)
                    row.append(TensorData(f"layer{t}.weight", "float32", (numel,), x))
                    written += x.nbytes
                w.write(s, kind, row)
            w.complete_step(s)
        w.close()
    return written


RAW = r"""
import os, sys, time, numpy as np
files = [os.path.join(d, f) for p in sys.argv[1:] for d, _, fs in os.walk(p) for f in fs if f != "zarr.json"]
c = time.process_time(); t = time.perf_counter(); n = 0
for f in files:
    n += np.fromfile(f, dtype=np.uint8).nbytes
print(n, time.perf_counter() - t, time.process_time() - c)
"""

DIFF = r"""
import sys, time, resource
sys.path.insert(0, sys.argv[1])
import tracekit
import tracekit.compare.engine  # imported before timing: the diff is measured, not the import
c = time.process_time(); t = time.perf_counter()
r = tracekit.diff(sys.argv[2], sys.argv[3], jobs=int(sys.argv[4]))
dt, dc = time.perf_counter() - t, time.process_time() - c
try:  # VmHWM: ru_maxrss would carry over the forking parent's peak across exec (Linux)
    peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(r.bytes_compared, dt, dc, peak, r.summary_line)
"""


def run(code: str, fields: int, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True)
    return out.stdout.split(maxsplit=fields - 1)


def identical(a, size: int) -> None:
    """An identical copy diffed in format 1 and in format 2, same data, timed side by side."""
    times = {}
    for version in (1, 2):
        ref, same = os.path.join(a.dir, f"id{version}-ref"), os.path.join(a.dir, f"id{version}-same")
        build(ref, size, a.ranks, a.steps, a.tensors, 0.0, 0, version)
        build(same, size, a.ranks, a.steps, a.tensors, 0.0, 0, version)
        runs = [run(DIFF, 5, ROOT, ref, same, a.jobs) for _ in range(a.repeat)]
        times[version] = min(float(r[1]) for r in runs)
        nb, _, _, peak, line = runs[0]
        print(f"identical stores, format {version}: diff {times[version]:.3f} s, {int(nb) / 2**20:.1f} MiB read, "
              f"peak RSS {int(peak) / 2**20:.0f} MiB   [{line.strip()}]")
        if not a.keep:
            shutil.rmtree(ref, ignore_errors=True)
            shutil.rmtree(same, ignore_errors=True)
    print(f"identical stores: format 2 diff is {times[1] / times[2]:.1f}x faster than format 1 (target >= 10x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024, help="size of each store (default 1024)")
    ap.add_argument("--dir", default="/tmp/tracekit-bench-diff")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=8, help="tensors per kind")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    ap.add_argument("--format", type=int, default=2, choices=(1, 2), help="store format of the two stores")
    ap.add_argument("--identical", action="store_true", help="also time identical stores, format 1 vs 2")
    a = ap.parse_args()
    ref, cand = os.path.join(a.dir, "ref"), os.path.join(a.dir, "cand")
    os.makedirs(a.dir, exist_ok=True)
    size = int(a.size_mb * 2**20)
    t = time.perf_counter()
    marker = os.path.join(a.dir, f"built-{a.format}-{a.size_mb}-{a.ranks}-{a.steps}-{a.tensors}")
    if a.keep and os.path.exists(marker):  # reuse the stores of a previous --keep run of the same size
        n = int(open(marker).read())
    else:
        n = build(ref, size, a.ranks, a.steps, a.tensors, 0.0, 0, a.format)
        build(cand, size, a.ranks, a.steps, a.tensors, 1e-7, 1, a.format)
        open(marker, "w").write(str(n))
    print(f"2 format-{a.format} stores of {n / 2**20:.0f} MiB tensor data each ready in {time.perf_counter() - t:.1f} s")
    # The machine may be shared: wall-clock rates are taken as the best of --repeat runs, and the
    # CPU-time rates (bytes per CPU-second, all threads) show the work per byte whatever the load.
    best = {"raw": 0.0, "diff": 0.0, "raw_cpu": 0.0, "diff_cpu": 0.0}
    rss = 0
    for i in range(a.repeat):
        nb, sec, cpu = run(RAW, 3, ref, cand)
        raw, raw_cpu = int(nb) / float(sec), int(nb) / float(cpu)
        nb, sec, cpu, peak, line = run(DIFF, 5, ROOT, ref, cand, a.jobs)
        rate, rate_cpu = int(nb) / float(sec), int(nb) / float(cpu)
        rss = max(rss, int(peak))
        print(f"run {i + 1}: raw read {raw / 2**20:6.0f} MiB/s ({raw_cpu / 2**20:6.0f} per CPU-s)   "
              f"diff {rate / 2**20:6.0f} MiB/s ({rate_cpu / 2**20:6.0f} per CPU-s)   ratio {rate / raw:.2f}   "
              f"diff peak RSS {int(peak) / 2**20:.0f} MiB   [{line.strip()}]")
        for k, v in (("raw", raw), ("diff", rate), ("raw_cpu", raw_cpu), ("diff_cpu", rate_cpu)):
            best[k] = max(best[k], v)
    if a.identical:
        identical(a, size)
    print(json.dumps({"format": a.format, "store_mib": round(n / 2**20), "jobs": a.jobs, "raw_mib_s": round(best["raw"] / 2**20),
                      "diff_mib_s": round(best["diff"] / 2**20), "ratio": round(best["diff"] / best["raw"], 3),
                      "raw_mib_per_cpu_s": round(best["raw_cpu"] / 2**20),
                      "diff_mib_per_cpu_s": round(best["diff_cpu"] / 2**20),
                      "diff_peak_rss_mib": round(rss / 2**20)}))
    if not a.keep:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
