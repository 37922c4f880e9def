"""The crash-proof hand-off's cost on the training thread, side by side with the copy it adds to.

Run: python bench/bench_handoff.py [--params 1,10,25] [--steps 5] [--dir DIR]

For a model of P million float32 parameters in 200 tensors, one recorded step hands over
parameters, gradients and deltas (3 x 4P MB). Measured in one run, per step:
  - clone: the in-loop copy the recorder has always taken of those tensors (torch clone);
  - hand-off: writing them into the spool and sealing the entry (tracekit/writer/handoff.py), the work
    the training thread now does before the step counts as safe, for a spool in /dev/shm and one
    in the store's folder (a disk's page cache, where /dev/shm is too small);
  - drain: how long the writer process then takes to put the steps into the store (background);
  - writer start: from starting the writer process to its first "ready" (once per rank).
The ratio hand-off / clone says what durability costs relative to the copy the step already pays.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

from tracekit.writer.handoff import Handoff
from tracekit.store import create_store
from tracekit.store.tensors import from_torch

TENSORS = 200


def tensors_of(million: float) -> list[torch.Tensor]:
    per = int(million * 1e6) // TENSORS
    return [torch.randn(per) for _ in range(TENSORS)]


def bench(million: float, steps: int, spool_root: str, store_dir: str) -> dict:
    params = tensors_of(million)
    kinds = ("parameters", "gradients", "deltas")
    step_bytes = 3 * sum(t.numel() * 4 for t in params)
    store = os.path.join(store_dir, f"s{million}-{os.path.basename(spool_root)}")
    shutil.rmtree(store, ignore_errors=True)
    create_store(store, {})
    os.environ["TRACEKIT_SPOOL"] = spool_root
    try:
        t0 = time.perf_counter()
        ho = Handoff(store, 0, {"coords": {"rank": 0}}, max_bytes=(steps + 1) * step_bytes)  # never waits
        ho._wait_ready()
        start_s = time.perf_counter() - t0
    finally:
        del os.environ["TRACEKIT_SPOOL"]
    ho.put(0, [("parameters", from_torch(f"t{i}", t)) for i, t in enumerate(params)], complete=False)
    ho.flush()  # warm-up: the writer process has started and created its arrays
    clone_s = handoff_s = drain_s = 0.0
    for step in range(1, steps + 1):
        # each phase timed while the writer process is idle (flushed), so they do not share the CPU
        t0 = time.perf_counter()
        copies = {k: [t.clone() for t in params] for k in kinds}
        t1 = time.perf_counter()
        entries = [(k, from_torch(f"t{i}", t)) for k in kinds for i, t in enumerate(copies[k])]
        ho.provisional(step, entries)
        ho.seal()
        t2 = time.perf_counter()
        ho.flush()
        t3 = time.perf_counter()
        clone_s += t1 - t0
        handoff_s += t2 - t1
        drain_s += t3 - t2
        del copies, entries
    ho.close("finished")
    shutil.rmtree(store, ignore_errors=True)
    mb = step_bytes / 1e6
    return {"mb": mb, "clone_ms": 1e3 * clone_s / steps, "handoff_ms": 1e3 * handoff_s / steps,
            "drain_mb_s": steps * mb / drain_s, "start_s": start_s}


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    p.add_argument("--params", default="1,10,25", help="model sizes, millions of float32 parameters")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp folder)")
    args = p.parse_args()
    store_dir = tempfile.mkdtemp(prefix="bench-handoff-", dir=args.dir)
    disk_spool = tempfile.mkdtemp(prefix="spool-", dir=store_dir)
    roots = [("/dev/shm", "/dev/shm")] if os.access("/dev/shm", os.W_OK) else []
    roots.append(("disk", disk_spool))
    print(f"{'params':>7} {'spool':>8} {'MB/step':>8} {'clone ms':>9} {'hand-off ms':>12} {'hand-off/clone':>15} "
          f"{'hand-off GB/s':>14} {'drain MB/s':>11} {'writer start s':>15}")
    try:
        for million in [float(x) for x in args.params.split(",")]:
            for name, root in roots:
                r = bench(million, args.steps, root, store_dir)
                print(f"{million:>6g}M {name:>8} {r['mb']:>8.0f} {r['clone_ms']:>9.1f} {r['handoff_ms']:>12.1f} "
                      f"{r['handoff_ms'] / r['clone_ms']:>15.2f} {r['mb'] / r['handoff_ms']:>14.2f} "
                      f"{r['drain_mb_s']:>11.0f} {r['start_s']:>15.2f}", flush=True)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
