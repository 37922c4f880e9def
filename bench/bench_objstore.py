"""Benchmark (not a test): stores on an S3-compatible object store against the same stores on local disk.

Starts moto's S3 server on 127.0.0.1 (a child process; it keeps objects in memory), then in one run:
  record  write a reference and a candidate store (RankWriter, the recorder's writer) to a local
          folder and to a bucket, the bucket once through each of zarr's object-store classes
          (ObjectStore over obstore, FsspecStore over s3fs; TRACEKIT_S3_CLIENT): MiB/s and the
          ratio bucket / disk;
  diff    tracekit.diff of the two local stores, then of the two bucket stores with each client;
  read    the diff's read pattern alone (ranged reads of every chunk, in pieces of the diff's size,
          8 in flight) through each client;
  formats format 2 (content-addressed objects, PUT through the store's API) against format 1
          (packed arrays), on the bucket and on disk, side by side: write MiB/s through RankWriter
          and read MiB/s of every tensor back through the reader (format 2 checks every object's
          hash), each the best of two alternating runs; the ratios format 2 / format 1 and
          bucket / disk. `--formats-only` runs this part alone.
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
    """Every chunk object of a store and (format 2) every tensor object, with its size, listed
    through zarr's store."""
    from zarr.core.sync import sync

    store = location.zarr_store(read_only=True)

    async def listing():
        return [k async for k in store.list() if "/c/" in k or k.rsplit("/", 1)[-1].startswith("c.") or (k.startswith("objects/") and not k.endswith("zarr.json"))]

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


def _format_tensors(size: int, ranks: int, steps: int, tensors: int):
    """{(rank, step, kind): [TensorData]} of ~size bytes, every tensor distinct bytes (no dedup in
    format 2, so both formats store the same bytes), made before any timing starts."""
    import numpy as np

    from bench_diff import KINDS
    from tracekit.store import TensorData

    numel = max(tensors, size // (ranks * steps * len(KINDS)) // 4 // tensors)
    count = ranks * steps * len(KINDS) * tensors
    pool = np.random.default_rng(0).standard_normal(numel + count, dtype=np.float32)
    out, i = {}, 0
    for r in range(ranks):
        for s in range(1, steps + 1):
            for kind in KINDS:
                out[r, s, kind] = [TensorData(f"layer{t}.weight", "float32", (numel,), pool[i + t: i + t + numel])
                                   for t in range(tensors)]
                i += tensors
    return out


def _write_format(url: str, version: int, data) -> int:
    """Write `data` (from _format_tensors) as the recorder's writer does: rank by rank, step by step."""
    from tracekit.store import RankWriter, create_store

    create_store(url, {"mode": "ddp"}, force=True, format_version=version)
    written = 0
    ranks = sorted({r for r, _, _ in data})
    for r in ranks:
        w = RankWriter(url, r, {"coords": {"rank": r, "world_size": len(ranks), "dp_degree": len(ranks), "dp_rank": r}})
        for step in sorted({s for rank, s, _ in data if rank == r}):
            for (rank, s, kind), row in data.items():
                if (rank, s) == (r, step):
                    w.write(step, kind, row)
                    written += sum(t.data.nbytes for t in row)
            w.complete_step(step)
        w.close()
    return written


def _read_format(url: str) -> int:
    """Every tensor of every rank, kind and step read back through the reader (bytes as stored)."""
    from tracekit.store import open_store

    store = open_store(url)
    n = 0
    for r in store.ranks:
        view = store.rank(r)
        for kind in view.kinds:
            for step in view.steps(kind):
                for t in view.tensors(kind):
                    n += view.read_bits(kind, step, t.name).nbytes
    return n


def _formats(out: dict, size: int, a, folder: str) -> None:
    data = _format_tensors(size, a.ranks, a.steps, a.tensors)
    places = {"bucket": "s3://bench/format{v}", "disk": os.path.join(folder, "format{v}")}
    for _ in range(2):  # best of two, alternating, on a shared machine
        for where, pattern in places.items():
            for version in (1, 2):
                url = pattern.format(v=version)
                for what, fn in (("write", lambda: _write_format(url, version, data)), ("read", lambda: _read_format(url))):
                    n, sec, cpu = _timed(fn)
                    key = f"{where}_format{version}_{what}_mib_s"
                    out[key] = max(out.get(key, 0), round(n / sec / 2**20, 1))
                    print(f"{what:5} {where:6} format {version}: {n / 2**20:.0f} MiB in {sec:.1f} s = "
                          f"{n / sec / 2**20:.1f} MiB/s ({n / cpu / 2**20:.1f} per CPU-s of this process)", flush=True)
    for what in ("write", "read"):
        for where in places:
            out[f"{where}_{what}_ratio_format2_to_format1"] = round(
                out[f"{where}_format2_{what}_mib_s"] / out[f"{where}_format1_{what}_mib_s"], 3)
        for version in (1, 2):
            out[f"format{version}_{what}_ratio_bucket_to_disk"] = round(
                out[f"bucket_format{version}_{what}_mib_s"] / out[f"disk_format{version}_{what}_mib_s"], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=128, help="size of each of the two stores (default 128)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--formats-only", action="store_true", help="only format 2 against format 1 on the bucket")
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
        out["s3_client"] = os.environ.get("TRACEKIT_S3_CLIENT", "auto")
        if a.formats_only:
            _formats(out, size, a, folder)
            shutil.rmtree(folder, ignore_errors=True)
            print(json.dumps(out))
            return
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
        os.environ["TRACEKIT_S3_CLIENT"] = "auto"
        _formats(out, size, a, folder)
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
