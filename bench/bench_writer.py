"""CPU the writer process spends per recorded step, in-process: one FSDP rank's step of the 10M (or 100M) model.

Run: OMP_NUM_THREADS=1 python bench/bench_writer.py [--dir DIR] [--steps N] [--summaries-only]
                                                     [--profile] [--format 3|2|1] [--params 10|100]

Feeds tracekit.store.RankWriter what the writer process (tracekit/writer/spool_writer.py) gets from one
rank of bench/bench_record.py --params 10 (or 100) with 2 FSDP ranks: parameters, gradients and
deltas, 200 pieces each (100 x Linear(316) halves; Linear(1000) at 100M), plus the output and the loss; each step changes every
tensor's bytes, as training does. The step goes through a spool entry (written with write_entry,
read back with read_entry, as the writer process reads it), so reading the spool is measured too.

Prints CPU ms per step (process time: the figure that competes with the training ranks for cores)
and wall ms, split into: reading the spool entry, the store write (RankWriter.write and
complete_step), and, on their own, the summaries and hashes of the same tensors, and what
creating a file costs on the disk before and after (bench_record.py's doc says why). The store is
removed at the end. --profile: cProfile of the store write instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

def tensors(rng, W: int):
    from tracekit.store import TensorData
    from tracekit.store.shards import Shard

    half = W // 2
    out = []
    for kind in ("parameters", "gradients", "deltas"):
        for i in range(100):
            w = rng.standard_normal((half, W)).astype(np.float32)
            b = rng.standard_normal((half,)).astype(np.float32)
            out.append((kind, TensorData(f"{i}.weight", "float32", (half, W), w, Shard((W, W), (0, 0), (half, W), (0, 1)))))
            out.append((kind, TensorData(f"{i}.bias", "float32", (half,), b, Shard((W,), (0,), (half,), (0, 1)))))
    out.append(("output", TensorData("output", "float32", (64, W), rng.standard_normal((64, W)).astype(np.float32))))
    out.append(("loss", TensorData("loss", "float32", (), np.array([1.0], dtype=np.float32))))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default=None, help="folder for the store and the spool (default: the temp folder)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--summaries-only", action="store_true", help="--full matching no tensor")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--format", type=int, default=3, help="store format: 3 (packs), 2 (a file per tensor) or 1")
    p.add_argument("--params", type=int, choices=(10, 100), default=10, help="bench_record.py's model size, millions")
    args = p.parse_args(argv)
    from bench_record import SHAPES, create_cost  # this folder's: its model, and what creating a file costs

    from tracekit.writer.spool import read_entry, write_entry
    from tracekit.store.hashing import tensor_hash
    from tracekit.store.summaries import summarize
    from tracekit.store.writer import RankWriter, create_store

    rng = np.random.default_rng(0)
    step_tensors = tensors(rng, SHAPES[args.params][1])
    if args.format == 1:
        step_tensors = [(k, t.__class__(t.name, t.dtype, t.shard.full_shape if t.shard else t.shape, t.data))
                        for k, t in step_tensors if t.shard is None]

    work = tempfile.mkdtemp(prefix="bench_writer_", dir=args.dir)
    try:
        probe = create_cost(work)
        create_store(os.path.join(work, "s"), {}, format_version=args.format)
        full = ("tracekit-bench-matches-no-tensor",) if args.summaries_only else ()
        w = RankWriter(os.path.join(work, "s"), 0, {}, full=full)
        spool = os.path.join(work, "entry.step")
        t_read = t_write = w_read = w_write = sys_write = 0.0

        def step(s: int):
            nonlocal t_read, t_write, w_read, w_write, sys_write
            for _, t in step_tensors:  # fresh bytes each step, as training changes them
                t.data.reshape(-1)[0] += 1
            write_entry(spool, s, True, step_tensors)
            c0, t0 = time.process_time(), time.perf_counter()
            entry = read_entry(spool)
            c1, t1, k1 = time.process_time(), time.perf_counter(), os.times().system
            for kind, ts in entry.kinds.items():
                w.write(entry.step, kind, ts)
            w.complete_step(entry.step)
            entry.close()
            c2, t2 = time.process_time(), time.perf_counter()
            sys_write += os.times().system - k1
            t_read += c1 - c0
            t_write += c2 - c1
            w_read += t1 - t0
            w_write += t2 - t1

        step(0)
        t_read = t_write = w_read = w_write = sys_write = 0.0
        if args.profile:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            for s in range(1, args.steps + 1):
                step(s)
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        else:
            for s in range(1, args.steps + 1):
                step(s)
        n = args.steps
        print(f"format {args.format}, {'summaries only' if args.summaries_only else 'bytes kept'}, "
              f"{len(step_tensors)} tensors, {sum(t.data.nbytes for _, t in step_tensors) / 1e6:.1f} MB per step, "
              f"load {os.getloadavg()[0]:.2f}; creating a file: {probe * 1e6:.0f} us before, "
              f"{create_cost(work) * 1e6:.0f} us after (bench_record.py's doc)")
        print(f"  read spool entry   CPU {t_read / n * 1e3:7.1f} ms/step   wall {w_read / n * 1e3:7.1f}")
        print(f"  store write        CPU {t_write / n * 1e3:7.1f} ms/step   wall {w_write / n * 1e3:7.1f}"
              f"   (of the CPU, in the kernel: {sys_write / n * 1e3:.0f} ms)")
        data = [t for _, t in step_tensors]
        c0 = time.process_time()
        for t in data:
            summarize(t.data, t.dtype)
        c1 = time.process_time()
        for t in data:
            tensor_hash(t.name, t.dtype, t.shape, t.data, t.shard)
        c2 = time.process_time()
        print(f"  of which summaries CPU {(c1 - c0) * 1e3:7.1f} ms/step, hashes {(c2 - c1) * 1e3:.1f} ms/step (alone)")
        w.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
