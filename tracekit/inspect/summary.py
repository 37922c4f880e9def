"""What a store holds, as one plain dict: run metadata, ranks, steps, tensors, bytes on disk."""

from __future__ import annotations

from tracekit.inspect.facts import common, differences, rank_facts
from tracekit.store import open_store
from tracekit.store.location import canonical
from tracekit.store.format import RANK_PREFIX


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
                    t.name, {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "numel": t.numel,
                             "bytes_per_step": t.nbytes, "ranks": 0, "shapes_differ": False})
                e["ranks"] += 1
                if list(t.shape) != e["shape"] or t.dtype != e["dtype"]:
                    e["shapes_differ"] = True
    result = []
    for entry in out.values():
        result.append({"kind": entry["kind"], "steps": sorted(entry["steps"]), "tensors": list(entry["tensors"].values())})
    return result


def trace_steps_held(store) -> dict[str, list[int]]:
    """Per trace level, the steps any rank holds a trace of (tracekit record --trace)."""
    from tracekit.store.traces import LEVELS, trace_steps

    out: dict[str, set[int]] = {}
    for r in store.ranks:
        view = store.rank(r)
        if not view.traced:
            continue
        for level in LEVELS:
            steps = trace_steps(view.group, level)
            if steps:
                out.setdefault(level, set()).update(steps)
    return {level: sorted(steps) for level, steps in out.items()}


def run_metadata(store) -> dict:
    """The run's facts, flat: root metadata over rank 0's `run`, without the per-rank completion
    table the launcher adds at the end (`ranks`, shown per rank instead), plus the ops any rank ran
    as CPU fallbacks (`fallback_ops`, the union over ranks, when a rank reported them)."""
    info = {k: v for k, v in store.run.items() if k not in ("ranks", "run")}
    for k, v in (store.meta.get("run") or {}).items():
        info.setdefault(k, v)
    fallback: list[str] = []
    reported = False
    for r in store.ranks:
        ops = store.rank(r).attrs.get("fallback_ops")
        if ops is not None:
            reported = True
            fallback += [op for op in ops if op not in fallback]
    if reported:
        info["fallback_ops"] = fallback
    return info


def summarize(path) -> dict:
    """Everything `tracekit show` prints; plain JSON-able values only."""
    store = open_store(path)
    facts = rank_facts(store)
    ranks = []
    rank_bytes, total_bytes = store.location.sizes_under(f"{RANK_PREFIX}{r}" for r in store.ranks)
    for r in store.ranks:
        view = store.rank(r)
        done = view.completed_steps
        for kind in view.kinds:  # sizes shown below come from the index: check its claims against the files
            for key in {info.array for info in view.tensors(kind)}:
                view.array(kind, key)
        ranks.append({
            "rank": r,
            "coords": view.coords,
            "status": view.status,
            "versions": facts[r]["versions"],
            "env": facts[r]["env"],
            "cause": view.cause,
            "steps_completed": len(done),
            "first_step": done[0] if done else None,
            "last_step": done[-1] if done else None,
            "kinds": view.kinds,
            "bytes": rank_bytes[f"{RANK_PREFIX}{r}"],
        })
    return {
        "store": canonical(store.path),
        "finished": store.finished,  # a launcher finalized it: end time and exit status known
        # recorded through TRACEKIT_STORE, without `tracekit record`: nobody finalizes the store
        "launcherless": "launcher" in store.meta and store.meta["launcher"] is None,
        "running_ranks": [r["rank"] for r in ranks if r["status"] == "running"],
        # versions and numeric env vars equal on every rank, and the watched ones that differ
        "environment": {"common": common(facts), "differs": differences(facts)},
        "job_state": store.job_state,  # finished / recording / launcher died / no launcher
        "run": run_metadata(store),
        "world_size": len(store.ranks),
        "ranks": ranks,
        "kinds": _kinds(store),
        "traces": trace_steps_held(store),  # level -> steps traced (tracekit record --trace)
        "bytes_on_disk": total_bytes,
    }


def recording_summary(path) -> dict:
    """What a finished recording holds, for `tracekit record`'s closing line: ranks, completed
    steps (union over ranks), kinds, bytes on disk and each rank's status."""
    store = open_store(path)
    steps: set[int] = set()
    kinds: list[str] = []
    statuses: dict[str, int] = {}
    for r in store.ranks:
        view = store.rank(r)
        steps.update(view.completed_steps)
        kinds += [k for k in view.kinds if k not in kinds]
        statuses[view.status] = statuses.get(view.status, 0) + 1
    return {"store": canonical(store.path), "ranks": len(store.ranks), "steps": sorted(steps), "kinds": kinds,
            "bytes": store.location.size_under(), "statuses": statuses, "traces": trace_steps_held(store),
            "exit_status": store.meta.get("exit_status")}
