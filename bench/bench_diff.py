"""Benchmark of `tracekit diff` (not a test): throughput against raw reads, and peak memory.

Builds two stores of about --size-mb each with the writer (a candidate that differs from the
reference by float32 rounding noise everywhere, so no shortcut applies), then measures in
separate processes:
  raw   numpy.fromfile of every chunk file of both stores (the bytes the diff must read);
  diff  tracekit.diff of the two stores;
and prints both throughputs, the ratio raw read time / diff time of the same files (target >= 0.9
in format 2, whose reads also check every object's hash), the same ratio in CPU-seconds (the raw
read is one thread, the diff --jobs threads: this one leaves the second core out) and the diff's
peak RSS (target: bounded). --cache says where both read from: `warm` (the page cache: the files
were just written or read; the rate of memory copies), `cold` (the disk: every file of both stores
is dropped from the page cache before each measurement, with posix_fadvise(DONTNEED), no root
needed), or `both` (the default; a line each). --diff-layout fsdp builds the pair in row blocks instead (format 2:
each rank writes its piece, every rank presents the same whole tensors; the diff reads each piece
pair once).

--format 3 (the default, what tracekit records) packs each row's tensors under 1 MiB into a few
files; size --tensors so that a tensor is under 1 MiB to measure packed stores, over it for one
object per tensor (as format 2 stores every tensor).

--identical adds the case content hashes are for: two identical stores (same data, written twice)
diffed in format 1 (every byte read and compared) and in format 2 or 3 (decided by hash from the two
indexes, the default; and with --check-hashes, each distinct object read back and hash-checked
once per open store), side by side, with the speedups (target >= 10x), for each of --layouts: ddp
(replicas) and fsdp (each rank writes its own row block in format 2), and each --cache: warm (both
pairs read into the page cache first: format 1 then compares equal bytes at memory speed) and cold
(both dropped from it: format 1 reads every byte from the disk, format 2 or 3 the indexes).
--identical-only skips the different-stores case; --identical-mb sizes the identical stores.

    python bench/bench_diff.py --size-mb 1024 [--dir DIR] [--format 1|2] [--identical]
    python bench/bench_diff.py --identical-only --identical-mb 4096 --ranks 4 --steps 2
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
from workdir import own_folder, remove_own  # this folder's

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KINDS = ("gradients", "parameters", "deltas")


def write_ddp_like(path: str, ranks: int, steps: int, tensors: int, make) -> int:
    """Every rank writes every step and kind, one row of `tensors` tensors: make(r, s, k, t) gives
    each TensorData. Returns the bytes of tensor data the ranks present (whole tensors)."""
    from tracekit.store import RankWriter

    presented = 0
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r}})
        for s in range(1, steps + 1):
            for k, kind in enumerate(KINDS):
                row = [make(r, s, k, t) for t in range(tensors)]
                presented += sum(4 * int(np.prod(td.shard.full_shape if td.shard else td.shape)) for td in row)
                w.write(s, kind, row)
            w.complete_step(s)
        w.close()
    return presented


def build(path: str, size_bytes: int, ranks: int, steps: int, tensors: int, noise: float, seed: int,
          version: int = 3) -> int:
    """Write a store of ~size_bytes; the candidate (noise > 0) is the reference plus relative noise.

    Every (rank, step, kind, tensor) gets its own random data, so format 2 stores every byte too
    (no dedup) and both formats hold the same bytes."""
    from tracekit.store import TensorData, create_store

    per_row = size_bytes // (ranks * steps * len(KINDS))
    numel = max(tensors, per_row // 4 // tensors)
    create_store(path, {"mode": "ddp"}, force=True, format_version=version)

    def make(r, s, k, t):
        rng = np.random.default_rng([seed, r, s, k, t])
        x = rng.standard_normal(numel, dtype=np.float32)
        if noise:
            # reproduce the reference, then move each element by a few ulps
            x = np.random.default_rng([0, r, s, k, t]).standard_normal(numel, dtype=np.float32)
            x *= np.float32(1) + np.float32(noise) * rng.standard_normal(numel, dtype=np.float32)
        return TensorData(f"layer{t}.weight", "float32", (numel,), x)

    return write_ddp_like(path, ranks, steps, tensors, make)


def evict(*paths: str) -> None:
    """Drop every file of these folders from the page cache (written back first): the next read
    comes from the disk. posix_fadvise(DONTNEED) drops a file's clean cached pages, unprivileged."""
    for p in paths:
        for d, _, fs in os.walk(p):
            for f in fs:
                fd = os.open(os.path.join(d, f), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


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


# The same diff with `tracekit diff --check-hashes`: hash-decided objects read back and checked
# (the default, DIFF, decides equal hashes from the indexes alone).
DIFF_CHECKED = DIFF.replace("jobs=int(sys.argv[4]))", "jobs=int(sys.argv[4]), trust_index=False)")
assert DIFF_CHECKED != DIFF


def run(code: str, fields: int, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True)
    return out.stdout.split(maxsplit=fields - 1)


def build_layout(path: str, layout: str, version: int, size_bytes: int, ranks: int, steps: int, tensors: int,
                 noise: float = 0.0) -> int:
    """A store for the identical-store case: `size_bytes` of tensors as the ranks present them
    (every rank sees every tensor whole), the same data in either format.

    ddp:  every rank holds the same replica (format 2 stores it once, format 1 once per rank);
    fsdp: rank r holds row block r of every tensor: format 2 stores that piece (distinct pieces,
          no collective), format 1 (whole tensors only) the gathered tensor on every rank.
    Returns the bytes of tensor data the ranks present."""
    from tracekit.store import TensorData, create_store
    from tracekit.store.shards import Shard

    cols = 1024
    per_tensor = size_bytes // (ranks * steps * len(KINDS) * tensors)
    rows = max(ranks, per_tensor // 4 // cols // ranks * ranks)
    base = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    if noise:  # the candidate: every element moved by a few ulps
        base *= np.float32(1) + np.float32(noise) * np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32)
    per = rows // ranks
    create_store(path, {"mode": layout}, force=True, format_version=version)

    def make(r, s, k, t):
        shift = np.float32(s * 1000 + k * 100 + t)  # every (step, kind, tensor) its own bytes
        name = f"layer{t}.weight"
        if layout == "fsdp" and version >= 2:
            part = base[r * per : (r + 1) * per] + shift
            return TensorData(name, "float32", part.shape, part, Shard((rows, cols), (r * per, 0), part.shape, tuple(range(ranks))))
        return TensorData(name, "float32", (rows, cols), base + shift)

    return write_ddp_like(path, ranks, steps, tensors, make)


def _disk(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def identical(a, size: int) -> None:
    """Two identical stores diffed in format 1 and in format 2 or 3 (--format), same data, timed side by side,
    for each layout in --layouts and each --cache: from the page cache (format 1 then compares equal
    bytes at memory speed) and from the disk (format 1 must read every byte; format 2 or 3 only the
    indexes)."""
    new = max(a.format, 2)  # the hashed format compared with format 1
    caches = ("warm", "cold") if a.cache == "both" else (a.cache,)
    for layout in a.layouts.split(","):
        times = {}
        paths = {}
        for version in (1, new):
            ref, same = os.path.join(a.dir, f"id{version}-ref"), os.path.join(a.dir, f"id{version}-same")
            paths[version] = (ref, same)
            t = time.perf_counter()
            n = build_layout(ref, layout, version, size, a.ranks, a.steps, a.tensors)
            build_layout(same, layout, version, size, a.ranks, a.steps, a.tensors)
            print(f"identical {layout} stores, {a.ranks} ranks, format {version}: {n / 2**20:.0f} MiB of tensors "
                  f"presented, {_disk(ref) / 2**20:.0f} MiB on disk each (built in {time.perf_counter() - t:.0f} s)",
                  flush=True)
        for cache in caches:
            for version in (1, new):
                ref, same = paths[version]
                runs = [_timed_identical(DIFF, cache, ref, same, a) for _ in range(a.repeat)]
                times[cache, version] = min(float(r[1]) for r in runs)
                nb, _, _, peak, line, _ = runs[0]
                print(f"  {cache}, format {version}: diff {' / '.join(f'{float(r[1]):.2f} s, {float(r[2]):.2f} CPU-s ({r[5]})' for r in runs)}, "
                      f"{int(nb) / 2**20:.1f} MiB compared, peak RSS {int(peak) / 2**20:.0f} MiB   [{line.strip()}]", flush=True)
                if version != 1:
                    checked = [_timed_identical(DIFF_CHECKED, cache, ref, same, a) for _ in range(a.repeat)]
                    times[cache, "checked"] = min(float(r[1]) for r in checked)
                    print(f"  {cache}, format {version} with --check-hashes (hash-decided objects read back): "
                          f"{' / '.join(f'{float(r[1]):.2f} s, {float(r[2]):.2f} CPU-s ({r[5]})' for r in checked)}",
                          flush=True)
            print(f"identical {layout} stores, {cache}: format {new} diff is {times[cache, 1] / times[cache, new]:.1f}x "
                  f"faster than format 1 (best of {a.repeat}; target >= 10x); with --check-hashes "
                  f"{times[cache, 1] / times[cache, 'checked']:.1f}x", flush=True)
        if not a.keep:
            for ref, same in paths.values():
                shutil.rmtree(ref, ignore_errors=True)
                shutil.rmtree(same, ignore_errors=True)


def _timed_identical(code: str, cache: str, ref: str, same: str, a) -> list[str]:
    """One diff run of the pair in a fresh process, after dropping both stores from the page cache
    (cold) or reading them into it (warm: the raw read of every file)."""
    if cache == "cold":
        evict(ref, same)
    else:
        run(RAW, 3, ref, same)
    return run(code, 5, ROOT, ref, same, a.jobs) + [_load()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024, help="size of each store (default 1024)")
    ap.add_argument("--dir", default=None, help="the folder to make the bench's own folder, tracekit-bench-diff, in "
                    "(default: the temp folder); only that folder is removed at the end (bench/workdir.py)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=8, help="tensors per kind")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    ap.add_argument("--cache", default="both", choices=("warm", "cold", "both"),
                    help="different stores read from the page cache (warm), from the disk (cold: the files "
                         "dropped from the page cache before each run), or both (default)")
    ap.add_argument("--format", type=int, default=3, choices=(1, 2, 3),
                    help="store format of the two stores (default 3: tensors under 1 MiB packed; 2: an object each)")
    ap.add_argument("--identical", action="store_true", help="also time identical stores, format 1 vs --format (2 or 3)")
    ap.add_argument("--identical-only", action="store_true", help="only the identical-store case")
    ap.add_argument("--identical-mb", type=float, default=None, help="size of each identical store (default --size-mb)")
    ap.add_argument("--layouts", default="ddp,fsdp", help="layouts of the identical-store case (ddp, fsdp)")
    ap.add_argument("--diff-layout", default="ddp", choices=("ddp", "fsdp"),
                    help="layout of the different-stores case: ddp (every rank its own data) or fsdp (row blocks, "
                         "every rank presenting the same whole tensors)")
    a = ap.parse_args()
    a.dir = own_folder(a.dir, "tracekit-bench-diff")
    size = int(a.size_mb * 2**20)
    if not a.identical_only:
        different(a, size)
    if a.identical or a.identical_only:
        identical(a, int((a.identical_mb or a.size_mb) * 2**20))
    if not a.keep:
        remove_own(a.dir)


def different(a, size: int) -> None:
    """Two stores that differ everywhere: the diff against a raw read of the same files."""
    ref, cand = os.path.join(a.dir, "ref"), os.path.join(a.dir, "cand")
    t = time.perf_counter()
    marker = os.path.join(a.dir, f"built-{a.diff_layout}-{a.format}-{a.size_mb}-{a.ranks}-{a.steps}-{a.tensors}")
    if a.keep and os.path.exists(marker):  # reuse the stores of a previous --keep run of the same size
        n = int(open(marker).read())
    elif a.diff_layout == "fsdp":
        n = build_layout(ref, "fsdp", a.format, size, a.ranks, a.steps, a.tensors)
        build_layout(cand, "fsdp", a.format, size, a.ranks, a.steps, a.tensors, noise=1e-7)
    else:
        n = build(ref, size, a.ranks, a.steps, a.tensors, 0.0, 0, a.format)
        build(cand, size, a.ranks, a.steps, a.tensors, 1e-7, 1, a.format)
        open(marker, "w").write(str(n))
    print(f"2 format-{a.format} {a.diff_layout} stores of {n / 2**20:.0f} MiB tensor data each ({_disk(ref) / 2**20:.0f} MiB "
          f"on disk) ready in {time.perf_counter() - t:.1f} s",
          flush=True)
    # The machine may be shared: wall-clock figures are taken as the best of --repeat runs, and the
    # CPU-time rates (bytes per CPU-second, all threads) show the work per byte whatever the load.
    for cache in (("warm", "cold") if a.cache == "both" else (a.cache,)):
        measure_different(a, ref, cand, n, cache)
    if not a.keep:
        shutil.rmtree(ref, ignore_errors=True)
        shutil.rmtree(cand, ignore_errors=True)


def measure_different(a, ref: str, cand: str, n: int, cache: str) -> None:
    """--repeat runs of the raw read and the diff, read from the page cache (`warm`) or the disk (`cold`)."""
    best = {"raw": 0.0, "diff": 0.0, "raw_cpu": 0.0, "diff_cpu": 0.0, "ratio": 0.0, "cpu_ratio": 0.0}
    rss = 0
    if cache == "warm":
        run(RAW, 3, ref, cand)  # the page cache filled, whatever ran before
    for i in range(a.repeat):
        load0 = _load()
        if cache == "cold":
            evict(ref, cand)
        nb, sec, cpu = run(RAW, 3, ref, cand)
        raw_bytes, raw_sec = int(nb), float(sec)
        raw, raw_cpu = raw_bytes / raw_sec, raw_bytes / float(cpu)
        if cache == "cold":
            evict(ref, cand)
        nb, sec, cpu, peak, line = run(DIFF, 5, ROOT, ref, cand, a.jobs)
        rate, rate_cpu = int(nb) / float(sec), int(nb) / float(cpu)
        ratio = raw_sec / float(sec)  # the same files: raw read time over diff time
        # the same in CPU-seconds (every thread of each): the raw read is one thread, the diff
        # --jobs threads, so the wall-clock ratio counts the diff's second core; this one does not
        cpu_ratio = (raw_bytes / raw_cpu) / float(cpu)
        rss = max(rss, int(peak))
        print(f"{cache} run {i + 1}: raw read {raw_bytes / 2**20:.0f} MiB in {raw_sec:.2f} s = {raw / 2**20:6.0f} MiB/s "
              f"({raw_cpu / 2**20:6.0f} per CPU-s)   diff {int(nb) / 2**20:.0f} MiB in {float(sec):.2f} s = "
              f"{rate / 2**20:6.0f} MiB/s ({rate_cpu / 2**20:6.0f} per CPU-s)   raw time / diff time {ratio:.2f} "
              f"(CPU-s {cpu_ratio:.2f})   "
              f"diff peak RSS {int(peak) / 2**20:.0f} MiB   [{load0} / {_load()}]   [{line.strip()}]", flush=True)
        for k, v in (("raw", raw), ("diff", rate), ("raw_cpu", raw_cpu), ("diff_cpu", rate_cpu), ("ratio", ratio),
                     ("cpu_ratio", cpu_ratio)):
            best[k] = max(best[k], v)
    print(json.dumps({"cache": cache, "format": a.format, "store_mib": round(n / 2**20), "jobs": a.jobs,
                      "raw_mib_s": round(best["raw"] / 2**20),
                      "diff_mib_s": round(best["diff"] / 2**20), "ratio": round(best["ratio"], 3),
                      "cpu_ratio": round(best["cpu_ratio"], 3),
                      "raw_mib_per_cpu_s": round(best["raw_cpu"] / 2**20),
                      "diff_mib_per_cpu_s": round(best["diff_cpu"] / 2**20),
                      "diff_peak_rss_mib": round(rss / 2**20)}), flush=True)


if __name__ == "__main__":
    main()
