"""The group of a rank whose writer process ended before it made one (killed, or crashed as it
started): made by the launcher, as that writer would have made it, so that the store itself lists
the rank, the steps it spooled but never stored, and how it ended. Finalize lists ranks by their
groups; without one, such a rank was missing from the store's summary altogether."""

from __future__ import annotations

from tracekit.store.format import rank_group_name
from tracekit.store.location import resolve


def make_lost_rank_group(store_path, rank: int, attrs: dict, run_id: str | None = None,
                         storage_options=None) -> bool:
    """Make rank `rank`'s group from the attributes its rank wrote for its writer (`attrs`), holding
    no step, its status left `running` (finalize_store settles it: the rank's own note of how it
    ended, or its exit). False when the rank has a group already (its writer made it before it
    ended: the usual case). Raises StoreError when the store does not take it (another job's,
    already finalized)."""
    from tracekit.store.writer import RankWriter, _open_group

    location = resolve(store_path, storage_options)
    root = _open_group(location.zarr_store(), mode="r", use_consolidated=False)
    if rank_group_name(rank) in root:
        return False
    RankWriter(store_path, rank, attrs, storage_options=storage_options, run_id=run_id).leave_open()
    return True
