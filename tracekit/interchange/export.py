"""A store's tensors as safetensors files: one file per (rank, step, kind), names as recorded.

Each file's metadata says where it came from (format, run, coords, rank, step, kind, store, and the tensors' recorded order), which is also
what `tracekit import` reads first, so an exported tree imports back bit for bit.
"""

from __future__ import annotations

import json
import os

from tracekit.display import path_text
from tracekit.errors import StoreError, UsageError
from tracekit.store.dtypes import storage_dtype
from tracekit.interchange import safetensors_io
from tracekit.store import RankView, open_store
from tracekit.store.location import canonical

FORMAT = "tracekit"


def _metadata(view: RankView, step: int, kind: str, names: list[str]) -> dict[str, str]:
    # safetensors metadata is str -> str: structured facts travel as JSON strings. safetensors
    # lists tensors sorted by name, so the recorded order (model order) travels in `names`.
    return {"names": json.dumps(names), "format": FORMAT, "run": json.dumps(dict(view.meta.run), default=str, sort_keys=True),
            "coords": json.dumps(view.meta.coords.to_attrs(), default=str, sort_keys=True),
            "rank": str(view.rank), "step": str(step), "kind": kind, "store": path_text(canonical(view.store.path))}


def _write(view: RankView, step: int, kind: str, out: str) -> int:
    from safetensors import SafetensorError

    infos = view.tensors(kind)
    if step not in view.steps(kind):
        have = view.steps(kind)
        raise StoreError(f"rank {view.rank} has no {kind} for step {step} (it has steps {_span(have)})")
    entries = []
    for i in infos:
        try:
            storage_dtype(i.dtype)
        except ValueError:  # a damaged or foreign tensor index: refuse rather than export wrong bits
            raise StoreError(f"{view.store.path}: rank {view.rank} {kind} tensor {i.name!r}: dtype {i.dtype!r} "
                             "is not one a tracekit store holds") from None
        entries.append((i.name, i.dtype, tuple(i.shape), view.read_region(kind, step, i.name).reshape(-1)))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        safetensors_io.write(out, entries, _metadata(view, step, kind, [i.name for i in infos]))
    except (OSError, SafetensorError) as e:  # an unwritable destination is the user's to fix, in one line
        raise UsageError(f"{path_text(out)}: cannot write it ({getattr(e, 'strerror', None) or e})") from None
    return len(entries)


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if steps else "none"


def _pick_rank(store, rank: int | None) -> RankView:
    if rank is None:
        if len(store.ranks) != 1:
            raise UsageError(f"{store.path} has ranks {store.ranks}; pick one with --rank")
        rank = store.ranks[0]
    return store.rank(rank)


def _refuse_inside_store(out: str) -> None:
    """Exported files never go into a store (the one exported or any other): files written among a
    store's groups would be taken for its own by whoever reads it next."""
    from tracekit.store.target import is_store

    here = os.path.abspath(out)
    while True:
        if os.path.isdir(here) and is_store(here):
            raise UsageError(f"-o {path_text(out)}: {path_text(here)} is a tracekit store; export into a folder outside it")
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent


def export_file(store_path: str, out: str, step: int, rank: int | None = None, kind: str = "parameters") -> dict:
    """Write one rank's tensors of one kind at one step to `out` (a .safetensors file)."""
    _refuse_inside_store(out)
    view = _pick_rank(open_store(store_path), rank)
    n = _write(view, step, kind, out)
    return {"file": out, "rank": view.rank, "step": step, "kind": kind, "tensors": n}


def export_tree(store_path: str, out_dir: str, ranks: list[int] | None = None, kinds: list[str] | None = None) -> dict:
    """Every (rank, step, kind) of a store as OUT/rank_R/step_S/KIND.safetensors (the import layout)."""
    _refuse_inside_store(out_dir)
    store = open_store(store_path)
    files = 0
    written_ranks, written_kinds, written_steps = [], [], set()  # what the files hold, for --json
    for r in ranks if ranks is not None else store.ranks:
        view = store.rank(r)
        for kind in kinds if kinds is not None else view.kinds:
            for step in view.steps(kind):
                _write(view, step, kind, os.path.join(out_dir, f"rank_{r}", f"step_{step}", f"{kind}.safetensors"))
                files += 1
                written_ranks += [r] if r not in written_ranks else []
                written_kinds += [kind] if kind not in written_kinds else []
                written_steps.add(step)
    if not files:
        raise UsageError(f"nothing to export from {store_path} with these choices")
    return {"directory": out_dir, "files": files, "ranks": written_ranks, "kinds": written_kinds,
            "steps": sorted(written_steps)}
