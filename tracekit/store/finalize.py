"""Closing a store after every rank has stopped: the run summary the launcher adds at the end."""

from __future__ import annotations

import json
import os
import warnings

import zarr

from tracekit.store.derived_loss import write_derived_losses
from tracekit.store.io import compact_metadata, replace_file
from tracekit.store.location import resolve
from tracekit.store.reader import open_store
from tracekit.store.format import ROOT_KEY
from tracekit.store.writer import now_iso, update_root_meta


@compact_metadata
def finalize_store(path, exit_status: int, worker_exits: dict[int, int] | None = None,
                   losses: dict[int, dict] | None = None, storage_options=None) -> dict:
    """Record end time, exit status and per-rank completion in the root metadata; return them.

    Per rank: its final status (a rank that never closed its recording becomes `killed` or `died`,
    see tracekit.launch.exits), a one-line cause, and its exit code where `worker_exits`
    (the launcher's {rank: exit code}, negative for a signal) knows it.
    `losses`: per rank whose writer process the launcher had to kill, what it left unstored
    ({"unwritten_steps", "unwritten_cause"}) and the rank's own word on how it ended
    ({"status", "cause"}, which that writer never stored). Each rank's `unwritten_steps` (from
    there, or listed by a writer stopped in time) goes into the summary with its cause, so that
    completed_steps + unwritten_steps are the steps the rank trained.
    Only safe once no rank writes any more (the launcher calls it after its command exited).
    """
    from tracekit.store.status import final_rank_status

    location = resolve(path, storage_options)
    store = open_store(location)
    # the global loss of zero-code ranks, from their local losses (no collective ran in the job)
    no_loss = write_derived_losses(location, store)
    ranks = {}
    run: dict = {}
    exits = worker_exits or {}
    for r in store.ranks:
        view = store.rank(r)
        own, own_cause = view.attrs.get("status", "unknown"), view.attrs.get("cause")
        loss = (losses or {}).get(r) or {}
        if own == "running" and loss.get("status"):  # the rank ended its training; its killed writer never said so
            own, own_cause = loss["status"], loss.get("cause")
        status, cause = final_rank_status(own, own_cause, exits.get(r))
        ranks[str(r)] = {"completed_steps": view.completed_steps, "status": status, "cause": cause,
                         "exit_code": exits.get(r), **_unwritten(view, loss)}
        if r in no_loss:
            ranks[str(r)]["loss_not_derived"] = no_loss[r]
        if not run:
            run = dict(view.attrs.get("run", {}))
    summary = {
        "end_time": now_iso(),
        "exit_status": exit_status,
        "world_size": run.get("world_size", len(ranks) or None),
        "run": run,
        "ranks": ranks,
    }
    update_root_meta(location, **summary)
    try:
        # Consolidated metadata lets plain xarray/zarr open the finished store in one read.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(location.zarr_store())
    except Exception:  # an optimisation only; the store is complete without it
        pass
    return summary


def _unwritten(view, loss: dict) -> dict:
    """{"unwritten_steps", "unwritten_cause"} of a rank whose writer was stopped or killed ({} if none):
    the steps spooled but not stored, less any the writer completed before it died."""
    steps = loss.get("unwritten_steps", view.attrs.get("unwritten_steps"))
    if not isinstance(steps, list):
        return {}
    done = set(view.completed_steps)
    cause = loss.get("unwritten_cause") or view.attrs.get("unwritten_cause")
    return {"unwritten_steps": sorted({s for s in steps if isinstance(s, int)} - done),
            "unwritten_cause": cause if isinstance(cause, str) else None}


@compact_metadata
def mark_writers_outlived(path: str, exit_status: int) -> None:
    """The launcher gives up while ranks still write: note it, without finalizing or consolidating.

    The root gets no end_time or exit_status, so readers report it as left by a dead launcher. Written
    with an atomic rename: the ranks still running read the root once per step.
    """
    meta_file = os.path.join(path, "zarr.json")
    with open(meta_file, "rb") as f:
        doc = json.load(f)
    doc["attributes"][ROOT_KEY]["writers_outlived_launcher"] = {"command_exit_status": exit_status, "time": now_iso()}
    # unindented, as zarr writes every other document of the store (io.compact_metadata)
    replace_file(meta_file, json.dumps(doc, allow_nan=True).encode())
