"""Benchmark (not a test): filling a step's fresh spool slab, with and without a spare whose pages a
thread of the rank's allocated ahead (tracekit/writer/handoff.py, SpareSlab); side by side in one run.

Each step takes a slab of --mb MB from a rank's Handoff and fills it with pwrite() in 45 pieces, as
the direct capture fills a fresh slab (recorders/direct.py), then "trains" for --train-ms of numpy
work on the same thread. Every slab is kept, as while the writer process holds the steps
(--hold-mb), so no slab is ever reused: each step needs a fresh one. Variants, interleaved:
  without   Handoff._prepare_spare switched off (every slab made fresh on the training thread)
  spare     as tracekit runs (the next slab's pages allocated by the spare thread, at nice 19)
Prints per variant the training thread's time to fill a slab (wall and its thread's CPU, median over
the steps after the first, which never has a spare), and the process's CPU per step (the spare
thread's included).

    OMP_NUM_THREADS=1 python bench/bench_spare_slab.py [--mb 37] [--steps 10] [--repeats 3] [--train-ms 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tracekit.store import create_store  # noqa: E402
from figures import spread  # noqa: E402  (this folder's)
from tracekit.writer.handoff import Handoff  # noqa: E402

PIECES = 45  # the TorchTitan debug model's parameter pieces per kind on a rank


def train(ms: float, work: np.ndarray) -> None:
    """About `ms` of CPU on this thread."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        np.sqrt(work, out=work)


def run(store: str, size: int, steps: int, train_ms: float, spare: bool) -> tuple[list[float], list[float], float]:
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 4 * steps * size, hold_bytes=4 * steps * size)
    if not spare:
        handoff._prepare_spare = lambda size, budget: None
    pieces = np.array_split(np.random.default_rng(0).random(size // 8).view(np.uint8), PIECES)
    work = np.random.default_rng(1).random(1 << 16) + 1.0
    walls, cpus, kept = [], [], []
    cpu0 = time.process_time()
    try:
        for _ in range(steps):
            t, c = time.perf_counter(), time.thread_time()
            slab = handoff.slab(size)
            offset = 0
            for piece in pieces:
                slab.write_at(offset, piece)
                offset += piece.nbytes
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            kept.append(slab)  # held: never given back for reuse
            train(train_ms, work)
        per_step = (time.process_time() - cpu0) / steps
    finally:
        for slab in kept:
            slab.discard()
        handoff.close("finished")
    return walls[1:], cpus[1:], per_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=37)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-ms", type=float, default=100)
    args = p.parse_args()
    size = int(args.mb * (1 << 20)) // 4096 * 4096
    work = tempfile.mkdtemp(prefix="tracekit-bench-spare-")
    results: dict[str, tuple[list, list, list]] = {"without": ([], [], []), "spare": ([], [], [])}
    try:
        for _ in range(args.repeats):
            for label in results:
                store = os.path.join(work, "store")
                shutil.rmtree(store, ignore_errors=True)
                create_store(store, {})
                walls, cpus, per_step = run(store, size, args.steps, args.train_ms, label == "spare")
                results[label][0].extend(walls)
                results[label][1].extend(cpus)
                results[label][2].append(per_step)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"fill of a fresh {size / (1 << 20):.0f} MB slab, {args.steps} steps x {args.repeats} repeats, "
          f"{args.train_ms:g} ms of training a step: median (min-max)")
    med = {}
    for label, (walls, cpus, per_step) in results.items():
        med[label] = statistics.median(walls)
        print(f"  {label:8} training thread {spread(walls, ' ms wall', 2, scale=1e3)}, "
              f"{statistics.median(cpus) * 1e3:6.2f} ms CPU; process CPU a step {statistics.median(per_step) * 1e3:6.1f} ms")
    print(f"  training thread, without / spare: {med['without'] / med['spare']:.2f}x")


if __name__ == "__main__":
    main()
