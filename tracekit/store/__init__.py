"""The run store: one zarr v3 group per run, one subgroup per rank, packed arrays per kind."""

from tracekit.store.finalize import finalize_store
from tracekit.store.format import DEFAULT_KINDS, FORMAT_VERSION, KINDS
from tracekit.store.reader import RankView, RunStore, TensorInfo, open_store
from tracekit.store.writer import RankWriter, TensorData, create_store, holds_pieces, is_store, update_root_meta

__all__ = [
    "DEFAULT_KINDS", "FORMAT_VERSION", "KINDS", "RankView", "RankWriter", "RunStore", "TensorData",
    "TensorInfo", "create_store", "finalize_store", "holds_pieces", "is_store", "open_store", "update_root_meta",
]
