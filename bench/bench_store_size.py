"""Store bytes vs unique tensor bytes of the tutorial sample, per parallel mode and rank count.

Records `samples/tutorial/train.py` with `tracekit record` for each (mode, ranks) asked, then
prints, per store: the bytes on disk (all files; and as allocated, a block per small file), the tensor bytes the store presents (every
rank, kind, step and tensor, as `tracekit.open` shows them), the unique tensor bytes among those
(equal contents counted once), and the ratio store / unique (target <= 1.05). With --account,
each store's bytes by role follow its line (tracekit/store/footprint.py: tensor objects, each
index array's rows, the zarr.json documents of the root, ranks, kinds and arrays, the
consolidated copy finalization adds to the root, ...), per rank and per rank and recorded row.

    python bench/bench_store_size.py --modes ddp,fsdp,tp --ranks 2,4 [--steps 10] [--account] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def disk_bytes(path: str) -> tuple[int, int]:
    """(file bytes, allocated bytes): small files take a whole filesystem block each."""
    stats = [os.stat(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def tensor_bytes(path: str) -> tuple[int, int, int]:
    """(presented, unique) tensor bytes, read through the store API (both formats), and the rows
    (kind, step) a rank records on average."""
    from tracekit.store import open_store

    store = open_store(path)
    presented, seen, rows = 0, set(), 0
    for r in store.ranks:
        view = store.rank(r)
        for kind in view.kinds:
            for step in view.steps(kind):
                rows += 1
                for info in view.tensors(kind):
                    bits = view.read_bits(kind, step, info.name)
                    presented += bits.nbytes
                    seen.add((bits.nbytes, hashlib.blake2b(bits.tobytes(), digest_size=16).digest()))
    return presented, sum(n for n, _ in seen), rows / max(len(store.ranks), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="ddp,fsdp,tp")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dir", default=None, help="keep the stores here (default: a temporary folder, removed)")
    ap.add_argument("--account", action="store_true", help="print each store's bytes by role")
    a = ap.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="tracekit-size-")
    print(f"{'mode':6s} {'ranks':>5s} {'store':>12s} {'allocated':>12s} {'presented':>12s} {'unique':>12s} "
          f"{'store/unique':>12s} {'alloc/unique':>12s} {'wall s':>7s}")
    for mode in a.modes.split(","):
        for n in (int(x) for x in a.ranks.split(",")):
            path = os.path.join(base, f"{mode}-{n}")
            cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "--force", "-o", path, "--",
                   sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                   os.path.join(ROOT, "samples", "tutorial", "train.py"), "--parallelism", mode,
                   "--steps", str(a.steps)]
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            wall = time.perf_counter() - t
            size, alloc = disk_bytes(path)
            presented, unique, rows = tensor_bytes(path)
            print(f"{mode:6s} {n:5d} {size:12d} {alloc:12d} {presented:12d} {unique:12d} {size / unique:12.3f} "
                  f"{alloc / unique:12.3f} {wall:7.1f}", flush=True)
            if a.account:
                from tracekit.store.footprint import describe, footprint

                print("\n".join(describe(footprint(path), unique=unique, rows=rows)), flush=True)
            if a.dir is None:
                shutil.rmtree(path, ignore_errors=True)
    if a.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
