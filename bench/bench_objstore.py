"""Benchmark (not a test): stores on an S3-compatible object store against the same stores on local disk.

Starts moto's S3 server on 127.0.0.1 (a child process; it keeps objects in memory), then in one run:
  record  write a reference and a candidate store (RankWriter, the recorder's writer) to a local
          folder and to a bucket, the bucket once through each of zarr's object-store classes
          (ObjectStore over obstore, FsspecStore over s3fs; TRACEKIT_S3_CLIENT): MiB/s and the
          ratio bucket / disk;
  diff    tracekit.diff of the two local stores, then of the two bucket stores with each client;
  read    the diff's read pattern alone (ranged reads of every chunk, in pieces of the diff's size,
          8 in flight) through each client.
moto is a Python server on this same (shared) machine, so absolute object-store numbers say little
about S3; the ratios to disk measured side by side are what this prints.

    python bench/bench_objstore.py --size-mb 128
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_diff import build  # noqa: E402  (the same stores as bench_diff: float32, noise everywhere)


def _timed(fn, *args):
    c, t = time.process_time(), time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def _chunk_keys(location):
    """Every chunk object of a store, with its size, listed through zarr's store."""
    from zarr.core.sync import sync

    store = location.zarr_store(read_only=True)

    async def listing():
        return [k async for k in store.list() if "/c/" in k]

    keys = sync(listing())
    return [(k, sync(store.getsize(k))) for k in keys]


def _read_all(store, keys, piece: int) -> int:
    """The diff's pattern: each chunk read in ranges of `piece` bytes, one request each, 8 in flight."""
    import asyncio

    from zarr.abc.store import RangeByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    proto = default_buffer_prototype()
    ranges = [(k, lo, min(lo + piece, size)) for k, size in keys for lo in range(0, size, piece)]

    async def go():
        sem = asyncio.Semaphore(8)
        total = 0

        async def one(k, lo, hi):
            nonlocal total
            async with sem:
                buf = await store.get(k, proto, RangeByteRequest(lo, hi))
                total += len(buf)

        await asyncio.gather(*(one(*r) for r in ranges))
        return total

    return sync(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=128, help="size of each of the two stores (default 128)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()

    import tracekit
    from tracekit.compare.engine import PIECE_ELEMENTS
    from tracekit.store.location import resolve
    from tracekit.testing_s3 import MotoServer

    size = int(a.size_mb * 2**20)
    folder = tempfile.mkdtemp(prefix="tracekit-bench-objstore-")
    out = {"size_mib_each": a.size_mb, "ranks": a.ranks, "steps": a.steps, "jobs": a.jobs}
    with MotoServer() as s3:
        os.environ.update(s3.env("bench-secret"))
        s3.make_bucket("bench")
        places = {"disk": (os.path.join(folder, "ref"), os.path.join(folder, "cand"), None),
                  "bucket_obstore": ("s3://bench/ob/ref", "s3://bench/ob/cand", "obstore"),
                  "bucket_fsspec": ("s3://bench/fs/ref", "s3://bench/fs/cand", "fsspec")}
        for where, (ref, cand, client) in places.items():
            os.environ["TRACEKIT_S3_CLIENT"] = client or "auto"
            n, sec, cpu = _timed(lambda: build(ref, size, a.ranks, a.steps, a.tensors, 0.0, 0)
                                 + build(cand, size, a.ranks, a.steps, a.tensors, 1e-7, 1))
            out[f"record_{where}_mib_s"] = round(n / sec / 2**20, 1)
            out[f"record_{where}_mib_per_cpu_s"] = round(n / cpu / 2**20, 1)
            print(f"record {where:6}: {n / 2**20:.0f} MiB in {sec:.1f} s = {n / sec / 2**20:.1f} MiB/s "
                  f"({n / cpu / 2**20:.1f} per CPU-s of this process)", flush=True)
        for where, (ref, cand, client) in places.items():
            os.environ["TRACEKIT_S3_CLIENT"] = client or "auto"
            r, sec, cpu = _timed(lambda: tracekit.diff(ref, cand, jobs=a.jobs))
            out[f"diff_{where}_mib_s"] = round(r.bytes_compared / sec / 2**20, 1)
            print(f"diff   {where:6}: {r.bytes_compared / 2**20:.0f} MiB in {sec:.1f} s = "
                  f"{r.bytes_compared / sec / 2**20:.1f} MiB/s   [{r.summary_line}]", flush=True)
        for what in ("record", "diff"):
            for client in ("obstore", "fsspec"):
                out[f"{what}_ratio_bucket_{client}_to_disk"] = round(
                    out[f"{what}_bucket_{client}_mib_s"] / out[f"{what}_disk_mib_s"], 3)

        # zarr's two object-store classes on the diff's read pattern (pieces of PIECE_ELEMENTS float32)
        os.environ["TRACEKIT_S3_CLIENT"] = "fsspec"
        loc = resolve("s3://bench/fs/ref")
        keys = _chunk_keys(loc)
        piece = PIECE_ELEMENTS * 4
        try:
            import obstore.store
            from zarr.storage import ObjectStore

            ob = ObjectStore(obstore.store.S3Store("bench", prefix="fs/ref", endpoint=s3.endpoint, region="us-east-1",
                                                   access_key_id="k", secret_access_key="bench-secret",
                                                   client_options={"allow_http": True}), read_only=True)
        except ImportError:
            ob = None
        stores = {"fsspec": loc.zarr_store(read_only=True)}
        if ob is not None:
            stores["obstore"] = ob
        for _ in range(2):  # best of two, alternating, on a shared machine
            for name, store in stores.items():
                n, sec, _cpu = _timed(_read_all, store, keys, piece)
                key = f"read_{name}_mib_s"
                out[key] = max(out.get(key, 0), round(n / sec / 2**20, 1))
                print(f"read   {name:7}: {n / 2**20:.0f} MiB in {sec:.1f} s = {n / sec / 2**20:.1f} MiB/s", flush=True)
        if ob is not None:
            out["read_ratio_obstore_to_fsspec"] = round(out["read_obstore_mib_s"] / out["read_fsspec_mib_s"], 3)
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
