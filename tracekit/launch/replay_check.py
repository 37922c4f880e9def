"""The launcher's check of --replay-from before any worker starts (the ranks replay in
tracekit/recorders/replay.py). Reads the reference store only: no torch."""

from __future__ import annotations

from tracekit.errors import UsageError
from tracekit.launch.config import format_step_range
from tracekit.store.location import canonical, same_store

PARAMETERS = "parameters"  # the kind a replay starts each step from


def check_reference(ref_path: str, store_path: str | None, steps: tuple[int, int | None] = (1, None)) -> dict:
    """Launcher-side check of --replay-from (and --replay-steps `steps`) before any worker starts;
    returns root metadata fields."""
    if store_path is not None and same_store(store_path, ref_path):
        raise UsageError(f"--replay-from {ref_path} is the output store itself; record the replay into another store")
    from tracekit.store import open_store  # here: every training rank imports PARAMETERS, and none needs zarr for it

    ref = open_store(ref_path)
    # the ranks that hold parameters: one that lacks them fails alone when it replays (its
    # recorder does not start), the others replay; only a reference where none has them is refused
    holding = [r for r in ref.ranks if PARAMETERS in ref.rank(r).kinds]
    if not holding:
        raise UsageError(f"{ref_path} has no recorded parameters, which a replay starts each step from; "
                         "record the reference with the default kinds")
    # step s starts from the state after step s-1: a first step past the reference's last state + 1
    # would replay nothing, and the run would pass as a replay that never happened
    last = max((max(ref.rank(r).steps(PARAMETERS), default=-1) for r in holding), default=-1)
    if steps[0] - 1 > last:
        raise UsageError(f"--replay-steps {format_step_range(steps)}: {ref_path} holds states up to step {last}, "
                         f"so it can replay steps 1 to {last + 1} at most")
    return {"replay_of": canonical(ref_path)}
