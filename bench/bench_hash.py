"""Which content hash for format v2: xxh3-128 vs blake3, single thread (one recorder thread per rank).

Prints GB/s of each over the same buffers, measured side by side in one run, and the ratio.
Usage: python bench/bench_hash.py [--mb 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def rate(fn, data: memoryview, repeat: int) -> float:
    fn(data)  # warm the page cache and the code
    best = min(_timed(fn, data) for _ in range(repeat))
    return len(data) / best / 1e9


def _timed(fn, data) -> float:
    t = time.perf_counter()
    fn(data)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import blake3
    import xxhash

    data = memoryview(np.random.default_rng(0).standard_normal(args.mb * (1 << 18)).astype(np.float32)).cast("B")
    small = [memoryview(np.ones(n, np.float32)).cast("B") for n in (1, 256, 4096)]
    results = {
        "xxh3_128": rate(lambda d: xxhash.xxh3_128(d).digest(), data, args.repeat),
        "blake3 (1 thread)": rate(lambda d: blake3.blake3(d).digest(), data, args.repeat),
        "blake3 (all threads)": rate(lambda d: blake3.blake3(d, max_threads=blake3.blake3.AUTO).digest(), data, args.repeat),
    }
    print(f"{args.mb} MiB of float32, best of {args.repeat}:")
    for name, gbs in results.items():
        print(f"  {name:22s} {gbs:6.2f} GB/s  ({gbs / results['xxh3_128']:.2f}x xxh3_128)")
    for s in small:
        n = 20000
        t = time.perf_counter()
        for _ in range(n):
            xxhash.xxh3_128(s).digest()
        tx = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for _ in range(n):
            blake3.blake3(s).digest()
        tb = (time.perf_counter() - t) / n
        print(f"  {len(s):6d}-byte tensor: xxh3_128 {tx * 1e6:.2f} us, blake3 {tb * 1e6:.2f} us ({tb / tx:.1f}x)")


if __name__ == "__main__":
    main()
