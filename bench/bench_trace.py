"""Cost of `--trace`: traced step time over untraced step time, and trace bytes per step.

Run: python bench/bench_trace.py [--steps 5] [--models tutorial,10m] [--dir DIR]

Single process, 1 thread (as msprobe's figures in docs/peers.md were measured), medians over the
steps. Per model, side by side in one run:
  bare          no recorder at all
  untraced      Recorder recording only the loss (what any recorded run pays anyway)
  ops           --trace ops: every aten op, summaries + hash per tensor
  ops+full      --trace ops --trace-full '*': every op's tensors kept whole as well
  modules       --trace modules: every module's output and output gradient, summaries + hash
Step time includes handing the trace to the background writer; the writer's time is measured
too (`flush`), since on a busy machine it competes for the same cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(name: str):
    import torch

    torch.manual_seed(0)
    if name == "tutorial":  # samples/common/model.py, the global batch of 512
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
        x, y = torch.randn(512, 128), torch.randn(512, 128)
    else:  # 100 x Linear(316, 316) + Tanh: 10.0M parameters in 200 tensors (bench_record.py's model)
        layers = []
        for _ in range(100):
            layers += [torch.nn.Linear(316, 316), torch.nn.Tanh()]
        model = torch.nn.Sequential(*layers)
        x, y = torch.randn(64, 316), torch.randn(64, 316)
    return model, x, y


def measure(name: str, mode: str, steps: int, root: str) -> dict:
    import torch
    import torch.nn.functional as F

    from tracekit.recorders import RecordConfig, Recorder
    from tracekit.store import open_store
    from tracekit.store.traces import trace_nbytes, trace_steps

    model, x, y = build(name)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    store = os.path.join(root, f"{name}-{mode}")
    shutil.rmtree(store, ignore_errors=True)
    trace = {"bare": None, "untraced": None, "ops": "ops", "ops+full": "ops", "modules": "modules"}[mode]
    config = RecordConfig(store=None if mode == "bare" else store, kinds=("loss",), trace=trace, trace_steps=(2, None),
                          trace_full=("*",) if mode == "ops+full" else ())
    times = []
    with Recorder(model, opt, config=config) as rec:
        for step in range(1, steps + 2):  # step 1 warms up (and is never traced)
            t0 = time.perf_counter()
            out = model(x)
            loss = F.mse_loss(out, y)
            loss.backward()
            rec.observe(loss=loss)
            opt.step()
            opt.zero_grad()
            if step > 1:
                times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rec.flush()
        flush = time.perf_counter() - t0
    nbytes = [0]
    if trace:
        rank = open_store(store).rank(0)
        nbytes = [trace_nbytes(rank.group, trace, s) for s in trace_steps(rank.group, trace)]
    return {"step_s": statistics.median(times), "flush_s": flush, "bytes_per_step": statistics.median(nbytes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="tutorial,10m")
    ap.add_argument("--modes", default="bare,untraced,ops,ops+full,modules")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    root = args.dir or tempfile.mkdtemp(prefix="bench_trace_")
    print(f"torch {torch.__version__}, 1 thread, median of {args.steps} traced steps; stores under {root}")
    print(f"{'model':9} {'mode':9} {'step ms':>9} {'x untraced':>10} {'flush ms':>9} {'trace MB/step':>13}")
    for name in args.models.split(","):
        base = None
        for mode in args.modes.split(","):
            r = measure(name, mode, args.steps, root)
            base = r["step_s"] if mode == "untraced" else base
            ratio = f"{r['step_s'] / base:.2f}x" if base else "-"
            print(f"{name:9} {mode:9} {r['step_s'] * 1e3:9.1f} {ratio:>10} {r['flush_s'] * 1e3:9.1f} "
                  f"{r['bytes_per_step'] / 1e6:13.3f}", flush=True)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
