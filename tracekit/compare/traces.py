"""Root causes from the traces two stores hold (`tracekit diff` calls this after the tensor diff).

Reads the event streams through tracekit.store.traces and hands each (rank, step, level) pair to
tracekit.compare.rootcause. Ranks pair as the tensor diff paired them; steps and levels are those
both stores traced.
"""

from __future__ import annotations

from tracekit.compare.catalog import StoreCatalog
from tracekit.compare.rootcause import TraceComparison, compare_traces
from tracekit.compare.tolerances import Tolerances
from tracekit.errors import StoreError
from tracekit.store.dtypes import to_numpy_values
from tracekit.store.kinds import TRACE_LEVELS as LEVELS


def _named(view, read, *args):
    """read(*args) (one of the view's trace reads), a damaged trace named with its store and rank
    like any damage."""
    try:
        return read(*args)
    except StoreError as e:
        raise StoreError(f"damaged store: {view.store.path}: rank {view.rank} {e}") from None


def _full_loader(view, level: str, step: int):
    """key -> numpy values of a tensor the trace kept whole (None: not kept), each read once."""
    cache: dict = {}

    def load(key: str):
        if key not in cache:
            got = _named(view, view.trace_full, level, step, key)
            cache[key] = None if got is None else to_numpy_values(got[0], got[1]).reshape(got[2])
        return cache[key]
    return load


def compare_store_traces(ref: StoreCatalog, cand: StoreCatalog, rank_pairs: dict[int, int],
                         tolerances: Tolerances, steps: set[int] | None = None) -> list[TraceComparison]:
    """Every (rank, step, level) both stores traced (restricted to `steps` if given), compared."""
    out = []
    for rank, ref_rank in sorted(rank_pairs.items()):
        if rank not in cand.ranks or ref_rank not in ref.ranks:
            continue
        cv, rv = cand.ranks[rank].view, ref.ranks[ref_rank].view
        if not (cv.traced and rv.traced):  # known from the listings: no zarr lookup per rank and level
            continue
        for level in LEVELS:
            common = sorted(set(_named(cv, cv.trace_steps, level)) & set(_named(rv, rv.trace_steps, level)))
            for step in common:
                if steps is not None and step not in steps:
                    continue
                out.append(compare_traces(_named(rv, rv.trace_events, level, step), _named(cv, cv.trace_events, level, step),
                                          tolerances, rank=rank, ref_rank=ref_rank, step=step, level=level,
                                          ref_full=_full_loader(rv, level, step), cand_full=_full_loader(cv, level, step)))
    return out
