"""Cost of `--trace`: traced step time over untraced step time, and trace bytes per step.

Run: python bench/bench_trace.py [--steps 5] [--models tutorial,10m] [--dir DIR]

Single process, 1 thread, medians over the
steps. The ratios ("x untraced": wall time, "x cpu": the training thread's CPU time) divide the
median traced step by the median untraced step *of the same process*: each tracing run records
N untraced steps, then N traced ones, so a neighbour's load shifts both alike. Per model, side
by side in one run:
  bare          no recorder at all
  untraced      Recorder recording only the loss (what any recorded run pays anyway)
  ops           --trace ops: every aten op, summaries + hash per tensor
  ops+full      --trace ops --trace-full '*': every op's tensors kept whole as well
  modules       --trace modules: every module's output and output gradient, summaries + hash
Step time includes handing the trace to the background writer; the writer's time is measured
too (`flush`), since on a busy machine it competes for the same cores. `cpu ms` is the training
thread's CPU time (time.thread_time), less disturbed than wall time when others share the cores.

--baseline REV measures tracekit as of git revision REV beside the working tree's, in the same run:
each (model, mode) is measured once per version, one after the other, each in its own process
(REV's tracekit/ and recorders/ extracted to a temporary folder first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

if "--worker" not in sys.argv:  # a worker imports tracekit from PYTHONPATH (--baseline) or the install
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
    """One recorder run: step 1 warms up, then `steps` untraced steps, then `steps` traced ones
    (for the tracing modes): the ratio compares steps of one process, one after the other."""
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
    first_traced = steps + 2 if trace else None
    config = RecordConfig(store=None if mode == "bare" else store, kinds=("loss",), trace=trace,
                          trace_steps=(first_traced or 2, None), trace_full=("*",) if mode == "ops+full" else ())
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    last = steps + 1 + (steps if trace else 0)
    with Recorder(model, opt, config=config) as rec:
        for step in range(1, last + 1):
            t0, c0 = time.perf_counter(), time.thread_time()
            out = model(x)
            loss = F.mse_loss(out, y)
            loss.backward()
            rec.observe(loss=loss)
            opt.step()
            opt.zero_grad()
            if step > 1:
                traced = bool(trace) and step >= first_traced
                times[traced].append(time.perf_counter() - t0)
                cpu[traced].append(time.thread_time() - c0)
        t0 = time.perf_counter()
        rec.flush()
        flush = time.perf_counter() - t0
    nbytes = [0]
    if trace:
        rank = open_store(store).rank(0)
        nbytes = [trace_nbytes(rank.group, trace, s) for s in trace_steps(rank.group, trace)]
    import tracekit

    med = statistics.median
    traced = bool(trace)
    return {"step_s": med(times[traced]), "cpu_s": med(cpu[traced]),
            "ratio": med(times[True]) / med(times[False]) if traced else None,
            "cpu_ratio": med(cpu[True]) / med(cpu[False]) if traced else None,
            "flush_s": flush, "bytes_per_step": med(nbytes), "tracekit": tracekit.__file__}


def extract(rev: str, root: str) -> str:
    """REV's library as an importable folder: tracekit/ with recorders/ inside, as installed."""
    dest = os.path.join(root, f"src-{rev}")
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "tracekit", "recorders"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    os.rename(os.path.join(dest, "recorders"), os.path.join(dest, "tracekit", "recorders"))
    return dest


def measure_in(src: str | None, name: str, mode: str, steps: int, root: str) -> dict:
    """One measurement in a fresh process; src: a folder put first on PYTHONPATH (None: installed)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    sub = os.path.join(root, os.path.basename(src) if src else "current")
    os.makedirs(sub, exist_ok=True)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, mode, str(steps), sub],
                         env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    if src and not r["tracekit"].startswith(src):
        raise SystemExit(f"baseline worker imported {r['tracekit']}, not {src}")
    return r


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":  # one measurement, as JSON (measure_in)
        import torch

        torch.set_num_threads(1)
        name, mode, steps, root = sys.argv[2:6]
        print(json.dumps(measure(name, mode, int(steps), root)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--full-steps", type=int, default=None, help="traced steps for ops+full (default: --steps)")
    ap.add_argument("--models", default="tutorial,10m")
    ap.add_argument("--modes", default="bare,untraced,ops,ops+full,modules")
    ap.add_argument("--baseline", default=None, help="a git revision measured beside the working tree")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import torch

    root = args.dir or tempfile.mkdtemp(prefix="bench_trace_")
    versions = [("current", None)]
    if args.baseline:
        versions = [(args.baseline, extract(args.baseline, root)), ("current", None)]
    print(f"torch {torch.__version__}, 1 thread, median of {args.steps} traced steps "
          f"({args.full_steps or args.steps} for ops+full), each (model, mode, version) in its own process; "
          f"stores under {root}")
    print(f"{'model':9} {'mode':9} {'version':9} {'step ms':>9} {'x untraced':>10} {'cpu ms':>9} {'x cpu':>7} "
          f"{'flush ms':>9} {'trace MB/step':>13}")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            steps = args.full_steps or args.steps if mode == "ops+full" else args.steps
            for version, src in versions:
                r = measure_in(src, name, mode, steps, root)
                ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
                cratio = f"{r['cpu_ratio']:.2f}x" if r["cpu_ratio"] else "-"
                print(f"{name:9} {mode:9} {version:9} {r['step_s'] * 1e3:9.1f} {ratio:>10} {r['cpu_s'] * 1e3:9.1f} "
                      f"{cratio:>7} {r['flush_s'] * 1e3:9.1f} {r['bytes_per_step'] / 1e6:13.3f}", flush=True)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
