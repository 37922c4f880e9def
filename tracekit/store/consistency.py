"""The metadata consistency pass of `tracekit verify`: the store's documents must agree with each
other, not only each row with its objects.

- ranks: a finalized store lists its ranks (root `ranks`); a listed rank whose group is gone, or a
  group the list does not name, is damage, as is a rank whose `completed_steps` differ from what
  the launcher wrote down for it at finalization;
- completed steps vs data: a step a rank lists as completed is held by at least one of its kinds;
- step lists vs rows: each index array of a kind holds at least the rows its step list names
  (RankView.check_index_arrays, asked once per kind by verify).
"""

from __future__ import annotations

from typing import Callable, Iterator

from tracekit.errors import StoreError


def metadata_problems(store) -> Iterator[tuple[int | None, str | None, int | None, str]]:
    """(rank, kind, step, what) for each disagreement between the store's documents."""
    present = set(store.ranks)
    listed = _listed_ranks(store.meta)
    if listed is not None:
        for r in sorted(set(listed) - present):
            yield r, None, None, f"listed in the store's finalized metadata, but its group rank_{r}/ is missing"
        for r in sorted(present - set(listed)):
            yield r, None, None, "its group rank_{0}/ is not listed in the store's finalized metadata".format(r)
    for r in sorted(present):
        try:
            view = store.rank(r)
            done = view.completed_steps
            empty = view.empty_completed_steps()
        except StoreError:
            continue  # verify's own pass names it
        final = (listed or {}).get(r)
        if isinstance(final, list) and sorted(final) != done:
            yield r, None, None, (f"its completed_steps ({_span(done)}) differ from those its launcher wrote at "
                                  f"finalization ({_span(sorted(final))})")
        for s in empty:
            yield r, None, s, "listed as completed, but no kind holds data for it"


def missing_ranks(store) -> list[int]:
    """Ranks the finalized metadata lists whose group is gone (for `show`; verify names them too)."""
    listed = _listed_ranks(store.meta)
    return sorted(set(listed or ()) - set(store.ranks))


def _listed_ranks(meta: dict) -> dict[int, list | None] | None:
    """{rank: its completed_steps at finalization (None: not a list)} from the root, or None when
    the store was not finalized (nothing lists its ranks)."""
    ranks = meta.get("ranks")
    if not isinstance(ranks, dict):
        return None
    out = {}
    for key, entry in ranks.items():
        try:
            r = int(key)
        except ValueError:
            continue
        steps = entry.get("completed_steps") if isinstance(entry, dict) else None
        out[r] = steps if isinstance(steps, list) and all(isinstance(s, int) for s in steps) else None
    return out


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ", ".join(map(str, steps))


def check_metadata(store, report: Callable[[int | None, str | None, int | None, str], None]) -> None:
    for problem in metadata_problems(store):
        report(*problem)
