"""Benchmark of zero-code recording's fixed costs (not a test); prints times and ratios.

  startup      `python -c pass` with the bootstrap on PYTHONPATH vs without (every process pays it)
  import torch `import torch` with the bootstrap armed (it then loads tracekit.recorders.zerocode)
               vs without (only processes that import torch pay it; the torchrun agent is skipped)
  module call  time per call of a trivial module, eager: plain torch; the nn.Module.__call__
               wrapper before the first step (finding the model) and after it (following the
               model); and, for comparison, a global forward hook (what the wrapper avoids)

    python bench/bench_zerocode.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def process_time(code: str, env: dict, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)
        best = min(best, time.perf_counter() - start)
    return best


def startup_costs(repeats: int) -> None:
    from tracekit.launch.bootstrap_env import bootstrap_env

    plain = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    armed = {**plain, **bootstrap_env(plain), "TRACEKIT_STORE": "/nonexistent", "RANK": "0"}
    for label, code in (("startup", "pass"), ("import torch", "import torch")):
        base, boot = process_time(code, plain, repeats), process_time(code, armed, repeats)
        print(f"{label:13s} without {base * 1e3:8.1f} ms   with bootstrap {boot * 1e3:8.1f} ms   "
              f"ratio {boot / base:5.2f}   (+{(boot - base) * 1e3:.1f} ms)")


def per_call(module, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        module(x)
    return (time.perf_counter() - start) / calls


def module_call_costs(repeats: int, calls: int = 20000) -> None:
    import torch

    from tracekit.recorders.outermost import OutermostCalls

    class Tiny(torch.nn.Module):  # no compute: what is left is the call path itself
        def forward(self, x):
            return x

    module, x = Tiny(), torch.zeros(1)
    best: dict[str, float] = {}

    def measure(label):
        best[label] = min(best.get(label, float("inf")), per_call(module, x, calls))

    for _ in range(repeats):  # interleaved, best of each: the machine's noise hits all alike
        measure("plain torch")
        tracker = OutermostCalls()
        tracker.discover()
        measure("wrapper, finding the model")
        tracker.settle([])
        other = torch.nn.Linear(1, 1)
        tracker.roots = {id(other): ""}  # following another module: the common case
        measure("wrapper, following the model")
        tracker.unwrap()
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
        measure("global forward hook")
        handle.remove()
    base = best["plain torch"]
    for label, t in best.items():
        print(f"module call   {label:30s} {t * 1e6:6.2f} us   ratio {t / base:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    startup_costs(args.repeats)
    module_call_costs(args.repeats)


if __name__ == "__main__":
    main()
