"""What the writer's per-tensor work costs with and without kept bytes (format 2, --full).

Side by side in one run, over the same float32 tensors, through the store writer API
(RankWriter, what each rank's writer process runs): writing every tensor's bytes (no --full) vs
summaries and hashes only (--full matching nothing), and the parts: hashing and summarizing
alone. Prints seconds and ratios; nothing here is a pass/fail gate.
Usage: python bench/bench_summaries.py [--mb 64] [--tensors 16] [--steps 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np

from tracekit.store import RankWriter, TensorData, create_store
from tracekit.store.hashing import tensor_hash
from tracekit.store.summaries import summarize


def _record(path: str, tensors_per_step, full) -> float:
    create_store(path, {})
    w = RankWriter(path, 0, {"coords": {"rank": 0, "world_size": 1}}, full=full)
    t = time.perf_counter()
    for step, tensors in enumerate(tensors_per_step, start=1):
        w.write(step, "gradients", tensors)
        w.complete_step(step)
    took = time.perf_counter() - t
    w.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="bytes per step, all tensors together")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    n = a.mb * (1 << 20) // 4 // a.tensors
    rng = np.random.default_rng(0)
    steps = [[TensorData(f"t{i}", "float32", (n,), rng.standard_normal(n, dtype=np.float32)) for i in range(a.tensors)]
             for _ in range(a.steps)]
    flat = [t.data for s in steps for t in s]
    total = sum(x.nbytes for x in flat)
    t = time.perf_counter()
    for x in flat:
        tensor_hash("t", "float32", x.shape, x)
    hash_s = time.perf_counter() - t
    t = time.perf_counter()
    for x in flat:
        summarize(x, "float32")
    summ_s = time.perf_counter() - t
    root = tempfile.mkdtemp(prefix="bench_summaries_")
    try:
        full_s = _record(f"{root}/full", steps, ())
        none_s = _record(f"{root}/none", steps, ("loss:*",))  # matches no gradient: summaries + hashes only
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = total / 1e6
    print(f"{mb:.0f} MB of float32 in {len(flat)} tensors")
    print(f"hash only:            {hash_s:.3f} s ({mb / hash_s:.0f} MB/s)")
    print(f"summaries only:       {summ_s:.3f} s ({mb / summ_s:.0f} MB/s)")
    print(f"writer, all bytes:    {full_s:.3f} s")
    print(f"writer, no bytes:     {none_s:.3f} s")
    print(f"ratio summaries/hash: {summ_s / hash_s:.2f}x; writer no-bytes/all-bytes: {none_s / full_s:.2f}x")


if __name__ == "__main__":
    main()
