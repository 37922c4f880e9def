"""The run store: one zarr v3 group per run, one subgroup per rank, packed arrays per kind.

Public names load on first use: `tracekit.store.kinds` (the kind registry) is read by commands
that must start fast (`tracekit diff --help`), and must not pull in zarr through this package.
"""

from tracekit._lazy import lazy_names

_LAZY = {
    "finalize_store": "finalize",
    "DEFAULT_KINDS": "format", "FORMAT_VERSION": "format", "KINDS": "format", "MAX_STEP": "format",
    "RankView": "reader", "RunStore": "reader", "TensorInfo": "reader", "open_store": "reader",
    "RankWriter": "writer", "TensorData": "writer", "create_store": "writer", "holds_pieces": "writer",
    "is_store": "target", "update_root_meta": "writer",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names("tracekit.store", {k: f"tracekit.store.{v}" for k, v in _LAZY.items()}, globals())
