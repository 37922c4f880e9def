"""Benchmark (not a test): a writer storing held steps, its object writes in line or from the
object queue's thread (tracekit/store/object_queue.py); side by side in one run.

Builds --entries spool entries of one FSDP rank's step (bench_writer.py's tensors: parameters,
gradients and deltas of bench_record.py's 10M model, 200 pieces each, ~60 MB a step), as the
writer process finds them held at the end of training, then stores them all with one
RankWriter.write_steps into a fresh local store, as the writer process does. Variants, interleaved
(the order swapped every repeat):
  in line   each object write waited for as soon as it is handed over (the queue's put() followed
            by settle(), as if there were no thread)
  queued    as tracekit runs (up to object_queue.DEPTH writes in flight)
Prints per variant the median wall and CPU seconds (the process's: the write thread's included)
of the write_steps call, and the ratio of the walls. The store's folder is on --dir's disk: the
gain is the disk's time hidden behind the hashing, so a store in memory (tmpfs) shows none.

    OMP_NUM_THREADS=1 python bench/bench_object_queue.py [--entries 10] [--repeats 6] [--dir DIR]
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_record import SHAPES  # noqa: E402  (this folder's: the model's sizes)
from figures import spread  # noqa: E402  (this folder's)
from bench_writer import tensors  # noqa: E402  (this folder's: one FSDP rank's tensors)
import tracekit.store.object_queue as object_queue  # noqa: E402
from tracekit.store.writer import RankWriter, create_store  # noqa: E402
from tracekit.writer.spool import read_entry, write_entry  # noqa: E402

QUEUED_PUT = object_queue.ObjectQueue.put


def _put_in_line(self, *args, **kwargs):
    QUEUED_PUT(self, *args, **kwargs)
    self.settle()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=10)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--width", type=int, default=SHAPES[10][1], help="the Linear layers' width (a step's size)")
    p.add_argument("--dir", default=None, help="where the store goes (default: the temp folder)")
    args = p.parse_args()
    step_tensors = tensors(np.random.default_rng(0), args.width)
    work = tempfile.mkdtemp(prefix="tracekit-bench-object-queue-", dir=args.dir)
    spool = tempfile.mkdtemp(prefix="tracekit-bench-object-queue-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    times: dict[str, list[tuple[float, float]]] = {"in line": [], "queued": []}
    try:
        names = []
        for s in range(1, args.entries + 1):
            for _, t in step_tensors:  # fresh bytes each step, as training changes them
                t.data.reshape(-1)[0] += 1
            names.append(os.path.join(spool, f"{s}.step"))
            write_entry(names[-1], s, True, step_tensors)
        for r in range(args.repeats):
            for label in ("in line", "queued") if r % 2 else ("queued", "in line"):
                object_queue.ObjectQueue.put = _put_in_line if label == "in line" else QUEUED_PUT
                store = os.path.join(work, f"store-{r}-{label.replace(' ', '-')}")
                create_store(store, {"launcher": "bench"})
                writer = RankWriter(store, 0, {})
                entries = [read_entry(n) for n in names]
                cpu, wall = time.process_time(), time.perf_counter()
                writer.write_steps([(e.step, e.kinds, e.complete) for e in entries])
                times[label].append((time.perf_counter() - wall, time.process_time() - cpu))
                for e in entries:
                    e.close()
                writer.close()
    finally:
        object_queue.ObjectQueue.put = QUEUED_PUT
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(spool, ignore_errors=True)
    mb = sum(t.data.nbytes for _, t in step_tensors) / 1e6
    print(f"{args.entries} held entries of {mb:.1f} MB stored at once, median of {args.repeats} (range):")
    med = {}
    for label, runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        med[label] = statistics.median(walls)
        print(f"  {label:8} wall {spread(walls, ' s')}   CPU {spread(cpus, ' s')}")
    print(f"  wall, in line / queued: {med['in line'] / med['queued']:.2f}x")


if __name__ == "__main__":
    main()
