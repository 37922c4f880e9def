"""Benchmark of the command line's start-up (not a test): commands that don't train must feel instant.

Builds, in a temporary folder, the two small stores of samples/inspect_divergence.py (4 ranks,
5 steps, a planted fault) and a 16-rank store, then runs each command --repeat times, each time in
a fresh process, and prints wall time (median and best), CPU time (median) and peak RSS next to the targets:
  tracekit diff --help            <= 0.5 s
  tracekit diff REF CAND          <= 1.5 s wall, <= 120 MB peak RSS
  tracekit show STORE16           <= 1 s
Side by side, in the same run: the bare interpreter's start-up (`python -c pass`) and
`python -c "import torch"` (what every command paid when the CLI imported all subcommands).

    python bench/bench_cli.py [--repeat 5] [--no-torch]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs argv[1:] once; prints its wall seconds, the peak RSS (KiB) and CPU seconds (user + system)
# of that child alone. CPU time is the number to read on a shared machine: waiting for a core is not in it.
MEASURE = r"""
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(wall, u.ru_maxrss, u.ru_utime + u.ru_stime, rc)
"""


def tracekit_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "tracekit")  # the console script users type
    return [script] if os.path.exists(script) else [sys.executable, "-m", "tracekit.cli.main"]


def build_small_pair(folder: str) -> tuple[str, str]:
    spec = importlib.util.spec_from_file_location("inspect_divergence", os.path.join(ROOT, "samples", "inspect_divergence.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_runs(folder)


def build_wide(path: str, ranks: int = 16, steps: int = 5) -> str:
    from tracekit.store import RankWriter, TensorData, create_store, finalize_store

    create_store(path, {"command": ["train.py"], "mode": "fsdp"}, force=True)
    rng = np.random.default_rng(0)
    names = [f"layers.{i}.{p}" for i in range(4) for p in ("weight", "bias")]
    for r in range(ranks):
        w = RankWriter(path, r, {"coords": {"rank": r, "world_size": ranks, "dp_degree": ranks, "dp_rank": r},
                                 "run": {"device": "cpu", "backend": "gloo"}})
        for s in range(1, steps + 1):
            w.write(s, "loss", [TensorData("loss", "float32", (), np.float32(1.0 / s))])
            for kind in ("gradients", "parameters", "deltas"):
                w.write(s, kind, [TensorData(n, "float32", (64, 64), rng.standard_normal((64, 64), dtype=np.float32))
                                  for n in names])
            w.complete_step(s)
        w.close()
    finalize_store(path, 0)
    return path


def measure(argv: list[str], repeat: int) -> tuple[list[float], list[float], int, int]:
    walls, cpus, rss, rc = [], [], 0, 0
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, check=True)
        wall, peak, cpu, rc = out.stdout.split()
        walls.append(float(wall))
        cpus.append(float(cpu))
        rss = max(rss, int(peak))
    return walls, cpus, rss, int(rc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="skip the `import torch` reference")
    args = ap.parse_args(argv)
    tk = tracekit_command()
    with tempfile.TemporaryDirectory() as tmp:
        ref, cand = build_small_pair(tmp)
        wide = build_wide(os.path.join(tmp, "wide16"))
        cases = [
            ("python -c pass (interpreter start-up)", [sys.executable, "-c", "pass"], None, None),
            ("tracekit diff --help", [*tk, "diff", "--help"], 0.5, None),
            ("tracekit --help", [*tk, "--help"], None, None),
            ("tracekit diff REF CAND (4 ranks, 5 steps)", [*tk, "diff", ref, cand], 1.5, 120),
            ("tracekit show STORE (16 ranks)", [*tk, "show", wide], 1.0, None),
            ("tracekit show --json STORE (16 ranks)", [*tk, "show", "--json", wide], 1.0, None),
        ]
        if not args.no_torch:
            cases.append(("python -c 'import torch' (reference)", [sys.executable, "-c", "import torch"], None, None))
        print(f"{'command':44} {'wall s':>7} {'best s':>7} {'cpu s':>6} {'peak MB':>8}  target (on the median wall)")
        over = 0
        for label, cmd, wall_target, rss_target in cases:
            walls, cpus, rss_kib, rc = measure(cmd, 1 if "import torch" in label else args.repeat)
            med, best, cpu, mb = statistics.median(walls), min(walls), statistics.median(cpus), rss_kib / 1024
            verdict = []
            if wall_target is not None:
                verdict.append(f"<= {wall_target} s: {'ok' if med <= wall_target else 'OVER'} ({med / wall_target:.2f}x)")
                over += med > wall_target
            if rss_target is not None:
                verdict.append(f"<= {rss_target} MB: {'ok' if mb <= rss_target else 'OVER'} ({mb / rss_target:.2f}x)")
                over += mb > rss_target
            print(f"{label:44} {med:7.3f} {best:7.3f} {cpu:6.3f} {mb:8.1f}  {'; '.join(verdict)}" + (f"  [exit {rc}]" if rc else ""))
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
