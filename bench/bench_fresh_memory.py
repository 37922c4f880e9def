"""Benchmark (not a test): what fresh memory costs this machine, first write against rewrite.

While the writer holds a rank's steps (--hold-mb), every step fills a spool slab in fresh tmpfs pages
(tracekit/writer/handoff.py). On bare metal a fresh page costs the kernel's zeroing, about as much
as writing it. On a VM whose host backs the guest's memory only when it is first touched, and takes
free memory back (virtio-balloon free page reporting), a page the guest kernel hands out after it
was reported free costs a fault in the host too: this machine, 2026-12-06, wrote such pages ~7x
slower than pages it had used a moment before (docs/RELIABILITY.md, "Memory the host backs at
first touch"). Pages freed a moment ago come back fast, and which pages a run gets, hot or
cold, changes from minute to minute, and with it the recorded command's cost. So a probe smaller
than the memory freed lately finds only hot pages: here cold blocks showed past 1.4-1.6 GB, in
the minutes after a bench.

The probe writes --mb MB in new files of --block-mb MB each (pwrite), times each write and a
rewrite of the same file, then removes them (--mb must fit in the folder's free space). Per MB:
the median and range of the first writes and of the rewrites, and how many blocks were "cold"
(a first write over 3x the median rewrite).

    python bench/bench_fresh_memory.py [--mb 3072] [--block-mb 32] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures import spread  # noqa: E402  (this folder's)

COLD = 3.0  # a first write this many times the median rewrite counts as a cold block


def default_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def probe(total_mb: int = 3072, block_mb: int = 32, folder: str | None = None) -> tuple[list[float], list[float]]:
    """(first writes, rewrites) in ms per MB, one per block of `block_mb` MB, `total_mb` in all."""
    block = np.ones(block_mb << 20, dtype=np.uint8)
    work = tempfile.mkdtemp(prefix="tracekit-bench-fresh-", dir=folder or default_folder())
    first, again, paths = [], [], []
    try:
        for i in range(max(1, total_mb // block_mb)):
            paths.append(os.path.join(work, f"block{i}"))
            fd = os.open(paths[-1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                for times in (first, again):
                    t = time.perf_counter()
                    os.pwrite(fd, block, 0)
                    times.append((time.perf_counter() - t) * 1e3 / block_mb)
            finally:
                os.close(fd)
    finally:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        os.rmdir(work)
    return first, again


def line(first: list[float], again: list[float]) -> str:
    """One line: first write and rewrite per MB, and the cold blocks."""
    cold = sum(t > COLD * statistics.median(again) for t in first)
    return (f"first write {spread(first, ' ms/MB', 2, 5)}, rewrite {spread(again, ' ms/MB', 2, 5)}; "
            f"cold blocks {cold} of {len(first)}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=_positive, default=3072)
    p.add_argument("--block-mb", type=_positive, default=32)
    p.add_argument("--dir", default=None, help="where the probe's files go (default: /dev/shm, else the temp folder)")
    args = p.parse_args()
    try:
        first, again = probe(args.mb, args.block_mb, args.dir)
    except OSError as e:  # no room for --mb, or --dir not writable: one line, the files already removed
        raise SystemExit(f"error: {e}") from None
    print(f"fresh memory, {len(first)} blocks of {args.block_mb} MB in {args.dir or default_folder()}:")
    print("  " + line(first, again))


if __name__ == "__main__":
    main()
