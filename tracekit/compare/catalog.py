"""A checked snapshot of a store's structure: ranks, coordinates, kinds, tensors, steps.

Everything the diff needs to know before reading data is gathered here once, and anything odd
about the store (no ranks, unreadable rank or kind metadata, a rank folder zarr does not
recognise) becomes one StoreError line naming the store, instead of a traceback later.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from tracekit.errors import StoreError
from tracekit.store import RunStore, TensorInfo, open_store
from tracekit.store.kinds import kind_order
from tracekit.store.runmeta import RankCoords


@dataclass
class KindCatalog:
    kind: str
    tensors: dict[str, TensorInfo]  # in recorded order
    steps: list[int]  # visible steps (completed, or 0 for initial parameters)

    def __post_init__(self):
        self._visible = frozenset(self.steps)

    def has_step(self, step: int) -> bool:
        return step in self._visible


@dataclass
class RankCatalog:
    rank: int
    coords: RankCoords
    view: object  # tracekit.store.RankView
    kinds: dict[str, KindCatalog] = field(default_factory=dict)

    @property
    def dp(self) -> tuple[int, int]:
        """(dp_degree, dp_rank); without recorded coordinates every rank is its own data shard."""
        return self.coords.data_parallel


@dataclass
class StoreCatalog:
    store: RunStore
    ranks: dict[int, RankCatalog]

    @property
    def path(self) -> str:
        return self.store.path

    def describe(self) -> dict:
        steps = sorted({s for r in self.ranks.values() for k in r.kinds.values() for s in k.steps if s > 0})
        out = {"path": self.path, "ranks": len(self.ranks), "steps": len(steps), **self.store.setup.known()}
        # how the ranks ended, where one did not finish: a partial run must not read as a whole one
        unfinished = {}
        for r in sorted(self.ranks):
            view = self.store.rank(r)
            if view.status != "finished":
                unfinished[str(r)] = {"status": view.status, "cause": view.cause}
        if unfinished:
            out["unfinished_ranks"] = unfinished
        return out


def load_catalog(store_or_path, share_with: StoreCatalog | None = None) -> StoreCatalog:
    """Open a store (a path or a RunStore) and check its structure; StoreError if it is unusable.
    `share_with`: the comparison's other side, whose parsed tensor indexes a store opened here reuses."""
    store = store_or_path if isinstance(store_or_path, RunStore) else open_store(
        store_or_path, share_with=share_with.store if share_with is not None else None)
    path = store.path
    with warnings.catch_warnings():
        # zarr warns (and skips) a folder without metadata; we report it as an error below instead.
        warnings.simplefilter("ignore")
        try:
            ranks = store.ranks
        except StoreError:
            raise  # the reader's own line already names the store and the damage
        except Exception as e:
            raise StoreError(f"{path}: unreadable rank metadata ({e.__class__.__name__}: {e})") from None
        lost = store.unlisted_rank_folders()
        if lost:
            raise StoreError(f"{path}: {lost[0]} has no readable metadata (half-written store?)")
        if not ranks:
            raise StoreError(f"{path} has no ranks: a half-written store (the run recorded nothing)")
        out = {}
        for r in ranks:
            out[r] = _load_rank(store, r)
    return StoreCatalog(store, out)


def _load_rank(store: RunStore, r: int) -> RankCatalog:
    where = f"{store.path}: rank {r}"
    try:
        view = store.rank(r)
        cat = RankCatalog(r, view.meta.coords, view)
        for kind in view.kinds:
            steps = view.steps(kind)
            # every field of every entry was checked as the index was parsed (TensorInfo.from_attrs):
            # a malformed index has failed by now, naming its rank and kind
            tensors = {t.name: t for t in view.tensors(kind)}
            cat.kinds[kind] = KindCatalog(kind, tensors, steps)
    except StoreError:
        raise
    except Exception as e:
        raise StoreError(f"{where}: unreadable metadata ({e.__class__.__name__}: {e})") from None
    cat.kinds = dict(sorted(cat.kinds.items(), key=lambda kv: (kind_order(kv[0]), kv[0])))
    return cat
