"""The diff itself: plan the comparison, stream it unit by unit on a thread pool, build the report
(tensors saved as pieces: region by region, compare/pieces.py).

Every read is the store's: the engine names tensors and element ranges of them, never rows,
chunks or offsets. Memory stays bounded whatever the store size: a unit of work is a batch of
element ranges of one (rank pair, kind, step) that the ref store reads together
(store/segments.py read_units: what lies in one stored chunk); each side's SegmentReader reads it
piece by piece (PIECE_ELEMENTS per side, ranges that follow each other in storage on every side
joined into one read, in buffers each worker thread reuses), and per-tensor metrics are
accumulated block by block and merged in order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tracekit.compare import alignment
from tracekit.compare.alignment import KindPair, TensorPair
from tracekit.compare.options import DiffOptions
from tracekit.compare.by_summary import compare_summaries
from tracekit.compare.catalog import StoreCatalog, load_catalog
from tracekit.compare.metrics import MetricsAccumulator, identical_metrics
from tracekit.compare.readahead import Readahead
from tracekit.compare.reduction import ReductionLengths
from tracekit.compare import pieces, rows
from tracekit.compare.report import DiffReport, Divergence, KindSummary, LossRow, TensorResult
from tracekit.compare.traces import compare_store_traces
from tracekit.compare import structure
from tracekit.compare.signatures import matcher, step_shapes
from tracekit.compare.drift import drift_note
from tracekit.compare.executors import Executor
from tracekit.compare.precision import derive as derive_precision
from tracekit.compare.tolerances import DEFAULT_ORACLE_FACTOR, Tolerance, Tolerances, load_config, parse_tol_option
from tracekit.store.dtypes import storage_dtype, to_numpy_values
from tracekit.errors import StoreError, UsageError
from tracekit.store.kinds import kind_order
from tracekit.store.scratch import Buffers
from tracekit.store.segments import SegmentReader, read_units
from tracekit.store.summaries import summarize

DETAILS = ("violations", "all")
# Elements read per side at a time: small enough to stay in the CPU cache while compared.
PIECE_ELEMENTS = 1 << 19


@dataclass
class _Segment:
    tensor: TensorPair
    start: int  # element range within the tensor
    stop: int
    index: int = 0  # its place in its unit's segments: where run_unit keeps its metrics


@dataclass
class _Unit:
    pair: KindPair
    step: int
    segments: list[_Segment]

    def nbytes(self, sides: int) -> int:
        """About the bytes the unit reads (the ref side's, times the sides)."""
        return sides * sum((sg.stop - sg.start) * storage_dtype(sg.tensor.ref.dtype).itemsize for sg in self.segments)


def _units(pair: KindPair, step: int, ref_rc, skip: frozenset = frozenset()) -> list[_Unit]:
    """The tensors of one (rank pair, kind, step) in units of work as the ref store reads them
    together (store/segments.py read_units; tensors named in `skip` are decided without reading)."""
    by_name = {t.ref.name: t for t in pair.tensors if t.name not in skip}
    return [_Unit(pair, step, [_Segment(by_name[name], start, stop, i) for i, (name, start, stop) in enumerate(segs)])
            for segs in read_units(ref_rc.view, pair.kind, list(by_name))]


def _batches(segments: list[_Segment], readers: list[SegmentReader]) -> list[list[tuple[_Segment, int, int]]]:
    """Cut the unit's segments into pieces of at most PIECE_ELEMENTS, joining neighbours that lie
    back to back on every side (many small tensors: one read per side for the lot)."""
    out: list[list[tuple[_Segment, int, int]]] = []
    cur: list[tuple[_Segment, int, int]] = []
    size = 0
    # whether each segment's first piece continues the previous segment's last on every side
    continues = [all(c) for c in zip(*(r.continues for r in readers))]
    for sg in segments:  # in the ref store's storage order (read_units)
        f = sg.start
        follows = continues[sg.index]
        while f < sg.stop:
            n = min(sg.stop - f, PIECE_ELEMENTS)
            if not (cur and size + n <= PIECE_ELEMENTS and (f > sg.start or follows)):
                if cur:
                    out.append(cur)
                cur, size = [], 0
            cur.append((sg, f, f + n))
            size += n
            f += n
    if cur:
        out.append(cur)
    return out


# Tensors this small are read even when their hashes agree: reading costs nothing, and a scalar's
# value (the loss) is shown in the report.
HASH_SKIP_MIN_ELEMENTS = 2


def _identical_by_hash(pair: KindPair, step: int, ref_rc, cand_rc, oracle: bool) -> frozenset:
    """Tensors whose bytes are the same on both sides by their content hashes (format v2), and hold
    no NaN/Inf (identical NaNs may still be violations): their comparison needs no read."""
    if oracle:
        return frozenset()
    rd, cd = ref_rc.view.digests(pair.kind, step), cand_rc.view.digests(pair.kind, step)
    if rd is None or cd is None:
        return frozenset()
    rf, cf = ref_rc.view.finite(pair.kind, step), cand_rc.view.finite(pair.kind, step)
    return frozenset(
        t.name for t in pair.tensors
        if t.ref.numel >= HASH_SKIP_MIN_ELEMENTS and t.ref.name == t.cand.name and t.ref.dtype == t.cand.dtype
        and rd[t.ref.name] == cd[t.cand.name] and rf[t.ref.name] and cf[t.cand.name])


def _check_hash_decided(pair: KindPair, step: int, ref_rc, cand_rc, names: frozenset) -> int:
    """Check the index entries of tensors decided by equal hashes against the objects they name,
    on both sides (hash, size, finiteness; StoreError if damaged). Equal hashes say two stores
    recorded the same bytes, not that the bytes are still there: two copies of one damaged store
    agree on every hash. Each object is read once per open store, so identical stores cost one
    hashing read of their distinct bytes, not a comparison (docs/FORMAT.md). Returns 0 (bytes compared)."""
    for t in pair.tensors:
        if t.name in names:
            ref_rc.view.check_entry(pair.kind, step, t.ref.name)
            cand_rc.view.check_entry(pair.kind, step, t.cand.name)
    return 0


def _by_summaries(pair: KindPair, same: frozenset) -> frozenset:
    """Tensors a side kept no bytes of (format 2, --full), not decided by equal hashes: compared by
    their summaries (compare/by_summary.py), never read."""
    return frozenset(
        t.name for t in pair.tensors if t.name not in same
        and not (t.ref.keeps_bytes and t.cand.keeps_bytes and (t.oracle is None or t.oracle.keeps_bytes)))


def _summary(side: str, rc, kind: str, step: int, info, cache: dict) -> np.ndarray:
    """A tensor's summary at a step: as stored, or (a store without summaries) from its bytes."""
    key = (side, rc.rank, kind, step)
    if key not in cache:
        cache[key] = rc.view.summaries(kind, step)
    stored = cache[key]
    if stored is not None:
        return stored[info.name]
    return summarize(rc.view.read_bits(kind, step, info.name), info.dtype)


class _Engine:
    def __init__(self, ref: StoreCatalog, cand: StoreCatalog, oracle: StoreCatalog | None, tolerances: Tolerances,
                 equal_nan: bool, oracle_factor: float | None, trust_index: bool = True):
        self.ref, self.cand, self.oracle = ref, cand, oracle
        self.trust_index = trust_index  # hash-decided objects not read back (diff(trust_index=))
        self.tolerances = tolerances
        self.equal_nan = equal_nan
        self.oracle_factor = oracle_factor if oracle is not None else None
        self._tol_cache: dict[tuple[str, str, int | None], Tolerance] = {}
        self.reductions = ReductionLengths(ref, cand)  # each tensor's reduction length, for its norm bound
        self._local = threading.local()  # each worker thread reuses its own read buffers

    def tol(self, kind: str, dtype: str, tensor: str) -> Tolerance:
        red = self.reductions.of(kind, tensor)
        key = (kind, dtype, red.n if red is not None else None)
        t = self._tol_cache.get(key)
        if t is None:
            t = self._tol_cache[key] = self.tolerances.resolve(*key)
        return t

    def new_acc(self, kind: str, dtype: str, tensor: str) -> Callable[[], MetricsAccumulator]:
        tol = self.tol(kind, dtype, tensor)
        return lambda: MetricsAccumulator(tol.rtol, tol.atol, self.equal_nan, self.oracle_factor, tol.rel_l2, tol.elementwise)

    def sharded_plans(self, kp: KindPair, step: int, skip: frozenset) -> dict[str, "pieces.TensorPlan"]:
        """The tensors of a (rank pair, kind, step) compared region by region from their objects
        (compare/pieces.py) instead of through the packed-row units: those sharded on some side,
        and every tensor where all sides are format 2 stores (one read per object, hashed as it is
        compared, and a pair of objects that several rank pairs share compared once)."""
        views = [self.ref.ranks[kp.ref_rank].view, self.cand.ranks[kp.rank].view]
        if self.oracle is not None:
            views.append(self.oracle.ranks[kp.oracle_rank].view)
        objects = all(v.saves_pieces for v in views)
        out = {}
        for t in kp.tensors:
            infos = (t.ref, t.cand, t.oracle)[:len(views)]
            if t.name in skip or not (objects or pieces.is_sharded(infos)):
                continue
            out[t.name] = pieces.plan_tensor(kp.kind, step, list(zip(views, infos)))
        return out

    def _sides(self, p: KindPair) -> list[tuple[str, StoreCatalog, Callable]]:
        """(side, its rank's catalog entry, the TensorPair's info of that side) of a rank pair."""
        sides = [("ref", self.ref.ranks[p.ref_rank], lambda t: t.ref),
                 ("cand", self.cand.ranks[p.rank], lambda t: t.cand)]
        if self.oracle is not None:
            sides.append(("oracle", self.oracle.ranks[p.oracle_rank], lambda t: t.oracle))
        return sides

    def _readers(self, u: _Unit) -> list[SegmentReader]:
        """Each side's reader of the unit's segments (its own tensors' names), ref first."""
        out = []
        try:
            for _, rc, info_of in self._sides(u.pair):
                out.append(SegmentReader(rc.view, u.pair.kind, u.step,
                                         [(info_of(sg.tensor).name, sg.start, sg.stop) for sg in u.segments]))
        except BaseException:
            for r in out:
                r.close()
            raise
        return out

    def hint_unit(self, u: _Unit) -> None:
        """Start reading a unit's bytes from disk in the background (compare/readahead.py)."""
        for r in self._readers(u):
            try:
                r.prefetch()
            finally:
                r.close()

    def run_unit(self, u: _Unit) -> tuple[list[tuple[str, int, MetricsAccumulator]], int]:
        kind = u.pair.kind
        sides = [side for side, _, _ in self._sides(u.pair)]
        buffers = self._local.__dict__.setdefault("buffers", Buffers())
        accs = []  # one per segment, in segment order
        for sg in u.segments:
            tol = self.tol(kind, sg.tensor.dtype, sg.tensor.name)
            accs.append(MetricsAccumulator(tol.rtol, tol.atol, self.equal_nan, self.oracle_factor, tol.rel_l2, tol.elementwise))
        nbytes = 0
        readers = self._readers(u)
        try:
            for r in readers:
                r.prefetch()  # the disk reads ahead while the first tensors are compared
            for batch in _batches(u.segments, readers):
                n = sum(t - f for _, f, t in batch)
                sg0, f0, _ = batch[0]
                data = []
                for side, reader, info in zip(sides, readers, (sg0.tensor.ref, sg0.tensor.cand, sg0.tensor.oracle)):
                    block = reader.read(sg0.index, f0, n, buffers.get(side, reader.dtype(sg0.index), n))
                    nbytes += block.nbytes
                    data.append((block, info.dtype))
                pos = 0
                for sg, f, t in batch:
                    k = t - f
                    vals = [to_numpy_values(block[pos : pos + k], dtype) for block, dtype in data]
                    accs[sg.index].update(vals[0], vals[1], vals[2] if len(vals) > 2 else None, offset=f)
                    pos += k
        finally:
            for r in readers:
                r.close()
        return [(sg.tensor.name, sg.start, acc) for sg, acc in zip(u.segments, accs)], nbytes


def _resolve_options(rtol, atol, tol, exact, config, tolerances, equal_nan, oracle_factor, rel_l2=None):
    if tolerances is None:
        if isinstance(tol, dict):
            kinds = {k: tuple(v) for k, v in tol.items()}
        else:  # ["KIND=RTOL,ATOL", ...] as given on the command line
            kinds = dict(parse_tol_option(item) for item in tol or ())
        for k, v in kinds.items():
            if len(v) not in (2, 3):
                raise UsageError(f"tolerance of {k}: expected (rtol, atol) or (rtol, atol, rel_l2), not {v!r}")
        cfg = load_config(config) if config else {"tolerances": {}}
        tolerances = Tolerances(rtol=rtol, atol=atol, kinds=kinds, exact=exact, rel_l2=rel_l2, **cfg["tolerances"])
        if equal_nan is None:
            equal_nan = cfg.get("equal_nan", False)
        if oracle_factor is None:
            oracle_factor = cfg.get("oracle_factor")
    if oracle_factor is None:
        oracle_factor = DEFAULT_ORACLE_FACTOR
    if not (isinstance(oracle_factor, (int, float)) and oracle_factor >= 0 and math.isfinite(oracle_factor)):
        raise UsageError(f"--oracle-factor must be a finite, non-negative number, not {oracle_factor!r}")
    return tolerances, bool(equal_nan), float(oracle_factor)


def diff(ref, cand, options: DiffOptions | None = None, **keywords) -> DiffReport:
    """Compare two stores of the same job (a reference and a candidate); return a DiffReport.

    options: a DiffOptions (compare/options.py); keywords: its fields, over `options` (or the defaults).

    ref, cand, oracle: store paths or opened RunStores. align: "rank" (default), "coords" or
    "global". Tolerances: `rtol`/`atol` (elementwise) and `rel_l2` (the norm rule's bound) for
    every kind, `tol` per kind ({"loss": (rtol, atol)} or (rtol, atol, rel_l2), or
    ["loss=1e-4,1e-6", ...]), `config` a TOML file, `exact` for exact equality; or a ready
    `Tolerances`. Unset values fall back to the per-dtype defaults (docs/DIFF.md). `equal_nan`
    counts NaNs on both sides as equal. `kinds` limits the kinds compared. `allow_missing`
    compares the common part when the stores differ in structure (otherwise the report has
    status "error" and nothing is compared). `fail_fast` stops after the first violating step.
    `oracle`: a float64 recording of the same job for the three-way verdict, with `oracle_factor`.
    `details`: "violations" keeps only violating results per tensor, "all" keeps every one
    (summaries per step and kind are always complete). `progress(bytes_done, bytes_total)` is
    called as data is compared. `workers` > 1 runs the comparison on a local Dask cluster of that
    many processes, `scheduler` ("tcp://host:8786") on an existing one (tracekit.compare.distributed);
    the report is the same as in one process. `trust_index` (format 2; the default): tensors whose
    content hashes are equal on both sides are decided from the two indexes alone, their objects not
    read (identical stores then diff at metadata speed; the report counts them, and damage in those
    bytes is `tracekit verify`'s to find). False reads those objects back and checks them against
    their hashes too, so damage in either store is a StoreError. Bytes that are read are always
    checked. `precision`: "auto" (default) derives the tolerance defaults from the lowest precision
    either run's recorded precision context computed in (compare/precision.py); "bf16", "fp16",
    "tf32" or "fp32" sets it. `structure` (default on): fit each step's errors against a scale, a
    sign flip and a shift, and look for stale or swapped values, one rank only and NaN/Inf patterns
    (compare/signatures.py); a strongly structured error is a violation even inside the bounds.
    Raises StoreError/UsageError (one-line messages) on unusable input.
    """
    t0 = time.perf_counter()
    o = dataclasses.replace(options or DiffOptions(), **keywords)
    align, kinds, oracle, details, fail_fast, allow_missing = o.align, o.kinds, o.oracle, o.details, o.fail_fast, o.allow_missing
    jobs, progress, workers, scheduler, trust_index = o.jobs, o.progress, o.workers, o.scheduler, o.trust_index
    precision, equal_nan, oracle_factor, tolerances = o.precision, o.equal_nan, o.oracle_factor, o.tolerances
    if details not in DETAILS:
        raise UsageError(f"details must be one of {', '.join(DETAILS)}, not {details!r}")
    tolerances, equal_nan, oracle_factor = _resolve_options(o.rtol, o.atol, o.tol, o.exact, o.config, tolerances, equal_nan,
                                                            oracle_factor, o.rel_l2)
    refc = load_catalog(ref)
    candc = load_catalog(cand, share_with=refc)  # one model and layout: equal indexes, parsed once
    orac = load_catalog(oracle, share_with=refc) if oracle is not None else None
    _check_tolerance_kinds(tolerances, refc, candc)
    rule = derive_precision(refc, candc, precision)
    tolerances = dataclasses.replace(tolerances, compute=rule.compute)
    plan = alignment.plan(refc, candc, orac, align, kinds)
    options = {"align": align, "exact": tolerances.exact, "equal_nan": equal_nan, "allow_missing": allow_missing,
               "fail_fast": fail_fast, "oracle_factor": oracle_factor if orac is not None else None,
               "kinds": kinds, "details": details, "trust_index": bool(trust_index), "precision": precision,
               "structure": bool(o.structure)}
    report = DiffReport(refc.describe(), candc.describe(), orac.describe() if orac else None, align, options,
                        structural=plan.structural, not_comparable=plan.not_comparable, ranks=plan.ranks,
                        mixed_dtypes=plan.mixed_dtypes)
    engine = _Engine(refc, candc, orac, tolerances, equal_nan, oracle_factor, trust_index=bool(trust_index))
    report.tolerances = _applied_tolerances(plan, engine)
    report.precision = rule.to_dict()
    if not report.usable:
        report.seconds = time.perf_counter() - t0
        return report

    steps = sorted({s for kp in plan.pairs for s in kp.steps})
    # Decided by content hash (format 2), before any data is read: these bytes are never read.
    same = {(kp.key, s): _identical_by_hash(kp, s, refc.ranks[kp.ref_rank], candc.ranks[kp.rank], orac is not None)
            for kp in plan.pairs if kp.tensors for s in kp.steps}
    # Where a side kept no bytes (--full): compared by summaries, never read.
    by_summary = {(kp.key, s): _by_summaries(kp, same[(kp.key, s)]) for kp in plan.pairs if kp.tensors for s in kp.steps}
    unread = {k: v | by_summary[k] for k, v in same.items()}

    def pair_bytes(t) -> int:
        return t.ref.nbytes + t.cand.nbytes + (t.oracle.nbytes if t.oracle else 0)

    distributed = scheduler is not None or (workers is not None and workers > 1)
    # Hash-equal tensors are read by no one: here they are skipped below, Dask workers skip the
    # same ones (step_parts), so the report and its byte counts are the same either way.
    total = sum(pair_bytes(t) for kp in plan.pairs if kp.tensors for s in kp.steps
                for t in kp.tensors if t.name not in unread[(kp.key, s)])
    report.bytes_identical_by_hash = sum(
        pair_bytes(t) for kp in plan.pairs if kp.tensors for s in kp.steps for t in kp.tensors if t.name in same[(kp.key, s)])
    done = 0

    def tick(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(done, total)

    executor: Executor
    if distributed:
        from tracekit.compare.distributed import DaskExecutor, DiffSpec

        spec = DiffSpec.of(refc, candc, orac, align, kinds, tolerances, equal_nan, oracle_factor, engine.trust_index)
        executor = DaskExecutor(spec, worker_task, workers, scheduler)
    else:
        executor = ThreadExecutor(engine, jobs, same, unread)
    stepwise = executor.compare_steps(plan, steps, tick)
    try:
        for step, partial in stepwise:
            pairs = [kp for kp in plan.pairs if step in kp.steps and kp.tensors]
            skip = {kp.key: same[(kp.key, step)] for kp in pairs}
            summ = {kp.key: by_summary[(kp.key, step)] for kp in pairs}
            results = _step_results(step, pairs, partial, engine, skip, summ)
            report.identical_by_hash += sum(len(v) for v in skip.values())
            report.compared_by_summaries += sum(len(v) for v in summ.values())
            _add_step(report, step, results, details, matcher(engine, pairs, align, _values))
            if fail_fast and any(not r.passed for r in results):
                report.stopped_early = step != steps[-1]
                break
    finally:
        stepwise.close()  # stops work on the steps a fail-fast break left
    report.bytes_compared = done
    report.first_divergence = _first_divergence(report)
    report.drift = drift_note(report, refc, candc)
    report.traces = compare_store_traces(refc, candc, _trace_rank_pairs(plan, candc, refc), tolerances)
    report.seconds = time.perf_counter() - t0
    return report


def step_parts(engine: "_Engine", kp: KindPair, step: int) -> tuple[list[tuple[str, int, MetricsAccumulator]], int]:
    """Every unit of one (rank pair, kind, step), compared one after the other: [(tensor, start, metrics)], bytes read."""
    parts, nbytes = [], 0
    ref_rc, cand_rc = engine.ref.ranks[kp.ref_rank], engine.cand.ranks[kp.rank]
    skip = _identical_by_hash(kp, step, ref_rc, cand_rc, engine.oracle is not None)
    if not engine.trust_index:
        _check_hash_decided(kp, step, ref_rc, cand_rc, skip)
    unread = skip | _by_summaries(kp, skip)
    plans = engine.sharded_plans(kp, step, unread)
    for u in _units(kp, step, ref_rc, unread | set(plans)):
        p, n = engine.run_unit(u)
        parts.extend(p)
        nbytes += n
    for t in kp.tensors:
        plan = plans.get(t.name)
        if plan is not None:
            new_acc = engine.new_acc(kp.kind, t.dtype, t.name)
            if plan.shared:
                accs = [pieces.compare_shared_region(plan, i, new_acc) for i in range(len(plan.regions))]
            else:
                accs = pieces.compare_regions(plan, new_acc)
            parts.append((t.name, 0, pieces.merged(accs, new_acc, plan.owners)))
            nbytes += plan.nbytes
    return parts, nbytes


class ThreadExecutor:
    """The Executor (compare/executors.py) of this process: a thread pool of `jobs` threads; the
    tensors in unread[(pair.key, step)] (equal content hashes, same[...], or no bytes) are not read."""

    def __init__(self, engine: "_Engine", jobs: int | None, same: dict, unread: dict):
        self.engine, self.jobs, self.same, self.unread = engine, jobs, same, unread

    def compare_steps(self, plan, steps: list[int], tick):
        return _compare_steps_here(self.engine, plan, steps, self.jobs, tick, self.same, self.unread)


_WORKER_STATE: dict[str, tuple] = {}  # per Dask worker process: spec token -> (engine, plan), the last few diffs


def _worker_state(spec):
    state = _WORKER_STATE.get(spec.token)
    if state is None:
        refc, candc = load_catalog(spec.ref), load_catalog(spec.cand)
        orac = load_catalog(spec.oracle) if spec.oracle is not None else None
        plan = alignment.plan(refc, candc, orac, spec.align, spec.kinds)
        state = (_Engine(refc, candc, orac, spec.tolerances, spec.equal_nan, spec.oracle_factor,
                         trust_index=spec.trust_index), plan)
        while len(_WORKER_STATE) >= 4:
            _WORKER_STATE.pop(next(iter(_WORKER_STATE)))
        _WORKER_STATE[spec.token] = state
    return state


def worker_task(spec, pair_index: int, steps: list[int]) -> dict[int, tuple[list, int]]:
    """On a Dask worker (compare/distributed.py's DaskExecutor runs it): {step: ([(tensor, start,
    metrics)], bytes read)} of one pair over `steps`, the engine rebuilt from the DiffSpec `spec`."""
    engine, plan = _worker_state(spec)
    kp = plan.pairs[pair_index]
    return {step: step_parts(engine, kp, step) for step in steps if step in kp.steps}


def _compare_steps_here(engine: "_Engine", plan, steps: list[int], jobs: int | None, tick, same: dict, unread: dict):
    """In this process, on a thread pool: yields (step, {(pair.key, tensor): [(start, metrics)]}) in step order;
    the tensors in unread[(pair.key, step)] (equal content hashes, same[...], or no bytes) are not read."""
    if jobs is None:
        jobs = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    ahead = Readahead()
    sides = 2 if engine.oracle is None else 3

    def prepare(step: int):
        """A step's rank pairs, sharded-tensor plans and packed-row units, registered with the
        read-ahead in the order they will be submitted."""
        pairs = [kp for kp in plan.pairs if step in kp.steps and kp.tensors]
        # sharded tensors: region by region; a region pair that several rank pairs share is compared once
        plans = {kp.key: engine.sharded_plans(kp, step, unread[(kp.key, step)]) for kp in pairs}
        units = [u for kp in pairs for u in _units(kp, step, engine.ref.ranks[kp.ref_rank],
                                                     unread[(kp.key, step)] | set(plans[kp.key]))]
        for i, u in enumerate(units):
            ahead.add(("unit", step, i), u.nbytes(sides), lambda u=u: engine.hint_unit(u))
        for kp in pairs:
            for tp in plans[kp.key].values():
                if tp.shared:
                    for i in range(len(tp.regions)):
                        ahead.add(("region", step, tp.key(i)), tp.region_nbytes(i), lambda tp=tp, i=i: tp.hint(i))
        return pairs, plans, units

    with ThreadPoolExecutor(max_workers=max(1, int(jobs)), thread_name_prefix="tracekit-diff") as pool:
        prepared = prepare(steps[0]) if steps else None
        for n_step, step in enumerate(steps):
            if isinstance(prepared, Exception):
                raise prepared  # the step's plan failed (a damaged index): reported in step order
            pairs, plans, units = prepared
            futures = [pool.submit(ahead.run, ("unit", step, i), engine.run_unit, u) for i, u in enumerate(units)]
            regions: dict[tuple, object] = {}
            wholes: dict[tuple[int, str], object] = {}
            for kp in pairs:
                for t in kp.tensors:
                    tp = plans[kp.key].get(t.name)
                    if tp is None:
                        continue
                    new_acc = engine.new_acc(kp.kind, t.dtype, t.name)
                    if tp.shared:
                        for i in range(len(tp.regions)):
                            if tp.key(i) not in regions:
                                regions[tp.key(i)] = pool.submit(ahead.run, ("region", step, tp.key(i)),
                                                                 pieces.compare_shared_region, tp, i, new_acc)
                    else:
                        wholes[(kp.key, t.name)] = pool.submit(pieces.compare_regions, tp, new_acc)
            if n_step + 1 < len(steps):
                # the next step's comparisons are known now, so the disk can read into them while
                # this step's last ones finish (its results are waited for below)
                try:
                    prepared = prepare(steps[n_step + 1])
                except Exception as e:  # raised when that step comes: an earlier one's problem goes first
                    prepared = e
            checks = [pool.submit(_check_hash_decided, kp, step, engine.ref.ranks[kp.ref_rank],
                                  engine.cand.ranks[kp.rank], same[(kp.key, step)])
                      for kp in pairs if same[(kp.key, step)] and not engine.trust_index]
            partial: dict[tuple[int, str], list[tuple[int, MetricsAccumulator]]] = {}  # (pair, tensor) -> parts
            try:
                for u, f in zip(units, futures):
                    parts, nbytes = f.result()
                    for name, start, acc in parts:
                        partial.setdefault((u.pair.key, name), []).append((start, acc))
                    tick(nbytes)
                for kp in pairs:
                    for t in kp.tensors:
                        tp = plans[kp.key].get(t.name)
                        if tp is None:
                            continue
                        if tp.shared:
                            accs = [regions[tp.key(i)].result() for i in range(len(tp.regions))]
                            pieces.check_entries(tp)  # this pair's own index entries (flags)
                        else:
                            accs = wholes[(kp.key, t.name)].result()
                        partial[(kp.key, t.name)] = [(0, pieces.merged(accs, engine.new_acc(kp.kind, t.dtype, t.name),
                                                                       tp.owners))]
                        tick(tp.nbytes)
                for f in checks:
                    f.result()
            except BaseException:
                for f in futures + checks + list(regions.values()) + list(wholes.values()):
                    f.cancel()
                raise
            yield step, partial


def _trace_rank_pairs(plan, cand: StoreCatalog, ref: StoreCatalog) -> dict[int, int]:
    """Traces are of what a rank computed on its own data: pair ranks as the outputs were paired
    (same data shard), else rank with rank."""
    pairs = {kp.rank: kp.ref_rank for kp in plan.pairs if kp.kind == "outputs"}
    return pairs or {r: r for r in cand.ranks if r in ref.ranks}


def _check_tolerance_kinds(tolerances: Tolerances, *cats: StoreCatalog) -> None:
    """A tolerance for a kind no store recorded is a typo: applying to nothing, it would let a
    tightened gate pass unnoticed."""
    present = {k for cat in cats for rc in cat.ranks.values() for k in rc.kinds}
    recorded = ", ".join(sorted(present, key=lambda k: (kind_order(k), k))) or "none"
    named = [f"--tol {k}" for k in tolerances.kinds if k not in present]
    named += [f"config [kind.{k}]" for k in tolerances.config_kinds if k not in present]
    if named:
        raise UsageError(f"{', '.join(named)}: no store recorded this kind (recorded: {recorded})")


def _applied_tolerances(plan, engine) -> list[dict]:
    seen = {}
    for kp in plan.pairs:
        for t in kp.tensors:
            tol = engine.tol(kp.kind, t.dtype, t.name)
            key = (kp.kind, t.dtype, tol.terms)
            if key not in seen:
                red = engine.reductions.of(kp.kind, t.name)
                seen[key] = {"kind": kp.kind, "dtype": t.dtype, "rtol": tol.rtol, "atol": tol.atol,
                             "rel_l2": tol.rel_l2, "source": tol.source,
                             **({} if tol.elementwise else {"elementwise": False}),
                             **({} if red is None else {"terms": red.n, "terms_from": red.why})}
    return sorted(seen.values(), key=lambda d: (kind_order(d["kind"]), d["kind"], d["dtype"]))


def _step_results(step, pairs, partial, engine, same, summ) -> list[TensorResult]:
    results = []
    cache: dict = {}  # each side's summaries of a (rank, kind) at this step, read once
    for kp in sorted(pairs, key=lambda kp: (kind_order(kp.kind), kp.kind, kp.rank)):
        # a summary row is part of the store: damage to it is reported even where bytes decided
        engine.ref.ranks[kp.ref_rank].view.check_summaries(kp.kind, step)
        engine.cand.ranks[kp.rank].view.check_summaries(kp.kind, step)
        by_hash, by_summaries = same[kp.key], summ[kp.key]
        for t in kp.tensors:
            tol = engine.tol(kp.kind, t.dtype, t.name)
            if t.name in by_hash:
                results.append(TensorResult(step, kp.kind, kp.rank, kp.ref_rank, t.name, t.dtype, t.ref.shape,
                                            identical_metrics(t.ref.numel, tol.rtol, tol.atol, tol.rel_l2), tol.source, kp.oracle_rank,
                                            compared_by="hash"))
                continue
            if t.name in by_summaries:
                rs = _summary("ref", engine.ref.ranks[kp.ref_rank], kp.kind, step, t.ref, cache)
                cs = _summary("cand", engine.cand.ranks[kp.rank], kp.kind, step, t.cand, cache)
                results.append(TensorResult(step, kp.kind, kp.rank, kp.ref_rank, t.name, t.dtype, t.ref.shape,
                                            compare_summaries(rs, cs, t.ref.shape, tol.rtol, tol.atol, engine.equal_nan),
                                            tol.source, kp.oracle_rank, compared_by="summaries"))
                continue
            parts = sorted(partial.get((kp.key, t.name), []), key=lambda x: x[0])
            if not parts:
                if t.ref.numel:
                    continue
                # an empty tensor has no chunk to read, yet it was compared (shapes and dtypes agree)
                parts = [(0, MetricsAccumulator(tol.rtol, tol.atol, engine.equal_nan, engine.oracle_factor, tol.rel_l2, tol.elementwise))]
            acc = parts[0][1]
            for _, later in parts[1:]:
                acc.merge(later)
            m = acc.result(t.ref.shape)
            results.append(TensorResult(step, kp.kind, kp.rank, kp.ref_rank, t.name, t.dtype, t.ref.shape,
                                        m, tol.source, kp.oracle_rank,
                                        layout=_layout(engine, kp, step, t, m) if rows.wanted(t.ref.shape, m.passed, m.nonfinite) else None))
    return results


def _layout(engine: "_Engine", kp: KindPair, step: int, t, m) -> dict | None:
    """A failing small tensor's values read again: where its error lies (compare/rows.py)."""
    try:
        ref = _values(engine.ref.ranks[kp.ref_rank].view, kp.kind, step, t.ref)
        cand = _values(engine.cand.ranks[kp.rank].view, kp.kind, step, t.cand)
    except (StoreError, LookupError, ValueError, TypeError, AttributeError):
        return None  # a store without such objects (format 1), or damage the comparison reports
    return rows.layout(ref, cand, m.rtol, m.atol)


def _values(view, kind: str, step: int, side) -> np.ndarray:
    """One side's whole tensor as numpy values (its shards assembled)."""
    if side.shard is None and not view.saves_pieces:
        raise LookupError("a store without saved pieces (format 1): values are not read again")
    return to_numpy_values(view.read_region(kind, step, side.name), side.dtype)


def _add_shapes(report: DiffReport, step: int, by_kind: dict[str, list[TensorResult]], match=None) -> None:
    """The structured-error fits and patterns of the step: a signature is a violation."""
    compute = (report.precision or {}).get("compute")
    for kind, rs in by_kind.items():
        biases: list = []
        sigs, max_z, differs = step_shapes(step, kind, rs, match, structure.bias_floor(kind, compute), biases)
        shape = report.shapes.setdefault(kind, structure.KindShape(kind))
        for bias in biases:
            shape.note_bias(bias)
        shape.max_z = max(shape.max_z, max_z)
        shape.differs |= differs
        if sigs:
            shape.signatures.extend(sigs)
            report.signatures.extend(sigs)
            structure.first_steps(shape.signatures)


def _add_step(report: DiffReport, step: int, results: list[TensorResult], details: str, match=None) -> None:
    report.steps.append(step)
    by_kind: dict[str, list[TensorResult]] = {}
    for r in results:
        by_kind.setdefault(r.kind, []).append(r)
    if report.options.get("structure"):
        _add_shapes(report, step, by_kind, match)
    for kind, rs in by_kind.items():
        # hash-decided tensors of one size and tolerance share one metrics object: each distinct
        # one is looked at once, with how many results hold it
        held: dict[int, list] = {}
        for r in rs:
            seen = held.get(id(r.metrics))
            if seen is None:
                held[id(r.metrics)] = [r.metrics, 1]
            else:
                seen[1] += 1
        ms = [m for m, _ in held.values()]

        def total(of) -> int:
            return sum(of(m) * n for m, n in held.values())

        margins = {key: -1.0 if m.margin is None else m.margin for key, (m, _) in held.items()}
        worst = max(rs, key=lambda r: margins[id(r.metrics)])  # the first of the worst, in result order
        report.summary.append(KindSummary(
            step, kind, len({r.tensor for r in rs}), len({r.rank for r in rs}), len(rs),
            total(lambda m: not m.passed), total(lambda m: m.violations), total(lambda m: m.nonfinite),
            total(lambda m: m.numel),
            _over(max, ms, "max_abs_err"), _over(max, ms, "max_rel_err"), _over(min, ms, "cosine"),
            _over(max, ms, "rel_l2_err"), worst.metrics.margin,
            None if worst.metrics.margin is None else worst.metrics.margin_rule,
            None if worst.metrics.margin is None else (worst.rank, worst.tensor),
            total(lambda m: m.counts.ref_nan + m.counts.ref_inf), total(lambda m: m.counts.cand_nan + m.counts.cand_inf),
            total(lambda m: m.norm_failed), *_nonfinite_once(rs)))
    report.results.extend(r for r in results if details == "all" or not r.passed)
    loss = by_kind.get("loss")
    if loss:
        scalars = [r for r in loss if r.metrics.numel == 1 and r.metrics.worst is not None]
        if scalars:
            first = min(scalars, key=lambda r: (r.tensor != "loss", r.rank))
            w = first.metrics.worst
            report.loss_table.append(LossRow(step, first.tensor, first.rank, w.ref, w.cand, all(r.passed for r in loss)))


def _nonfinite_once(rs: list[TensorResult]) -> tuple[int, tuple[int, ...]]:
    """The candidate's NaN + Inf elements with each tensor held alike by several ranks counted
    once, and those ranks. Alike: every metric of the rank pair's result equal (an FSDP gradient
    each rank assembles from the same shards, a DDP gradient all-reduced): a NaN written on one
    rank and gathered by all is one NaN that spread, not one per rank."""
    groups: dict[tuple, list[int]] = {}
    count: dict[tuple, int] = {}
    for r in rs:
        c = r.metrics.counts
        n = (c.cand_nan + c.cand_inf) if c is not None else 0
        if not n:
            continue
        key = (r.tensor, r.alike_key())
        groups.setdefault(key, []).append(r.rank)
        count[key] = n
    alike = sorted({rank for ranks in groups.values() if len(ranks) > 1 for rank in ranks})
    return sum(count.values()), tuple(alike)


def _over(fn, ms, name):
    """fn (max/min) of a metric over tensors, skipping those with nothing comparable (None)."""
    vals = [getattr(m, name) for m in ms if getattr(m, name) is not None]
    return fn(vals) if vals else None


def _first_divergence(report: DiffReport) -> Divergence | None:
    bad = report.violations
    first_sig = min(report.systematic_only, key=lambda s: (s.step, kind_order(s.kind), s.kind), default=None)
    if not bad:
        if first_sig is None:
            return None
        ex = first_sig.example
        return Divergence(first_sig.step, first_sig.kind, ex.tensor, [ex.tensor], first_sig.ranks, ex.rank, ex.ref_rank,
                          ex.metrics.worst, ex.metrics, ex.compared_by, first_sig)
    step = min(r.step for r in bad)
    kind = min((r.kind for r in bad if r.step == step), key=lambda k: (kind_order(k), k))
    if first_sig is not None and (first_sig.step, kind_order(first_sig.kind)) < (step, kind_order(kind)):
        ex = first_sig.example
        return Divergence(first_sig.step, first_sig.kind, ex.tensor, [ex.tensor], first_sig.ranks, ex.rank, ex.ref_rank,
                          ex.metrics.worst, ex.metrics, ex.compared_by, first_sig)
    rs = [r for r in bad if r.step == step and r.kind == kind]  # already in recorded order per rank
    names = list(dict.fromkeys(r.tensor for r in sorted(rs, key=lambda r: r.rank)))
    first = names[0]

    def badness(r: TensorResult):
        w = r.metrics.worst
        err = w.abs_err if w and not math.isnan(w.abs_err) else math.inf
        return (r.metrics.nonfinite > 0, r.metrics.margin or 0.0, err)

    worst = max((r for r in rs if r.tensor == first), key=badness)
    sig = next((s for s in report.signatures if s.step == step and s.kind == kind), None)
    return Divergence(step, kind, first, names, sorted({r.rank for r in rs}), worst.rank, worst.ref_rank,
                      worst.metrics.worst, worst.metrics, worst.compared_by, sig)
