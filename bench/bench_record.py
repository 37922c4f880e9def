"""Recording overhead on a ~10M-parameter, ~200-tensor model trained with FSDP2 on 2 CPU ranks.

Run: python bench/bench_record.py [--steps 20] [--ranks 2] [--every K] [--dir DIR]

Prints, side by side from one run: the step time without recording, with recording as tracekit
does it (each rank writes its pieces of the sharded tensors, no collective) and with the former
path (every rank gathers whole tensors), their ratios, the bytes each store received per second,
and the raw disk write speed for the same bytes (numpy tofile + fsync) on the same disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

LAYERS, WIDTH = 100, 316  # 100 x (316*316 + 316) = 10.0M parameters in 200 tensors


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tracekit.recorders import RecordConfig, Recorder

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        lin = torch.nn.Linear(WIDTH, WIDTH)
        torch.nn.init.normal_(lin.weight, std=WIDTH ** -0.5)
        layers += [lin, torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, WIDTH)

    def train(steps, rec=None):
        for _ in range(steps):
            out = model(x)
            loss = out.square().mean()
            loss.backward()
            if rec is not None:
                rec.observe(output=out, loss=loss.detach())
            opt.step()
            opt.zero_grad()

    train(2)  # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    train(args.steps)
    dist.barrier()
    plain = (time.perf_counter() - t0) / args.steps

    # Recorded twice, side by side: as tracekit records now (each rank writes its pieces of the
    # sharded tensors, no collective) and as it did before (every rank gathers whole tensors).
    results = {}
    for variant in ("pieces", "gather"):
        store = os.path.join(args.dir, f"store-{variant}")
        t0 = time.perf_counter()
        phases = _time_recorder_phases()
        with Recorder(model, opt, config=RecordConfig(store=store, every=args.every)) as rec:
            if variant == "gather":
                rec._pieces = False  # the former path, for comparison only
            train(args.steps, rec)
        dist.barrier()  # every rank has flushed its writer
        results[variant] = ((time.perf_counter() - t0) / args.steps, dict(phases), store)
        _untime_recorder_phases()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        ntensors = len(list(model.parameters()))
        print(f"model: {ntensors} parameter tensors, {params / 1e6:.1f}M parameters, FSDP2 on {world} ranks, {args.steps} steps, recording every {args.every} step(s)")
        print(f"step time without recording: {plain * 1e3:8.1f} ms")
        for variant, (recorded, phases, store) in results.items():
            written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs)
            raw = raw_write_speed(args.dir, written)
            rate = written / (recorded * args.steps)
            how = "each rank its pieces, no collective" if variant == "pieces" else "every rank gathers whole tensors (before)"
            print(f"-- recorded, {how}:")
            print(f"step time with recording:    {recorded * 1e3:8.1f} ms  (flush at the end included)")
            print("  of which on the training thread: " + ", ".join(f"{k} {v / args.steps * 1e3:.1f} ms" for k, v in phases.items()))
            print(f"overhead ratio:               {recorded / plain:8.2f}x  (target <= 1.2x)")
            print(f"store bytes written:          {written / 1e9:8.3f} GB")
            print(f"store write rate:             {rate / 1e6:8.1f} MB/s")
            print(f"raw disk write (numpy+fsync): {raw / 1e6:8.1f} MB/s")
        pieces, gather = results["pieces"][0], results["gather"][0]
        print(f"pieces / gather step time:    {pieces / gather:8.2f}x")
    dist.destroy_process_group()


_ORIGINAL: dict = {}


def _untime_recorder_phases() -> None:
    from tracekit.recorders.recorder import Recorder

    for meth, orig in _ORIGINAL.items():
        setattr(Recorder, meth, orig)


def _time_recorder_phases() -> dict:
    """Wrap the recorder's training-thread entry points to report where the overhead goes."""
    import collections

    from tracekit.recorders.recorder import Recorder

    totals = collections.Counter()
    for meth in ("observe", "begin_step", "end_step"):
        orig = _ORIGINAL.setdefault(meth, getattr(Recorder, meth))

        def timed(self, *a, _orig=orig, _name=meth, **k):
            t0 = time.perf_counter()
            try:
                return _orig(self, *a, **k)
            finally:
                totals[_name] += time.perf_counter() - t0

        setattr(Recorder, meth, timed)
    return totals


def raw_write_speed(folder: str, nbytes: int) -> float:
    import numpy as np

    block = np.random.default_rng(0).standard_normal(16 * 1024 * 1024 // 8)  # 16 MiB
    path = os.path.join(folder, "raw.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            part = block[: max(1, min(block.size, left // 8))]
            part.tofile(f)
            left -= part.nbytes
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    os.remove(path)
    return nbytes / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--every", type=int, default=1, help="record every k-th step (k > 1: a disk that keeps up)")
    p.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp dir)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    folder = tempfile.mkdtemp(prefix="tracekit-bench-", dir=args.dir)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               __file__, "--worker", "--steps", str(args.steps), "--batch", str(args.batch), "--every", str(args.every), "--dir", folder]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        sys.exit(subprocess.call(cmd, env=env))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
