"""Benchmark (not a test): TorchTitan's llama3 debug model trained with and without `tracekit record`,
side by side in one run, on CPU/gloo through samples/torchtitan/train.py; prints times and ratios.

  whole command   wall time of `torchrun ...` against `tracekit record -o S -- torchrun ...`
                  (start-up, training, the recorder's flush and finalize)
  steps           TorchTitan's own log, rank 0: "Training starts" to the last step's line
  steps after 1   the first step's line to the last step's line (step 1 also compiles the
                  attention mask builder, which recording does not change)
  step (tps)      TorchTitan's own step timing: each step line's tokens per second per device
                  (`tps`, timed by TorchTitan around the step), as seconds per step
                  (tokens per step / tps), median over the steps after 1
  CPU             CPU seconds (user + system) of the command and every process it started, the
                  writer processes that outlive their ranks included (Linux: the bench adopts
                  orphaned descendants, PR_SET_CHILD_SUBREAPER, and waits for them); on a machine
                  whose cores the job keeps busy, the whole command's extra wall time is about
                  the extra CPU over the number of cores

Runs are interleaved, plain then recorded, --repeats times (ABAB...), after one warm-up run, so
that the machine's drift hits both. Each recorded run writes a new store, and the stores are removed
only after the last run (~0.7 GB each at 10 steps, ~2.9 GB at 40): on this VM's ext4, which has no
journal, a file created within a minute of many deletions costs up to ~40x more (the kernel skips
each recently freed inode): a 40-step run's writers used 2.4-2.6 CPU-s writing into a new folder,
and 4.7-6.0 writing over the previous run's store, which `--force` removes first (docs/RELIABILITY.md,
"The disk under the store"). The machine's state moves these figures more than most changes
do (docs/RELIABILITY.md, "What the recording's cost is made of on a cold machine"), so the bench
also prints what creating a file costs in its folder before and after the runs (the store's writers
create ~32 files a rank-step, temporary names included; here that cost moved from 0.02 to 0.9 ms with the disk's state and the
folder's place), and with --probe-memory MB how much of that much fresh memory was cold before the
runs (bench_fresh_memory.py; a host that backs a VM's memory at first touch makes held steps cost
more). It names the folder's file system: an ext4 without a journal (this VM's disk) makes file
creation slow for a minute after many deletions. Last, it says whether the writers could hold every
step until training ended (--hold-mb; then the steps' figures are the best case, and a longer run,
--steps 40, shows the steady state). Per figure: the median of each side and its range (min-max),
the ratio of the medians, and the median and range of the pairwise ratios (each recorded run
against the plain run just before it, seconds apart). On a machine others load meanwhile, the
pairwise ratios' range says how far to trust the medians.

    python bench/bench_torchtitan.py [--ranks 2] [--steps 10] [--repeats 2] [--dir DIR] [--probe-memory MB]
                                     [-- TORCHTITAN FLAGS]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workdir import own_folder, remove_own  # noqa: E402  (this folder's)
from figures import spread  # noqa: E402  (this folder's)
from bench_record import create_cost, folder_filesystem  # noqa: E402  (this folder's: a folder's file system, what creating a file costs there)

RUNNER = os.path.join(ROOT, "samples", "torchtitan", "train.py")
STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
SEQ_LEN, LOCAL_BATCH = 64, 2  # the bench's shapes: tokens per step per device = their product
FIGURES = ("whole command", "steps", "steps after 1", "step (tps)", "CPU")
PR_SET_CHILD_SUBREAPER = 36


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_times(log: str, tokens: int) -> tuple[float, float, float]:
    """(steps, steps after 1, median seconds per step after 1 from `tps`) from TorchTitan's log."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    start = re.search(STAMP + r" .*Training starts at step", plain)
    steps = re.findall(STAMP + r" .*step:\s+(\d+)\s+loss:.*?tps:\s+([\d,]+)", plain)
    if not start or len(steps) < 2:
        raise SystemExit(f"error: no TorchTitan step lines in the output:\n{log[-3000:]}")
    first, last = stamp(steps[0][0]), stamp(steps[-1][0])
    rank0 = {}  # every rank logs each step; the first line of each step counts
    for _, step, tps in steps:
        rank0.setdefault(int(step), int(tps.replace(",", "")))
    per_step = [tokens / tps for step, tps in rank0.items() if step > 1 and tps > 0]
    return last - stamp(start.group(1)), last - first, statistics.median(per_step)


UNITS = {"B": 2 ** -20, "KiB": 2 ** -10, "MiB": 1, "GiB": 2 ** 10, "TiB": 2 ** 20}


def store_size_mib(log: str) -> float | None:
    """The store's size in MiB that `tracekit record`'s last line gives ("730.5 MiB in ...", "2.9 GiB in ...")."""
    found = re.findall(r"([\d.]+) (B|KiB|MiB|GiB|TiB) in ", log)
    return float(found[-1][0]) * UNITS[found[-1][1]] if found else None


def held_line(stored_mib: float, ranks: int, steps: int) -> str:
    """Whether the writers could hold every step until training ended (the default --hold-mb, half
    the queue cap): then they store nothing during the steps, and the steps' figures are the
    recording's best case; a longer run (--steps 40 here) shows the steady state past the hold."""
    from tracekit.launch.config import DEFAULT_QUEUE_MB  # no torch, no zarr

    hold = DEFAULT_QUEUE_MB // 2
    per_rank = stored_mib / ranks
    said = ("every step held until training ended (the steps' best case)" if per_rank <= hold else
            f"past the hold after about {int(hold / (per_rank / steps))} steps: the writers stored during the later steps")
    return f"store: {stored_mib:.1f} MiB, {per_rank:.0f} MiB a rank against a hold of {hold} MiB a rank: {said}"


def adopt_orphans() -> bool:
    """Become the reaper of our descendants' orphans (Linux), so that a writer process that outlives
    its rank is waited for here and its CPU time counted; False where that is not possible."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the descendants waited for so far
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], cwd: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of it and its descendants, output) of one run of `cmd`."""
    cpu = children_cpu()
    began = time.perf_counter()
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - began
    while True:  # the orphans adopted meanwhile (writer processes), once they end
        try:
            os.wait()
        except ChildProcessError:
            break
    if result.returncode != 0:
        raise SystemExit(f"error: exit {result.returncode}: {' '.join(cmd)}\n{result.stderr[-3000:]}")
    return wall, children_cpu() - cpu, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the bench makes its folder (default: the temp folder)")
    parser.add_argument("--probe-memory", type=int, default=0, metavar="MB",
                        help="before the runs, write this many MB of fresh memory and say how much was cold (0: no probe)")
    parser.add_argument("flags", nargs="*", help="more TorchTitan flags, after --")
    args = parser.parse_args()
    work = own_folder(args.dir, "tracekit-bench-torchtitan")
    train = ["torchrun", "--standalone", f"--nproc-per-node={args.ranks}", RUNNER, "--module", "llama3",
             "--config", "llama3_debugmodel", "--training.seq-len", str(SEQ_LEN), "--training.local-batch-size",
             str(LOCAL_BATCH), "--training.steps", str(args.steps), "--debug.seed", "0",
             "--assets", os.path.join(work, "assets"), *args.flags]

    def record(i: int) -> list[str]:
        # Each recorded run writes a store of its own, all removed with the bench's folder after the
        # last run: on an ext4 without a journal, writing over a store removed seconds before took
        # a 40-step run's writers about twice the CPU (see the doc above).
        return ["tracekit", "record", "-o", os.path.join(work, f"store-{i}"), "--"]

    runs: dict[str, list[list[float]]] = {"plain": [], "recorded": []}  # per run: one value per FIGURES
    stored_mib = None  # the store's size, from the last recorded run's record line
    counted = adopt_orphans()
    memory = None
    if args.probe_memory > 0:
        import bench_fresh_memory  # noqa: E402  (this folder's)

        memory = bench_fresh_memory.line(*bench_fresh_memory.probe(args.probe_memory))
    try:
        filesystem = folder_filesystem(work)
        create_before = create_cost(work)
        run(train, work)  # warm-up: assets, inductor cache for the mask builder, page cache
        for i in range(args.repeats):
            for label, prefix in (("plain", []), ("recorded", record(i))):
                wall, cpu, log = run(prefix + train, work)
                runs[label].append([wall, *log_times(log, SEQ_LEN * LOCAL_BATCH), cpu])
                if label == "recorded":
                    stored_mib = store_size_mib(log)
        create_after = create_cost(work)
    finally:
        remove_own(work)
    print(f"TorchTitan llama3 debug model, {args.ranks} ranks, {args.steps} steps, {args.repeats} interleaved "
          f"pairs: median (min-max)")
    print(f"{'':14s} {'plain':>24s} {'recorded':>24s} {'ratio':>6s}  {'pairwise ratios':>18s}")
    for i, name in enumerate(FIGURES):
        if name == "CPU" and not counted:
            print("CPU            not counted: this system cannot adopt orphaned processes (a rank's writer outlives it)")
            continue
        plain, recorded = [r[i] for r in runs["plain"]], [r[i] for r in runs["recorded"]]
        pairs = [b / a for a, b in zip(plain, recorded)]
        scale, unit = (1e3, "ms") if name == "step (tps)" else (1, "s")
        cell = lambda xs: spread(xs, unit, 2, 7, scale)  # noqa: E731
        print(f"{name:14s} {cell(plain):>24s} {cell(recorded):>24s} "
              f"{statistics.median(recorded) / statistics.median(plain):6.2f}  "
              f"{statistics.median(pairs):5.2f} ({min(pairs):.2f}-{max(pairs):.2f})")
    print(f"machine: creating a file in the bench's folder {create_before * 1e6:.0f} us before the runs, "
          f"{create_after * 1e6:.0f} us after; its file system: {filesystem}")
    if memory is not None:
        print(f"machine: fresh memory before the runs ({args.probe_memory} MB): {memory}")
    if stored_mib is not None:
        print(held_line(stored_mib, args.ranks, args.steps))


if __name__ == "__main__":
    main()
