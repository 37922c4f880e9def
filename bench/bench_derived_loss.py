"""Benchmark of deriving the global loss at finalize (not a test); prints times side by side.

Builds a zero-code-shaped store (each rank's local loss per step, DDP coordinates) of RANKS x
STEPS, then finalizes copies of it alternately with and without the derivation
(tracekit/store/derived_loss.py: read every local loss, write each rank's `loss` kind, remove
the local losses), so the difference is the derivation's cost.

    python bench/bench_derived_loss.py [--ranks 4] [--steps 200] [--repeats 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tracekit.store import RankWriter, TensorData, create_store  # noqa: E402
import tracekit.store.finalize as finalize  # noqa: E402
from tracekit.store.global_loss import derivation_attrs  # noqa: E402


def build(path: str, ranks: int, steps: int) -> None:
    rng = np.random.default_rng(0)
    create_store(path, {"launcher": "bench", "record_config": {"kinds": ["loss"]}})
    for r in range(ranks):
        coords = {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r, "tp_degree": 1, "tp_rank": 0,
                  "meshes": []}
        w = RankWriter(path, r, {"coords": coords, "run": {}, **derivation_attrs()})
        for s in range(1, steps + 1):
            w.write(s, "local_loss", [TensorData("local_loss", "float32", (), np.float32(rng.random()).reshape(()))])
            w.complete_step(s)
        w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default=None, help="where to build (default: a new temporary folder, removed after)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="tracekit-bench-derived-loss-", dir=args.dir)
    try:
        base = os.path.join(work, "base")
        build(base, args.ranks, args.steps)
        derive = finalize.write_derived_losses
        times: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(args.repeats):
            for label in ("without", "with"):
                copy = os.path.join(work, "copy")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(base, copy)
                finalize.write_derived_losses = derive if label == "with" else (lambda location, store: {})
                start = time.perf_counter()
                finalize.finalize_store(copy, 0)
                times[label].append(time.perf_counter() - start)
        finalize.write_derived_losses = derive
        rows = args.ranks * args.steps
        best = {k: min(v) for k, v in times.items()}
        print(f"finalize of {args.ranks} ranks x {args.steps} steps: without derivation {best['without']:.3f} s, "
              f"with {best['with']:.3f} s ({(best['with'] - best['without']) / rows * 1e3:.2f} ms per rank and step; "
              f"all runs: {', '.join(f'{k} ' + ' '.join(f'{t:.2f}' for t in v) for k, v in times.items())})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
