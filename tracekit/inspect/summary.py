"""What a store holds, as one plain dict: run metadata, ranks, steps, tensors, bytes on disk."""

from __future__ import annotations

from tracekit.inspect.facts import common, differences, rank_facts
from tracekit.store import open_store
from tracekit.store.location import canonical
from tracekit.store.status import RECORDING_FAILED
from tracekit.store.consistency import missing_ranks
from tracekit.store.derived_loss import loss_derivation_line
from tracekit.store.dtypes import storage_dtype, to_numpy_values


def _kinds(store) -> list[dict]:
    """Per kind: the union of steps, and each tensor with its dtype and shape (per rank if they differ)."""
    out: dict[str, dict] = {}
    for r in store.ranks:
        view = store.rank(r)
        for kind in view.kinds:
            entry = out.setdefault(kind, {"kind": kind, "steps": set(), "tensors": {}})
            entry["steps"].update(view.steps(kind))
            for t in view.tensors(kind):
                e = entry["tensors"].setdefault(
                    t.name, {"name": t.name, "dtype": t.dtype, "opens_as": opens_as(t.dtype),
                             "shape": list(t.shape), "numel": t.numel,
                             "bytes_per_step": t.nbytes, "ranks": 0, "shapes_differ": False})
                e["ranks"] += 1
                if list(t.shape) != e["shape"] or t.dtype != e["dtype"]:
                    e["shapes_differ"] = True
    result = []
    for entry in out.values():
        result.append({"kind": entry["kind"], "steps": sorted(entry["steps"]), "tensors": list(entry["tensors"].values())})
    return result


def opens_as(logical: str) -> str:
    """The dtype a reader gives a tensor recorded as `logical` (tracekit.open, RankView.read):
    the store's own decoding, so bfloat16 and float8 say float32."""
    import numpy as np

    try:
        return str(to_numpy_values(np.zeros(1, storage_dtype(logical)), logical).dtype)
    except (TypeError, ValueError, KeyError):
        return logical


def trace_steps_held(store, damage: list | None = None) -> dict[str, list[int]]:
    """Per trace level, the steps any rank holds a trace of (tracekit record --trace), read from
    the step lists' metadata only (store/traces.listed_trace_steps). Damaged trace metadata is a
    StoreError, or, given `damage`, appended there as {"rank", "problem"} and that rank skipped."""
    from tracekit.errors import StoreError
    from tracekit.store.kinds import TRACE_LEVELS as LEVELS

    out: dict[str, set[int]] = {}
    for r in store.ranks:
        view = store.rank(r)
        if not view.traced:
            continue
        for level in LEVELS:
            try:
                steps = view.trace_steps(level, listed_only=True)
            except StoreError as e:
                if damage is None:
                    raise
                damage.append({"rank": r, "problem": str(e)})
                break
            if steps:
                out.setdefault(level, set()).update(steps)
    return {level: sorted(steps) for level, steps in out.items()}


def run_metadata(store) -> dict:
    """The run's facts, flat: root metadata over rank 0's `run`, without the per-rank completion
    table the launcher adds at the end (`ranks`, shown per rank instead), plus the ops any rank ran
    as CPU fallbacks (`fallback_ops`, the union over ranks, when a rank reported them)."""
    info = store.run_facts()
    fallback: list[str] = []
    reported = False
    for r in store.ranks:
        ops = store.rank(r).meta.fallback_ops
        if ops is not None:
            reported = True
            fallback += [op for op in ops if op not in fallback]
    if reported:
        info["fallback_ops"] = fallback
    return info


def coverage_summary(store) -> dict | None:
    """Rank 0's coverage (the first rank that stored one) as JSON, with the ranks whose coverage
    differs from it; None when no rank stored one (older stores)."""
    found = [(r, store.rank(r).coverage) for r in store.ranks]
    found = [(r, c) for r, c in found if c is not None]
    if not found:
        return None
    first = found[0][1]
    return {**first.to_attrs(), "rank": found[0][0], "differs_on_ranks": [r for r, c in found if c != first]}


def summarize(path) -> dict:
    """Everything `tracekit show` prints; plain JSON-able values only."""
    store = open_store(path)
    facts = rank_facts(store)
    ranks = []
    rank_bytes, shared_bytes, total_bytes = store.footprint()
    for r in store.ranks:
        view = store.rank(r)
        # a step listed as completed with no data in any kind is damaged metadata: not counted as
        # recorded (shown apart, and named by `tracekit verify`)
        empty = view.empty_completed_steps()
        done = [s for s in view.completed_steps if s not in empty]
        for kind in view.kinds:  # sizes shown below come from the index: check its claims against the files
            view.check_claims(kind)
        ranks.append({
            "rank": r,
            "coords": view.meta.coords.to_attrs(),
            "status": view.status,
            "versions": facts[r]["versions"],
            "env": facts[r]["env"],
            "cause": view.cause,
            "unwritten_steps": view.unwritten_steps,  # completed by the rank, not stored (--flush-timeout)
            "unwritten_cause": view.unwritten_cause,
            "steps_completed": len(done),
            "first_step": done[0] if done else None,
            "last_step": done[-1] if done else None,
            "completed_without_data": empty,
            "kinds": view.kinds,
            "bytes": rank_bytes[r],
            "precision": ctx.to_attrs() if (ctx := view.precision) is not None else None,
        })
    trace_damage: list[dict] = []  # show names a rank whose trace step lists are damaged, and goes on
    return {
        "store": canonical(store.path),
        "finished": store.finished,  # a launcher finalized it: end time and exit status known
        # recorded through TRACEKIT_STORE, without `tracekit record`: nobody finalizes the store
        "launcherless": store.run_meta.launcherless,
        "running_ranks": [r["rank"] for r in ranks if r["status"] == "running"],
        # versions and numeric env vars equal on every rank, and the watched ones that differ
        "environment": {"common": common(facts), "differs": differences(facts)},
        "job_state": store.job_state,  # finished / recording / launcher died / no launcher
        "run": run_metadata(store),
        "world_size": len(store.ranks),
        "ranks": ranks,
        "missing_ranks": missing_ranks(store),  # listed at finalization, their groups gone: damage
        "kinds": _kinds(store),
        "coverage": coverage_summary(store),
        "loss_derivation": loss_derivation_line(store),  # zero-code: how the global loss is derived
        "traces": trace_steps_held(store, trace_damage),  # level -> steps traced (tracekit record --trace)
        "trace_damage": trace_damage,  # {rank, problem}: a rank whose trace step lists are unreadable
        "bytes_on_disk": total_bytes,
        "bytes_shared_objects": shared_bytes,
    }


def recording_summary(path) -> dict:
    """What a finished recording holds, for `tracekit record`'s closing line: ranks, completed
    steps (union over ranks), kinds, bytes on disk and each rank's status."""
    store = open_store(path)
    steps: set[int] = set()
    kinds: list[str] = []
    statuses: dict[str, int] = {}
    unwritten: dict[int, dict] = {}  # rank -> the steps it completed that its writer did not store, and why
    recording_failed: dict[int, str] = {}  # rank -> why its writer process failed to store its steps
    replayed: set[int] | None = None  # steps any rank ran from a reference's state (None: not a replay)
    for r in store.ranks:
        view = store.rank(r)
        steps.update(view.completed_steps)
        kinds += [k for k in view.kinds if k not in kinds]
        statuses[view.status] = statuses.get(view.status, 0) + 1
        if view.meta.replayed_steps is not None:
            replayed = (replayed or set()) | set(view.meta.replayed_steps)
        if view.unwritten_steps:
            unwritten[r] = {"steps": view.unwritten_steps, "cause": view.unwritten_cause}
        if view.status == "failed" and (view.cause or "").startswith(RECORDING_FAILED):
            recording_failed[r] = view.cause.removeprefix(RECORDING_FAILED)
    return {"store": canonical(store.path), "ranks": len(store.ranks), "steps": sorted(steps), "kinds": kinds,
            "bytes": store.location.size_under(), "statuses": statuses, "coverage": coverage_summary(store), "unwritten": unwritten,
            "recording_failed": recording_failed,
            "loss_derivation": loss_derivation_line(store),
            "traces": trace_steps_held(store),
            "replayed_steps": sorted(replayed) if replayed is not None else None,
            "exit_status": store.run_meta.exit_status}
