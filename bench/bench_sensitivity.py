"""How small an error does `tracekit diff` flag, and how many clean pairs does it fail? (issue 9)

Records the tutorial workload (ddp, 2 ranks, CPU/gloo) with planted faults of relative size e,
for e in 1e-2 .. 1e-7, in two families:

  lr           --fault lr_scale=1+e           the learning rate is off by e, every step
  grad_scale   --fault grad_scale=1:2:1+e     rank 1's gradients are off by e, in step 2 only

and diffs each against a clean recording three ways: the default rule, the default rule with
--oracle (a float64 recording of the same job), and --exact (does anything differ at all: the
floor set by float32 itself). It prints, per fault, whether it is flagged and the step and kind
where it is first flagged, then the smallest e flagged per family and way, and the false alarms
over the clean pairs (two recordings of each mode; ddp vs fsdp vs tp vs simplefsdp_tp and 2 vs 4
ranks with --align global; simplefsdp_tp eager vs aot_eager), with and without --oracle.

The physics floor of the lr family: an lr error e changes the update lr * g by e * lr * g, and
float32 rounds the updated parameter to half an ulp of p; printed is the e at which that change
reaches half an ulp for the median parameter element of step 1 (from the clean recording).

    python bench/bench_sensitivity.py [--steps 4] [--workdir DIR]   # DIR keeps the recordings for a rerun

`--workload bf16` (issue 35) asks the same of low-precision candidates against a float32
reference, with the default precision rule and structured-error detection: faults on a bf16
autocast candidate (lr off by e, rank 1's gradients off by e in step 2), a one-op bf16 cast in a
float32 run (`op=matmul_bf16`), and legitimate pairs (fp32 vs autocast bf16 and vs FSDP2
mixed precision, two bf16 recordings, ddp vs fsdp vs tp, 2 vs 4 ranks, compile vs eager). It
prints the smallest fault flagged per family and every false alarm. `--budget SECONDS` stops
before a new recording once that long has passed (rerun with the same --workdir to go on).

`--workload titan` does the same on TorchTitan's llama3 debug model (samples/torchtitan, 2 ranks,
the tiny shapes of docs/TORCHTITAN.md; FSDP2 with its default MixedPrecisionPolicy, bfloat16
parameters and float32 reductions, and AdamW): lr faults on the bf16 run against a float32
reference (`--training.mixed-precision-param float32`) and against the clean bf16 run, rank 1's
gradient shards off by e in step 2 (the runner's `--fault grad_scale:1:2:1+e`), one op's result in
bfloat16 in a float32 run (`--fault ffn_bf16:1:2`: layers.1.feed_forward's output), and the
legitimate pairs fp32 vs bf16 and compile (aot_eager) vs eager, and with `--titan-layouts` fsdp vs
hsdp (4 ranks, one seed checkpoint); no 2 vs 4 ranks pair (the loader gives other ranks other
data). A 2-rank run takes about a minute on a CPU: run it with `--budget` and the same
`--workdir` until it prints its tables.

`--only SECTIONS` (comma-separated; fp32: lr, grad_scale, clean; titan: lr, grad_scale, cast,
pairs) runs part of a workload, so that a long bench splits into short invocations over
one `--workdir` (the recordings are reused).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tracekit  # noqa: E402

EXPONENTS = [2, 3, 4, 5, 6, 7]
FAULT_STEP = 2  # grad_scale: the step, on rank 1


DEADLINE = [None]  # time.monotonic() after which no new recording starts (--budget)
# The sections each workload can be cut into (--only); the bf16 workload runs whole.
SECTIONS = {"fp32": ("lr", "grad_scale", "clean"), "bf16": (),
            "titan": ("lr", "grad_scale", "cast", "pairs")}
WANTED: set[str] = set()


def record(workdir: str, name: str, mode: str, ranks: int, steps: int, extra=()) -> str:
    """`tracekit record` of samples/tutorial (reused when the store is already complete)."""
    args = ["--parallelism", mode, "--device", "cpu", "--backend", "gloo", "--steps", str(steps)]
    if mode == "simplefsdp_tp":
        args += ["--tp", "2"]
    return _recorded(workdir, name, [], ranks, [os.path.join(ROOT, "samples", "tutorial", "train.py"), *args, *extra])


def _recorded(workdir: str, name: str, record_args: list, ranks: int | None, command: list) -> str:
    """`tracekit record [record_args] -o WORKDIR/NAME -- torchrun ... COMMAND` (ranks None: COMMAND
    as given, not recorded), reused when it completed before."""
    store = os.path.join(workdir, name)
    done = store + ".done"  # beside the store: a foreign file inside it would be a damaged store
    if os.path.isfile(done):
        return store
    if DEADLINE[0] is not None and time.monotonic() > DEADLINE[0]:
        sys.exit(f"--budget spent before recording {name}: rerun with --workdir {workdir} to go on")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks or 1}", *command]
    cmd = launch if ranks is None else [sys.executable, "-m", "tracekit.cli.main", "record", "--force", *record_args,
                                        "-o", store, "--", *launch]
    began = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        sys.exit(f"recording {name} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    print(f"(recorded {name} in {time.monotonic() - began:.0f} s)", flush=True)
    open(done, "w").close()
    return store


def verdict(report) -> tuple[bool, str, str, float | None]:
    """(flagged, first step, first kind, largest margin over every kind and step)."""
    margins = [s.margin for s in report.summary if s.margin is not None]
    worst = max(margins) if margins else None
    d = report.first_divergence
    if report.status == "error":
        return True, "-", "ERROR", worst
    return (not report.passed, str(d.step) if d else "-", d.kind if d else "-", worst)


def lr_floor(store: str) -> float:
    """Median over parameter elements of (half an ulp of p_after) / |p_after - p_before| at step 1."""
    s = tracekit.open_store(store).rank(0)
    ratios = []
    for t in s.tensors("parameters"):
        before = s.read("parameters", 0, t.name).astype(np.float32)
        after = s.read("parameters", 1, t.name).astype(np.float32)
        upd = np.abs(after.astype(np.float64) - before.astype(np.float64))
        half_ulp = np.spacing(np.abs(after)).astype(np.float64) / 2
        ok = upd > 0
        ratios.append(half_ulp[ok] / upd[ok])
    return float(np.median(np.concatenate(ratios)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="keep the recordings here (reused when rerun)")
    ap.add_argument("--workload", choices=("fp32", "bf16", "titan"), default="fp32")
    ap.add_argument("--titan-layouts", action="store_true", help="titan: also fsdp vs hsdp on 4 ranks")
    ap.add_argument("--budget", type=float, default=None, help="seconds after which no new recording starts")
    ap.add_argument("--only", default=None,
                    help="comma-separated sections to run (fp32: lr, grad_scale, clean; titan: lr, grad_scale, cast, "
                         "pairs): a long bench split into short invocations sharing one --workdir")
    args = ap.parse_args()
    sections = SECTIONS[args.workload]
    only = set(sections if args.only is None else args.only.split(","))
    if not only <= set(sections):
        ap.error(f"--only for --workload {args.workload}: choose from {', '.join(sections)}" if sections
                 else f"--only: --workload {args.workload} runs whole")
    WANTED.clear()
    WANTED.update(only)
    workdir = args.workdir or tempfile.mkdtemp(prefix="tracekit-sensitivity-")
    os.makedirs(workdir, exist_ok=True)
    if args.budget is not None:
        DEADLINE[0] = time.monotonic() + args.budget
    if args.workload == "bf16":
        return bf16_main(workdir, args.steps)
    if args.workload == "titan":
        return titan_main(workdir, args.steps, args.titan_layouts)
    steps = args.steps
    rec = lambda name, mode="ddp", ranks=2, extra=(): record(workdir, name, mode, ranks, steps, extra)  # noqa: E731

    ref = rec("ddp")
    oracle = rec("ddp-f64", extra=("--dtype", "float64"))
    print(f"tracekit diff sensitivity: tutorial ddp, 2 ranks, {steps} steps, CPU/gloo; recordings in {workdir}")
    smallest: dict[tuple[str, str], float] = {}
    families = [f for f in ("lr", "grad_scale") if f in WANTED]
    if families:
        print(f"{'family':<11} {'e':>6}  {'default: flagged step kind':<34} {'margin':>8}  "
              f"{'--oracle: flagged step kind':<34} {'--exact: differs step kind':<30}")
    for family in families:
        for x in EXPONENTS:
            e = 10.0 ** -x
            spec = f"lr_scale={1 + e!r}" if family == "lr" else f"grad_scale=1:{FAULT_STEP}:{1 + e!r}"
            cand = rec(f"{family}-1e-{x}", extra=("--fault", spec))
            cells = []
            for way, kw in (("default", {}), ("oracle", {"oracle": oracle}), ("exact", {"exact": True})):
                flagged, step, kind, margin = verdict(tracekit.diff(ref, cand, **kw))
                if flagged:
                    smallest[(family, way)] = min(smallest.get((family, way), 1.0), e)
                cells.append((f"{'yes' if flagged else 'no':<4} {step:>4}  {kind:<22}", margin))
            margin = cells[0][1]
            print(f"{family:<11} {f'1e-{x}':>6}  {cells[0][0]:<34} {'n/a' if margin is None else f'{margin:.3g}':>8}  "
                  f"{cells[1][0]:<34} {cells[2][0]:<30}")
    if families:
        print()
    for family in families:
        parts = [f"{way} {smallest[(family, way)]:.0e}" if (family, way) in smallest else f"{way} none"
                 for way in ("default", "oracle", "exact")]
        print(f"smallest e flagged, {family}: " + ", ".join(parts))
    if "lr" in WANTED:
        print(f"lr physics floor (half an ulp of the updated parameter, median element of step 1): e = {lr_floor(ref):.2e}")
    if "clean" not in WANTED:
        return

    print()
    nb, nb_oracle = rec("ddp-nobias", extra=("--no-bias",)), rec("ddp-nobias-f64", extra=("--no-bias", "--dtype", "float64"))
    sft = rec("simplefsdp_tp", "simplefsdp_tp", 4)
    pairs = [
        ("ddp vs ddp (again)", ref, rec("ddp-again"), "rank", oracle),
        ("fsdp vs fsdp (again)", rec("fsdp", "fsdp"), rec("fsdp-again", "fsdp"), "rank", None),
        ("tp vs tp (again)", rec("tp", "tp"), rec("tp-again", "tp"), "rank", None),
        ("simplefsdp_tp vs again", sft, rec("simplefsdp_tp-again", "simplefsdp_tp", 4), "rank", None),
        ("ddp vs fsdp", ref, rec("fsdp", "fsdp"), "global", oracle),
        ("ddp vs tp", ref, rec("tp", "tp"), "global", oracle),
        ("ddp 2 vs 4 ranks", ref, rec("ddp4", ranks=4), "global", oracle),
        ("ddp vs simplefsdp_tp (no bias)", nb, sft, "global", nb_oracle),
        ("simplefsdp_tp eager vs aot_eager", rec("simplefsdp_tp-eager", "simplefsdp_tp", 4, ("--compile-backend", "none")),
         sft, "global", None),
    ]
    alarms = {"default": 0, "oracle": 0}
    runs = {"default": 0, "oracle": 0}
    print(f"{'clean pair':<34} {'align':<7} {'default':<8} {'margin':>8}  {'--oracle':<8} {'margin':>8}")
    for name, a, b, align, orc in pairs:
        rep = tracekit.diff(a, b, align=align, allow_missing=True)
        flagged, _, _, margin = verdict(rep)
        alarms["default"] += flagged
        runs["default"] += 1
        cells = [f"{'FAIL' if flagged else 'pass':<8} {'n/a' if margin is None else f'{margin:.3g}':>8}"]
        if orc is not None:
            rep = tracekit.diff(a, b, align=align, allow_missing=True, oracle=orc)
            flagged, _, _, margin = verdict(rep)
            alarms["oracle"] += flagged
            runs["oracle"] += 1
            cells.append(f"{'FAIL' if flagged else 'pass':<8} {'n/a' if margin is None else f'{margin:.3g}':>8}")
        else:
            cells.append(f"{'-':<8} {'-':>8}")
        print(f"{name:<34} {align:<7} {cells[0]}  {cells[1]}")
    print(f"false alarms: default {alarms['default']}/{runs['default']}, --oracle {alarms['oracle']}/{runs['oracle']}")


def _flag(report) -> str:
    """One cell: pass, or FAIL with where, and 'systematic' when only the error's shape failed it."""
    if report.passed:
        return "pass"
    d = report.first_divergence
    how = "systematic" if report.systematic_only and not report.num_violations else "bounds"
    return f"FAIL {how} step {d.step} {d.kind}" if d else "FAIL"


def bf16_main(workdir: str, steps: int) -> None:
    rec = lambda name, mode="ddp", ranks=2, extra=(): record(workdir, name, mode, ranks, steps, extra)  # noqa: E731
    ac = ("--autocast", "bf16")
    ref = rec("ddp")
    print(f"tracekit diff sensitivity, bf16 workload: tutorial, 2 ranks, {steps} steps, CPU/gloo; "
          f"float32 ddp reference; recordings in {workdir}")
    print(f"{'fault (candidate)':<46} {'verdict':<36} {'deltas k':>9} {'z':>7}  precision rule")
    smallest: dict[str, float] = {}
    faults = [("lr, bf16 autocast", x, ac + ("--fault", f"lr_scale={1 + 10.0 ** -x!r}")) for x in (2, 3, 4, 5)]
    faults += [("grad_scale rank 1 step 2, bf16 autocast", x, ac + ("--fault", f"grad_scale=1:2:{1 + 10.0 ** -x!r}"))
               for x in (2, 3, 4)]
    faults += [("one matmul in bf16 (rank 1, step 2), fp32 run", None, ("--fault", "op=matmul_bf16:1:2"))]
    for family, x, extra in faults:
        name = f"{family.split(',')[0].split()[0]}-bf16-1e-{x}" if x else "op-matmul_bf16"
        try:
            report = tracekit.diff(ref, rec(name, extra=extra))
        except RuntimeError as e:  # a diff that breaks is reported, not a reason to lose the other rows
            print(f"{family + (' e=1e-' + str(x) if x else ''):<46} ERROR: {e}")
            continue
        sig = next(iter(report.signatures), None)
        if not report.passed and x is not None:
            smallest[family] = min(smallest.get(family, 1.0), 10.0 ** -x)
        label = f"{family} {'e=1e-' + str(x) if x else ''}"
        k = "-" if sig is None else sig.shape if sig.factor is None else f"{sig.factor:.5f}"  # shapes without a factor: named
        print(f"{label:<46} {_flag(report):<36} {k:>9} "
              f"{f'{sig.z:.0f}' if sig and sig.z is not None else '-':>7}  {report.precision['compute'] or 'float32'}")
    for family in dict.fromkeys(f for f, x, _ in faults if x is not None):
        print(f"smallest e flagged, {family}: {smallest[family]:.0e}" if family in smallest
              else f"smallest e flagged, {family}: none")
    print()
    mp = ("--mixed-precision", "bf16")
    nb = ("--no-bias",)
    pairs = [
        ("fp32 ddp vs bf16 autocast ddp", ref, rec("ddp-ac", extra=ac), "rank"),
        ("fp32 fsdp vs fsdp mixed precision bf16", rec("fsdp", "fsdp"), rec("fsdp-mp", "fsdp", extra=mp), "rank"),
        ("bf16 autocast ddp vs again", rec("ddp-ac", extra=ac), rec("ddp-ac-again", extra=ac), "rank"),
        ("fsdp mixed precision vs again", rec("fsdp-mp", "fsdp", extra=mp), rec("fsdp-mp-again", "fsdp", extra=mp), "rank"),
        ("fp32 ddp vs fsdp mixed precision", ref, rec("fsdp-mp", "fsdp", extra=mp), "global"),
        ("bf16 autocast ddp vs fsdp mixed precision", rec("ddp-ac", extra=ac), rec("fsdp-mp", "fsdp", extra=mp), "global"),
        ("bf16 autocast ddp vs tp", rec("ddp-ac", extra=ac), rec("tp-ac", "tp", extra=ac), "global"),
        ("fp32 ddp vs bf16 autocast tp", ref, rec("tp-ac", "tp", extra=ac), "global"),
        ("bf16 autocast ddp 2 vs 4 ranks", rec("ddp-ac", extra=ac), rec("ddp4-ac", ranks=4, extra=ac), "global"),
        ("fp32 ddp 2 vs bf16 autocast 4 ranks", ref, rec("ddp4-ac", ranks=4, extra=ac), "global"),
        ("fp32 ddp vs fsdp", ref, rec("fsdp", "fsdp"), "global"),
        ("simplefsdp_tp eager vs aot_eager (fp32)", rec("sft-eager", "simplefsdp_tp", 4, ("--compile-backend", "none")),
         rec("sft", "simplefsdp_tp", 4), "global"),
        ("fp32 ddp (no bias) vs simplefsdp_tp compiled", rec("ddp-nobias", extra=nb), rec("sft", "simplefsdp_tp", 4), "global"),
    ]
    _legitimate(pairs)


def _legitimate(pairs) -> None:
    """Diff each legitimate pair (name, ref, cand, align); print its verdict, largest margin and
    largest |z|, then every false alarm (a diff that breaks counts as one)."""
    alarms = []
    print(f"{'legitimate pair':<46} {'align':<7} {'verdict':<36} {'largest margin':>14} {'largest |z|':>11}")
    for name, a, b, align in pairs:
        try:
            report = tracekit.diff(a, b, align=align, allow_missing=True)
        except RuntimeError as e:
            alarms.append(f"{name} (ERROR)")
            print(f"{name:<46} {align:<7} ERROR: {e}")
            continue
        margins = [s.margin for s in report.summary if s.margin is not None]
        max_z = max((s.max_z for s in report.shapes.values()), default=0.0)
        if not report.passed:
            alarms.append(name)
        print(f"{name:<46} {align:<7} {_flag(report):<36} {max(margins) if margins else 0:>14.3g} {max_z:>11.1f}")
    print(f"false alarms: {len(alarms)}/{len(pairs)}" + (": " + "; ".join(alarms) if alarms else ""))



TITAN_LR = 8e-4  # llama3_debugmodel's AdamW learning rate


def titan_main(workdir: str, steps: int, layouts: bool) -> None:
    tt = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.seq-len", "64",
          "--training.local-batch-size", "2", "--training.steps", str(steps), "--debug.seed", "0"]
    runner = [os.path.join(ROOT, "samples", "torchtitan", "train.py"), "--assets", os.path.join(workdir, "assets")]

    def rec(name, extra=(), ranks=2):
        # TorchTitan's logs go to its dump folder (default ./outputs): into the bench's work folder, not the caller's
        dump = ["--dump-folder", os.path.join(workdir, f"{name}.dump")]
        return _recorded(workdir, name, ["--loss-reduction", "sum"], ranks, [*runner, *tt, *dump, *extra])

    fp32_args = ("--training.mixed-precision-param", "float32")
    fp32 = rec("tt-fp32", fp32_args)
    bf16 = rec("tt-bf16")
    print(f"tracekit diff sensitivity, TorchTitan llama3 debug model: 2 ranks, {steps} steps, CPU/gloo, FSDP2 "
          f"bf16 mixed precision + AdamW; recordings in {workdir}")
    print(f"{'fault (bf16 run unless said)':<40} {'against':<10} {'verdict':<36} {'k / shape':>9} {'z':>7}  precision rule")
    smallest: dict[tuple[str, str], float] = {}
    faults = []  # (family, e or None, candidate, references)
    both = (("fp32 ref", fp32), ("bf16 ref", bf16))
    if "lr" in WANTED:
        faults += [("lr", 10.0 ** -x, rec(f"tt-bf16-lr-1e-{x}", ("--optimizer.param-groups.0.optimizer-kwargs.lr",
                                                                 repr(TITAN_LR * (1 + 10.0 ** -x)))), both)
                   for x in (2, 3, 4, 5)]
    if "grad_scale" in WANTED:  # rank 1's gradient shards off by e in step 2 only (samples/torchtitan/fault.py)
        faults += [("grad_scale rank 1 step 2", 10.0 ** -x,
                    rec(f"tt-bf16-gs-1e-{x}", ("--fault", f"grad_scale:1:2:{1 + 10.0 ** -x!r}")), both) for x in (2, 3, 4)]
    if "cast" in WANTED:  # one op's result in bfloat16 in a float32 run
        faults += [("one op bf16 (rank 1 from step 2), fp32", None,
                    rec("tt-fp32-ffn-bf16", (*fp32_args, "--fault", "ffn_bf16:1:2")), (("fp32 ref", fp32),))]
    for family, e, cand, refs in faults:
        for against, ref in refs:
            # the model's output is float32 in the fp32 run and bfloat16 in the bf16 one: compared
            # under bfloat16's bounds; --allow-missing kept as when the lr figures were measured
            report = tracekit.diff(ref, cand, allow_missing=True)
            sig = next(iter(report.signatures), None)
            if not report.passed and e is not None:
                smallest[(family, against)] = min(smallest.get((family, against), 1.0), e)
            k = "-" if sig is None else sig.shape if sig.factor is None else f"{sig.factor:.5f}"
            label = family + (f" e={e:.0e}" if e is not None else "")
            print(f"{label:<40} {against:<10} {_flag(report):<36} {k:>9} "
                  f"{f'{sig.z:.0f}' if sig and sig.z is not None else '-':>7}  {report.precision['compute'] or 'float32'}")
    for family in dict.fromkeys(f for f, e, _, _ in faults if e is not None):
        for against in ("fp32 ref", "bf16 ref"):
            print(f"smallest e flagged, {family}, against the {against}: "
                  + (f"{smallest[(family, against)]:.0e}" if (family, against) in smallest else "none"))
    pairs = []
    if "pairs" in WANTED:
        compiled = rec("tt-bf16-compiled", ("--compile.enable", "--compile.backend", "aot_eager"))
        pairs += [("fp32 vs bf16 mixed precision (fsdp, AdamW)", fp32, bf16, "rank"),
                  ("bf16 eager vs compiled (aot_eager)", bf16, compiled, "rank"),
                  ("fp32 eager vs bf16 compiled", fp32, compiled, "rank")]
    # No 2 vs 4 ranks pair: 2 ranks x 2 sequences and 4 ranks x 1 from one seed checkpoint are not
    # one job, TorchTitan's loader gives the ranks other data (measured: step 1's loss 0.8% apart)
    if layouts:
        _recorded(workdir, "tt-seed", [], None, [*runner, *tt, "--checkpoint.enable", "--checkpoint.create-seed-checkpoint",
                                                   "--dump-folder", os.path.join(workdir, "tt-seed")])
        seed = ["--checkpoint.enable", "--checkpoint.load-only", "--checkpoint.initial-load-path",
                os.path.join(workdir, "tt-seed", "checkpoint", "step-0"), "--training.max-norm", "1e9"]
        pairs.append(("fsdp vs hsdp (4 ranks, one seed)", rec("tt-fsdp4", seed, 4),
                      rec("tt-hsdp4", (*seed, "--parallelism.data-parallel-replicate-degree", "2"), 4), "global"))
    if pairs:
        print()
        _legitimate(pairs)


if __name__ == "__main__":
    main()
