"""Benchmark (not a test): do recording's start-up and finalize grow with the number of parameter
tensors faster than with their bytes? Prints each phase for many small tensors and for few big
ones of the same total bytes, side by side, with the ratio.

One process (a world of one), tracekit's Recorder on a model that is N parameter tensors (a
ParameterList; the loss is a weighted sum, the optimizer plain SGD), into a fresh store, phases:
  start-up  Recorder.start(): the store's root, the rank's writer process, hooks
  step 1    the first recorded step (initial parameters; each kind's index made)
  step      median of the later steps (per step: every tensor hashed, summarized, written)
  close     Recorder.close(): the writer stores every spooled step
  finalize  finalize_store (run summary, derived losses where any, consolidated metadata)
Runs alternate (few, many, few, ...) --repeats times; medians, with the range.

    python bench/bench_tensor_count.py [--many 2000] [--few 4] [--mb 8] [--steps 4] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from tracekit.recorders.recorder import Recorder  # noqa: E402
from tracekit.store import create_store, finalize_store  # noqa: E402
from figures import spread  # noqa: E402  (this folder's)

PHASES = ("start-up", "step 1", "step", "close", "finalize")


def one_run(path: str, tensors: int, total_bytes: int, steps: int) -> dict[str, float]:
    numel = total_bytes // 4 // tensors
    torch.manual_seed(0)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(numel)) for _ in range(tensors)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    weights = torch.linspace(0.5, 1.5, numel)
    create_store(path, {"launcher": "bench"})
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    began = time.perf_counter()
    rec = Recorder(model, optimizer, store=path).start()
    times["start-up"].append(time.perf_counter() - began)
    for step in range(1, steps + 1):
        began = time.perf_counter()
        out = torch.stack([(p * weights).sum() for p in model])
        loss = out.square().mean()
        loss.backward()
        rec.observe(output=out, loss=loss)
        optimizer.step()
        optimizer.zero_grad()
        times["step 1" if step == 1 else "step"].append(time.perf_counter() - began)
    began = time.perf_counter()
    rec.close()
    times["close"].append(time.perf_counter() - began)
    began = time.perf_counter()
    finalize_store(path, 0)
    times["finalize"].append(time.perf_counter() - began)
    return {p: statistics.median(v) for p, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--many", type=int, default=2000)
    p.add_argument("--few", type=int, default=4)
    p.add_argument("--mb", type=float, default=8.0, help="total parameter MB, the same for both")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a new temporary folder, removed after)")
    args = p.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="tracekit-bench-tensor-count-", dir=args.dir)
    total = int(args.mb * 1024 * 1024)
    results: dict[int, list[dict[str, float]]] = {args.few: [], args.many: []}
    try:
        for i in range(args.repeats):
            for n in (args.few, args.many):
                path = os.path.join(work, f"s{n}-{i}")
                results[n].append(one_run(path, n, total, args.steps))
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.mb:g} MB of float32 parameters as {args.few} or {args.many} tensors, {args.steps} steps, "
          f"median of {args.repeats} (range)")
    print(f"{'':10s} {args.few:>6d} tensors {'':10s} {args.many:>6d} tensors {'':10s} ratio")
    for phase in PHASES:
        few, many = ([r[phase] for r in results[n]] for n in (args.few, args.many))
        cell = lambda xs: spread(xs, "s", 3, 7)  # noqa: E731
        print(f"{phase:10s} {cell(few):>26s} {cell(many):>26s} {statistics.median(many) / statistics.median(few):6.1f}x")


if __name__ == "__main__":
    main()
