"""Benchmark of deriving the global loss at finalize (not a test); prints times side by side.

Builds a zero-code-shaped store (each rank's local loss per step, DDP coordinates) of RANKS x
STEPS, then finalizes copies of it, interleaved (ABC ABC ...):
  without   finalize with the derivation switched off (the rest of finalize's cost)
  per row   the derivation as it was: the `loss` rows appended one step at a time (four metadata
            documents rewritten per row) and the local losses removed through zarr, file by file
  bulk      the derivation as it is (tracekit/store/derived_loss.py): each rank's rows stored at
            once (writer.append_rows), the local losses' folder removed in one go
Prints the median and the range of each, the per rank-step cost over `without`, and the ratio.

    python bench/bench_derived_loss.py [--ranks 4] [--steps 200] [--repeats 3] [--dir DIR]
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
import zarr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tracekit.store import RankWriter, TensorData, create_store  # noqa: E402
from figures import spread  # noqa: E402  (this folder's)
import tracekit.store.finalize as finalize  # noqa: E402
import tracekit.store.writer as writer  # noqa: E402
from tracekit.store import io  # noqa: E402
from tracekit.store.format import ROOT_KEY, rank_group_name  # noqa: E402
from tracekit.store.formats import READERS  # noqa: E402
from tracekit.store.global_loss import derivation_attrs  # noqa: E402
from tracekit.store.location import resolve  # noqa: E402


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


def per_row_add_kind(store_path, rank, kind, rows, storage_options=None):
    """writer.add_kind before the bulk write: one append (and its metadata rewrites) per row."""
    location = resolve(store_path, storage_options)
    root = zarr.open_group(location.zarr_store(), mode="r+", use_consolidated=False)
    group = root[rank_group_name(rank)]
    fmt = READERS[root.attrs[ROOT_KEY]["format_version"]]
    kind_writer = writer._new_kind_writer(group, kind, fmt, io.byte_store(location), (), rank)
    for step, tensors in rows:
        kind_writer.append(step, tensors)


def zarr_remove_kind(store_path, rank, kind, storage_options=None):
    """writer.remove_kind before: zarr deletes the kind's files one by one."""
    root = zarr.open_group(resolve(store_path, storage_options).zarr_store(), mode="r+", use_consolidated=False)
    del root[rank_group_name(rank)][kind]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to build (default: a new temporary folder, removed after)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="tracekit-bench-derived-loss-", dir=args.dir)
    derive, bulk = finalize.write_derived_losses, (writer.add_kind, writer.remove_kind)
    ways = {"without": (lambda location, store: {}, bulk), "per row": (derive, (per_row_add_kind, zarr_remove_kind)),
            "bulk": (derive, bulk)}
    try:
        base = os.path.join(work, "base")
        build(base, args.ranks, args.steps)
        times: dict[str, list[float]] = {label: [] for label in ways}
        for _ in range(args.repeats):
            for label, (derivation, (add, remove)) in ways.items():
                copy = os.path.join(work, "copy")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(base, copy)
                finalize.write_derived_losses, writer.add_kind, writer.remove_kind = derivation, add, remove
                start = time.perf_counter()
                finalize.finalize_store(copy, 0)
                times[label].append(time.perf_counter() - start)
        finalize.write_derived_losses, (writer.add_kind, writer.remove_kind) = derive, bulk
        rows = args.ranks * args.steps
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"finalize of {args.ranks} ranks x {args.steps} steps, median of {args.repeats} (range):")
        for label, ts in times.items():
            extra = "" if label == "without" else f", {(med[label] - med['without']) / rows * 1e3:.2f} ms per rank-step"
            print(f"  {label:8} {spread(ts, ' s')}{extra}")
        print(f"  per row / bulk: {med['per row'] / med['bulk']:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
