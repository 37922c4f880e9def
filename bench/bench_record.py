"""Recording overhead on a model of ~200 tensors trained with FSDP2 on 2 CPU ranks, every step recorded.

Run: python bench/bench_record.py [--params 10|100] [--steps N] [--ranks 2] [--every K] [--dir DIR]
                                  [--variants pieces,beside,objects,summaries,gather] [--queue-mb MB] [--keep]
                                  [--pairs P] [--block K]

--params 10: 100 x Linear(316) = 10.0M parameters (issue target <= 1.2x); --params 100: 100 x
Linear(1000) = 100.1M (targets: <= 1.5x with bytes, <= 1.1x summaries only).

Prints, side by side from one run, per variant: the step time and its ratio to the unrecorded
steps of the same processes (the mean of those run just before and just after it: this VM's speed
drifts within a run, and a baseline measured once moved every ratio with it), over all the
recorded steps and again in steady state, without the first two recorded steps (they pay the
one-off costs: starting the writer process, allocating the first slab's tmpfs pages, faulting
in its first mapping; a run of thousands of steps pays them once), and interleaved: with the
writer warm, --pairs blocks of --block recorded steps (each with its flush) between blocks of as
many unrecorded ones, each held against its two neighbours, seconds apart (the median and the
range of the --pairs ratios: over a minute the VM's speed moved the baselines by up to 18% in
one run of 2026-12-04, while blocks seconds apart see much the same machine); the recorder's time on the
training thread (phases); the CPU seconds per step of the rank and of its writer process, and
how much of each ran in the kernel (the rank's page faults too; the writer is a child of the
rank, counted once it has exited at close); extra peak RSS of the rank over its unrecorded
steps, the writer's peak RSS and the most bytes spooled at once, against the queue cap; the
store's bytes and write rate, and the raw disk write speed for the same bytes. Variants:
  pieces     each rank writes its pieces of the sharded tensors, every tensor's bytes (the default):
             store format 3, a step's small tensors packed into a few files (docs/FORMAT.md, Packs)
  beside     the same with the writer processes at the ranks' priority (--writer-nice 0), for
             comparison: by default they run at nice 19 and take the cores training leaves idle
             (tracekit/writer/priority.py)
  objects    the same into a format 2 store: every tensor its own file, for comparison
  summaries  --full matching no tensor: summaries and hashes only
  gather     the former path (every rank gathers whole tensors), for comparison
The load average is printed at the start and the end: on a shared machine say it beside a figure.

So is what creating a file costs on the disk, before and after (the writer creates one file per
tensor kept, ~600 per rank and step at 10M). On an ext4 without a journal (this VM's disk) it is
12-35 us while the disk is quiet, but 0.3-0.6 ms for a minute or more after many files were
deleted (a removed store, an earlier bench's): the allocator then skips each recently freed inode
one by one (fs/ext4/ialloc.c, recently_deleted()). A 10M figure measured in that state is the
disk's, not tracekit's: wait until the probe says tens of microseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {10: (100, 316), 100: (100, 1000)}  # params (M) -> (layers, width): layers x (w*w + w), 2 tensors each
NOTHING = "tracekit-bench-matches-no-tensor"  # a --full glob that keeps no tensor's bytes
TOP_PHASES = ("observe", "begin_step", "end_step: capture", "end_step: seal")
TARGETS = {(10, "pieces"): 1.2, (100, "pieces"): 1.5, (100, "summaries"): 1.1}
# Recorded steps that pay one-off costs: the first starts the writer process (~0.4 s of CPU) and
# allocates the first slab's tmpfs pages (100M: 600 MB, ~0.25 s), the second maps that slab.
WARM_RECORDED = 2


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layers_n, width = SHAPES[args.params]
    torch.manual_seed(0)
    layers = []
    for _ in range(layers_n):
        lin = torch.nn.Linear(width, width)
        torch.nn.init.normal_(lin.weight, std=width ** -0.5)
        layers += [lin, torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, width)

    def train(steps, rec=None, marks=None):
        for _ in range(steps):
            out = model(x)
            loss = out.square().mean()
            loss.backward()
            if rec is not None:
                rec.observe(output=out, loss=loss.detach())
            opt.step()
            opt.zero_grad()
            if marks is not None:
                marks.append(time.perf_counter())

    def unrecorded() -> tuple[float, float]:
        """Seconds and CPU seconds per unrecorded step, over --steps steps."""
        dist.barrier()
        cpu0, kernel0 = _cpu(resource.RUSAGE_SELF), _kernel(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        train(args.steps)
        dist.barrier()
        return ((time.perf_counter() - t0) / args.steps, (_cpu(resource.RUSAGE_SELF) - cpu0) / args.steps,
                [(b - a) / args.steps for a, b in zip(kernel0, _kernel(resource.RUSAGE_SELF))])

    load0 = os.getloadavg()
    train(2)  # warm-up
    _reset_peak_rss()
    # unrecorded steps before the first variant and after each: a variant's baseline is the mean of
    # the two around it, so that a machine that drifts (this VM's speed does) moves both alike
    plains = [unrecorded()]
    plain_rss = _peak_rss()

    results = {}
    for variant in args.variants:
        store = os.path.join(args.dir, f"store-{variant}")
        _prepare_store(variant, store)
        phases = _time_recorder_phases()
        _reset_peak_rss()
        self0, child0, kernel0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), _kernel(resource.RUSAGE_SELF)
        child_sys0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
        t0 = time.perf_counter()
        with _recording(args, variant, store, model, opt) as rec:
            handoff = rec._handoff
            marks = []
            train(args.steps, rec, marks)
            rec.flush()  # every step in the store: the writer's peak RSS is in, only its exit is left
            flushed = time.perf_counter()
            writer_hwm = _peak_rss(handoff._proc.pid) if handoff else 0
        # the with-block's close waited for the writer process to store every step and exit
        dist.barrier()
        elapsed = (time.perf_counter() - t0) / args.steps
        warm = WARM_RECORDED * args.every
        results[variant] = {
            "step": elapsed,
            "steady": (flushed - marks[warm - 1]) / (args.steps - warm) if args.steps > warm else None, "phases": dict(phases), "store": store,
            "rank_cpu": (_cpu(resource.RUSAGE_SELF) - self0) / args.steps,
            "rank_kernel": [(b - a) / args.steps for a, b in zip(kernel0, _kernel(resource.RUSAGE_SELF))],
            "writer_cpu": (_cpu(resource.RUSAGE_CHILDREN) - child0) / args.steps,
            "writer_sys": (resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - child_sys0) / args.steps,
            "rank_extra_rss": _peak_rss() - plain_rss,
            "writer_rss": writer_hwm,
            "spooled_peak": handoff.peak_spooled if handoff else 0,
        }
        _untime_recorder_phases()
        plains.append(unrecorded())
        results[variant]["plain"], results[variant]["plain_cpu"] = (
            (a + b) / 2 for a, b in zip(plains[-2][:2], plains[-1][:2]))
        results[variant]["plain_kernel"] = [(a + b) / 2 for a, b in zip(plains[-2][2], plains[-1][2])]
    for variant in args.variants if args.pairs else ():
        results[variant]["interleaved"] = interleaved(args, variant, train, model, opt)
    # what starting a writer process costs (its imports), once per rank and recording: part of
    # the writer CPU above, spread over few steps here
    child0 = _cpu(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import tracekit.writer.spool_writer"], check=True)
    writer_start = _cpu(resource.RUSAGE_CHILDREN) - child0
    load1 = os.getloadavg()
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        _report(args, model, world, plains, gathered, load0, load1, writer_start)
    dist.destroy_process_group()


def _prepare_store(variant: str, store: str) -> None:
    """objects: the store made in format 2 before the Recorder would make it in the current format."""
    import torch.distributed as dist

    if variant == "objects":
        if dist.get_rank() == 0:
            from tracekit.store import create_store
            from tracekit.store.ownership import new_run_id

            create_store(store, {"launcher": None, "run_id": new_run_id()}, format_version=2)
        dist.barrier()


@contextlib.contextmanager
def _recording(args, variant: str, store: str, model, opt, config_class=None):
    """The variant's Recorder, started, closed on leaving (config_class: a RecordConfig subclass)."""
    from tracekit.recorders import RecordConfig, Recorder

    full = (NOTHING,) if variant == "summaries" else ()
    nice = {"writer_nice": 0} if variant == "beside" else {}
    config = (config_class or RecordConfig)(store=store, every=args.every, full=full, queue_mb=args.queue_mb, **nice)
    with Recorder(model, opt, config=config) as rec:
        if variant == "gather":
            rec._pieces = False  # the former path, for comparison only
        yield rec


def interleaved(args, variant: str, train, model, opt) -> list[tuple[float, float, float]]:
    """The variant's steady-state ratio measured against the VM's drift: one recorder, the writer
    started and the first slab made by WARM_RECORDED recorded steps, then --pairs times a block of
    --block unrecorded steps and one of --block recorded steps (its flush included, so that none of
    its writer's work spills into the next block), and a last unrecorded block. Returns, per pair,
    (recorded block, the unrecorded blocks before and after it), seconds per step: each recorded
    block is held against its own neighbours, seconds apart, where the continuous measurement's
    baseline is a minute away."""
    import torch.distributed as dist

    from tracekit.recorders import RecordConfig

    class Scheduled(RecordConfig):  # records the steps in `recorded`, which grows as the blocks go
        recorded: set = set()

        def records_step(self, step: int) -> bool:
            return step in self.recorded

    k, times = args.block, []

    def block(rec, recorded: bool) -> float:
        if recorded:
            Scheduled.recorded.update(range(rec.step + 1, rec.step + 1 + k))
        dist.barrier()
        t0 = time.perf_counter()
        train(k, rec)
        if recorded:
            rec.flush()
        dist.barrier()
        return (time.perf_counter() - t0) / k

    store = os.path.join(args.dir, f"store-{variant}-interleaved")
    _prepare_store(variant, store)
    with _recording(args, variant, store, model, opt, Scheduled) as rec:
        Scheduled.recorded.update(range(1, WARM_RECORDED + 1))
        train(WARM_RECORDED, rec)
        rec.flush()
        plain = block(rec, False)
        for _ in range(args.pairs):
            rec_time = block(rec, True)
            after = block(rec, False)
            times.append((rec_time, plain, after))
            plain = after
    return times


def _report(args, model, world, plains, per_rank, load0, load1, writer_start) -> None:
    params = sum(p.numel() for p in model.parameters())
    ntensors = len(list(model.parameters()))
    cap = args.queue_mb * 1024 * 1024
    mb = 1e6
    print(f"model: {ntensors} parameter tensors, {params / 1e6:.1f}M parameters, FSDP2 on {world} ranks, "
          f"{args.steps} steps, recording every {args.every} step(s), {os.cpu_count()} CPU cores, queue cap {args.queue_mb} MB")
    print(f"load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print("step time without recording:  " + ", ".join(f"{p * 1e3:.1f}" for p, _, _ in plains) + " ms   (before the first "
          "variant and after each; rank CPU " + ", ".join(f"{c * 1e3:.0f}" for _, c, _ in plains) + " ms/step)")
    r0 = per_rank[0]
    ratios = {}
    for variant, res in r0.items():
        how = {"pieces": "each rank its pieces, every tensor's bytes",
               "beside": "each rank its pieces, every tensor's bytes, writers at the ranks' priority (nice 0)",
               "objects": "each rank its pieces, every tensor's bytes, format 2 (a file per tensor)",
               "summaries": "summaries and hashes only (--full matching no tensor)",
               "gather": "every rank gathers whole tensors (the former path)"}[variant]
        step, plain, plain_cpu = res["step"], res["plain"], res["plain_cpu"]  # the baseline around this variant
        ratios[variant] = step / plain
        target = TARGETS.get((args.params, variant))
        print(f"-- recorded, {how}:")
        print(f"step time with recording:     {step * 1e3:8.1f} ms  (flush at the end included)")
        print(f"overhead ratio:               {step / plain:8.2f}x" + (f"  (target <= {target}x)" if target else ""))
        if res["steady"] is not None:
            warm = WARM_RECORDED * args.every
            print(f"steady state, after step {warm}:  {res['steady'] * 1e3:8.1f} ms, {res['steady'] / plain:.2f}x"
                  + (f"  (target <= {target}x)" if target else "")
                  + f"  (steps {warm + 1}-{args.steps} and the flush: without the start's one-off costs)")
        if res.get("interleaved"):
            pairs = sorted(rec / ((before + after) / 2) for rec, before, after in res["interleaved"])
            print(f"interleaved, {len(pairs)} blocks of {args.block} recorded steps (flush included) each between "
                  f"{args.block} unrecorded: {statistics.median(pairs):.2f}x median, {pairs[0]:.2f}-{pairs[-1]:.2f}x"
                  + (f"  (target <= {target}x)" if target else ""))
        thread = sum(v for k, v in res["phases"].items() if k in TOP_PHASES) / args.steps  # the others are inside these
        print("  on the training thread:     " + ", ".join(f"{k} {v / args.steps * 1e3:.1f}" for k, v in res["phases"].items())
              + f" ms/step; total {thread * 1e3:.1f} ms")
        writer = [r[variant]["writer_cpu"] for r in per_rank]
        rank_cpu = [r[variant]["rank_cpu"] for r in per_rank]
        print(f"  CPU per step, rank:         " + ", ".join(f"{c * 1e3:.0f}" for c in rank_cpu) + f" ms (unrecorded {plain_cpu * 1e3:.0f})"
              + "; of it in the kernel: " + ", ".join(f"{r[variant]['rank_kernel'][0] * 1e3:.0f}" for r in per_rank)
              + f" ms (unrecorded {res['plain_kernel'][0] * 1e3:.0f}); page faults per step: "
              + ", ".join(f"{r[variant]['rank_kernel'][1]:.0f}" for r in per_rank) + f" (unrecorded {res['plain_kernel'][1]:.0f})")
        print(f"  CPU per step, writer:       " + ", ".join(f"{c * 1e3:.0f}" for c in writer) + " ms; without its start "
              f"({writer_start * 1e3:.0f} ms once): " + ", ".join(f"{(c - writer_start / args.steps) * 1e3:.0f}" for c in writer) + " ms"
              + "; of it in the kernel: " + ", ".join(f"{r[variant].get('writer_sys', 0) * 1e3:.0f}" for r in per_rank) + " ms")
        extra_cpu = sum(rank_cpu) + sum(writer) - world * plain_cpu
        print(f"  recording CPU, all ranks:   {extra_cpu * 1e3:8.0f} ms/step over {os.cpu_count()} cores "
              f"(= {extra_cpu / os.cpu_count() * 1e3:.0f} ms of wall if the cores were the limit)")
        print(f"  ratio if the writers had cores of their own (training thread only): {(plain + thread) / plain:.2f}x")
        for r, rr in enumerate(per_rank):
            v = rr[variant]
            extra = v["rank_extra_rss"]
            print(f"  rank {r} memory: extra peak RSS {extra / mb:.0f} MB, writer peak RSS {v['writer_rss'] / mb:.0f} MB, "
                  f"spooled at most {v['spooled_peak'] / mb:.0f} MB; rank extra / cap {extra / cap:.2f} "
                  f"(target <= 1.10)")
        written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(res["store"]) for f in fs)
        print(f"  store bytes written:        {written / 1e9:8.3f} GB, {written / (step * args.steps) / mb:.1f} MB/s")
        if written > 64 * 1024 * 1024:
            print(f"  raw disk write (numpy+fsync) of as many bytes: {raw_write_speed(args.dir, written) / mb:.1f} MB/s")
    if "pieces" in ratios and "gather" in ratios:
        print(f"pieces / gather step time:    {ratios['pieces'] / ratios['gather']:8.2f}x")
    if "pieces" in ratios and "objects" in ratios:
        print(f"pieces (format 3) / objects (format 2) step time: {ratios['pieces'] / ratios['objects']:8.2f}x")
    if "pieces" in ratios and "beside" in ratios:
        print(f"pieces (writers at nice 19) / beside (nice 0) step time: {ratios['pieces'] / ratios['beside']:8.2f}x")
    if "pieces" in ratios and "summaries" in ratios:
        print(f"summaries / pieces step time: {ratios['summaries'] / ratios['pieces']:8.2f}x")


def _cpu(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _kernel(who) -> tuple[float, int]:
    """(CPU seconds in the kernel, minor page faults) so far: a page fault costs kernel time, and
    a mapping or buffer made afresh each step faults its pages in again."""
    r = resource.getrusage(who)
    return r.ru_stime, r.ru_minflt


def _reset_peak_rss() -> None:
    """Start the process's peak RSS (VmHWM) over from its current RSS (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss(pid="self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_ORIGINAL: dict = {}


def _untime_recorder_phases() -> None:
    from tracekit.writer.handoff import Handoff
    from tracekit.recorders.recorder import Recorder

    for (cls, meth), orig in _ORIGINAL.items():
        setattr({"Recorder": Recorder, "Handoff": Handoff}[cls], meth, orig)


def _time_recorder_phases() -> dict:
    """Wrap the recorder's training-thread entry points to report where the overhead goes. The
    hand-off (spool writes, and any wait for room under the queue cap) is timed within end_step;
    with the direct capture (recorders/direct.py) the spool writes are begin_step's and capture's
    own, and only the entry's hand-over (link, rename, any wait for room) is timed apart."""
    import collections

    from tracekit.writer.handoff import Handoff
    from tracekit.recorders.recorder import Recorder

    totals = collections.Counter()
    for cls, meth, label in ((Recorder, "observe", "observe"), (Recorder, "begin_step", "begin_step"),
                             (Handoff, "put", "(of which step 0's spool write)"),
                             (Recorder, "capture_after", "end_step: capture"), (Handoff, "provisional", "(of which spool write)"),
                             # the direct capture writes the entry in begin_step and capture; this is its link + rename
                             (Handoff, "provisional_slab", "(of which hand-over of the entry filled in place)"),
                             (Recorder, "finish_step", "end_step: seal")):
        orig = _ORIGINAL.setdefault((cls.__name__, meth), getattr(cls, meth))

        def timed(self, *a, _orig=orig, _name=label, **k):
            t0 = time.perf_counter()
            try:
                return _orig(self, *a, **k)
            finally:
                totals[_name] += time.perf_counter() - t0

        setattr(cls, meth, timed)
    return totals


def folder_filesystem(folder: str, mountinfo: str = "/proc/self/mountinfo", jbd2: str = "/proc/fs/jbd2") -> str:
    """The file system `folder` is on, in words: its type and, for ext4, whether it has a journal.
    Without one, ext4 gives a new file no inode freed in the last minute or more, and skips each
    such inode one by one (create_cost's doc), so file creation there can cost 30x what it does
    with a journal (measured 20 against 720-790 us on this VM, 2026-12-07). "unknown" where Linux's
    /proc does not say."""
    try:
        st = os.stat(folder)
        wanted = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        with open(mountinfo) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return "unknown"
    for fields in reversed(mounts):  # the last mount of a device is the one in effect
        if len(fields) < 10 or fields[2] != wanted or "-" not in fields[6:]:
            continue
        rest = fields[fields.index("-", 6) + 1:]
        fstype, source = rest[0], rest[1]
        if fstype != "ext4":
            return fstype
        try:
            journals = os.listdir(jbd2)
        except OSError:
            return "ext4 (journal unknown)"
        device = os.path.basename(source)
        has = any(name.rsplit("-", 1)[0] == device for name in journals)
        return "ext4 with a journal" if has else "ext4 WITHOUT a journal (file creation slowed by recent deletions)"
    return "unknown"


def create_cost(folder: str, files: int = 300) -> float:
    """Seconds to create (and write 4 KiB into) one new file in a new subfolder of `folder`, as the
    store writer does per object. The files stay until the bench's folder is removed: deleting
    them here would itself slow the creations that follow (see the module's doc)."""
    sub = tempfile.mkdtemp(prefix="create-probe-", dir=folder)
    data = b"\0" * 4096
    t0 = time.perf_counter()
    for i in range(files):
        fd = os.open(os.path.join(sub, str(i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)
    return (time.perf_counter() - t0) / files


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
    p.add_argument("--params", type=int, choices=sorted(SHAPES), default=10, help="model size, millions of parameters")
    p.add_argument("--steps", type=int, default=None, help="timed steps per variant (default: 20 at 10M, 8 at 100M)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--every", type=int, default=1, help="record every k-th step (k > 1: a disk that keeps up)")
    p.add_argument("--variants", default=None, help="comma-separated: pieces, beside, objects, summaries, gather "
                   "(default: pieces,beside,summaries,gather at 10M; pieces,summaries at 100M)")
    p.add_argument("--pairs", type=int, default=4, help="interleaved blocks of recorded steps per variant, each "
                   "between unrecorded ones (0: none)")
    p.add_argument("--block", type=int, default=None, help="steps per interleaved block (default: 5 at 10M, 3 at 100M)")
    p.add_argument("--queue-mb", type=int, default=None, help="the recorder's queue cap (default: RecordConfig's)")
    p.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="leave the stores (and say where): removing thousands of "
                   "files slows the file creations of a bench run right after (see the doc)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps is None:
        args.steps = 20 if args.params == 10 else 8
    if args.block is None:
        args.block = 5 if args.params == 10 else 3
    if args.variants is None:
        args.variants = "pieces,beside,summaries,gather" if args.params == 10 else "pieces,summaries"
    if args.queue_mb is None:
        from tracekit.launch.config import DEFAULT_QUEUE_MB

        args.queue_mb = DEFAULT_QUEUE_MB
    if args.worker:
        args.variants = args.variants.split(",")
        return worker(args)
    folder = tempfile.mkdtemp(prefix="tracekit-bench-", dir=args.dir)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               __file__, "--worker", "--params", str(args.params), "--steps", str(args.steps), "--batch", str(args.batch),
               "--every", str(args.every), "--pairs", str(args.pairs), "--block", str(args.block), "--variants", args.variants, "--queue-mb", str(args.queue_mb), "--dir", folder]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        before = create_cost(folder)
        print(f"creating a file on this disk, before the bench: {before * 1e6:.0f} us", flush=True)
        rc = subprocess.call(cmd, env=env)
        print(f"creating a file on this disk, after the bench:  {create_cost(folder) * 1e6:.0f} us "
              f"(before: {before * 1e6:.0f} us; hundreds of us: figures slowed by recent deletions)")
        sys.exit(rc)
    finally:
        if args.keep:
            print(f"the stores are left in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
