"""Benchmark (not a test): `tracekit diff --workers 1/2` on two local stores, in one run.

Builds two stores of --size-mb each (bench_diff's: float32, the candidate off by rounding noise
everywhere), then measures, best of --repeat on a shared machine:
  one process   tracekit.diff with jobs=1 (one thread: a worker's share) and with --jobs threads;
  dask 1 / 2    the same diff on an already started LocalCluster of 1 and of 2 single-threaded
                worker processes (steady state), plus peak RSS of each worker;
  --workers 2   end to end, cluster start-up included (what `tracekit diff --workers 2` costs).
Prints MiB/s of tensor data compared (both stores' bytes) and the per-worker rate a cluster
projection can use (docs/CLUSTERS.md).

    python bench/bench_diff_workers.py --size-mb 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_diff import build  # noqa: E402
from workdir import own_folder, remove_own  # noqa: E402


def _peak_rss() -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--dir", default=None, help="the folder to make the bench's own folder, tracekit-bench-workers, "
                    "in (default: the temp folder); only that folder is removed at the end (bench/workdir.py)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.dir = own_folder(a.dir, "tracekit-bench-workers")

    import tracekit
    from distributed import Client, LocalCluster

    ref, cand = os.path.join(a.dir, "ref"), os.path.join(a.dir, "cand")
    marker = os.path.join(a.dir, f"built-{a.size_mb}-{a.ranks}-{a.steps}-{a.tensors}")
    t = time.perf_counter()
    if not os.path.exists(marker):
        size = int(a.size_mb * 2**20)
        build(ref, size, a.ranks, a.steps, a.tensors, 0.0, 0)
        build(cand, size, a.ranks, a.steps, a.tensors, 1e-7, 1)
        open(marker, "w").write("ok")
    print(f"2 stores of {a.size_mb:.0f} MiB each ({a.ranks} ranks, {a.steps} steps) ready in {time.perf_counter() - t:.0f} s",
          flush=True)

    out = {"size_mib_each": a.size_mb, "ranks": a.ranks, "steps": a.steps, "jobs": a.jobs}
    lines = {}

    def measure(name, **kw):
        t0 = time.perf_counter()
        r = tracekit.diff(ref, cand, **kw)
        rate = r.bytes_compared / (time.perf_counter() - t0) / 2**20
        out[f"{name}_mib_s"] = max(out.get(f"{name}_mib_s", 0), round(rate, 1))
        lines[name] = _same(r)
        print(f"{name:18} {rate:7.1f} MiB/s   [{r.summary_line}]", flush=True)

    clusters = {n: LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                dashboard_address="127.0.0.1:0", silence_logs=50) for n in (1, 2)}
    try:
        for _ in range(a.repeat):
            measure("one_process_jobs1", jobs=1)
            measure(f"one_process_jobs{a.jobs}", jobs=a.jobs)
            for n, c in clusters.items():
                measure(f"dask_{n}_workers", scheduler=c.scheduler_address)
        for n, c in clusters.items():
            with Client(c) as client:
                rss = client.run(_peak_rss)
            out[f"dask_{n}_workers_peak_rss_mib"] = [round(v / 2**20) for v in rss.values()]
    finally:
        for c in clusters.values():
            c.close()
    measure("workers2_with_startup", workers=2)
    out["speedup_2_workers_over_1"] = round(out["dask_2_workers_mib_s"] / out["dask_1_workers_mib_s"], 2)
    out["reports_identical"] = len(set(lines.values())) == 1
    print(json.dumps(out))
    if not a.keep:
        remove_own(a.dir)


def _same(report) -> str:
    d = report.to_dict()
    d["stats"].pop("seconds")
    return json.dumps(d, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
