"""Build a store from dump files: safetensors, or torch.save'd dicts of tensors (weights only).

So that the per-rank, per-step dumps a team already has can be diffed against a recorded run.
torch.save files are only ever read with `torch.load(weights_only=True)`: a file that holds
anything but tensors and plain containers is refused, never unpickled. Layout: docs/INTERCHANGE.md.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import defaultdict
from typing import Callable

from tracekit.environment import run_environment
from tracekit.errors import StoreError, UsageError
from tracekit.interchange import safetensors_io
from tracekit.interchange.layout import KIND_NAMES, TENSOR_SUFFIXES, parse_path
from tracekit.store.tensors import from_torch
from tracekit.store import RankWriter, TensorData, create_store, finalize_store
from tracekit.store import MAX_STEP
from tracekit.store.kinds import INITIAL_STEP

# More ranks than any job runs: a larger number is a damaged or hostile file, not a world.
MAX_RANKS = 1 << 20


class DumpRefused(UsageError):
    """A torch.save file holds objects other than tensors; loading it would run arbitrary code."""


def _check_regular(path: str) -> None:
    """Only regular files are opened: reading a FIFO would block forever, a device never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        what = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise UsageError(f"{path} is {what}, not a regular file; tracekit import reads only regular files")


def _files(src: str) -> list[str]:
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if not os.path.isdir(src):
        _check_regular(src)
        return [src]
    found = []
    for folder, dirs, names in os.walk(src):
        dirs.sort()
        found += [os.path.join(folder, n) for n in sorted(names) if n.lower().endswith(TENSOR_SUFFIXES)]
    for path in found:
        _check_regular(path)
    if not found:
        raise UsageError(f"{src} holds no tensor files ({', '.join('*' + s for s in TENSOR_SUFFIXES)})")
    return found


def _read_safetensors(path: str) -> tuple[dict, dict]:
    """(name -> TensorData, metadata), in the recorded order a tracekit export lists (safetensors sorts names)."""
    try:
        tensors, meta = safetensors_io.read(path)
    except safetensors_io.UnsupportedDtype as e:
        raise UsageError(f"{path}: {e}") from None
    order = [k for k in (_json(meta, "names", list) or []) if k in tensors]
    return {k: tensors[k] for k in order + [k for k in tensors if k not in order]}, meta


def _read_torch(path: str) -> dict:
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported (global: GLOBAL [\w.]+|operand \d+)", str(e))
        detail = found.group(0) if found else "not weights only"
        raise DumpRefused(f"{path}: refused: it holds objects other than tensors, and tracekit never unpickles "
                          f"arbitrary objects (torch.load weights_only=True says: {detail}); "
                          "save a dict of tensors (e.g. model.state_dict()) or safetensors instead") from None
    except Exception as e:  # truncated zip, not a torch file at all, ...
        raise StoreError(f"{path}: not a readable torch.save file ({e.__class__.__name__}: {e})") from None
    return obj


def _flatten(obj, prefix: str, out: dict, skipped: list[str]) -> None:
    """Tensors inside nested dicts/lists, keys joined with '.'; plain numbers and strings are skipped."""
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, skipped)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}.{i}" if prefix else str(i), out, skipped)
    else:
        skipped.append(prefix or "<file>")


def _bare_name(path: str, kind: str) -> str:
    # a file holding one bare tensor: a loss is named like a recorded loss, anything else by the file
    if kind in ("loss", "local_loss"):
        return kind
    return os.path.splitext(os.path.basename(path))[0]


def _json(meta: dict, key: str, kind: type = dict):
    """meta[key] parsed as JSON when it is a `kind` (dict or list), else None."""
    try:
        value = json.loads(meta[key]) if key in meta else None
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


def _int(meta: dict, key: str, path: str) -> int | None:
    if key not in meta:
        return None
    try:
        return int(meta[key])
    except ValueError:
        raise StoreError(f"{path}: metadata {key}={meta[key]!r} is not a number") from None


# Coordinates the store and the diff read as integers (world_size also sizes the imported run).
_INT_COORDS = ("rank", "local_rank", "world_size", "dp_degree", "dp_rank", "tp_degree", "tp_rank")


def _check_coords(coords: dict, path: str) -> None:
    for k in _INT_COORDS:
        v = coords.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise StoreError(f"{path}: metadata coords {k}={v!r} is not a non-negative integer")


def import_dumps(src: str, out: str, force: bool = False, default_kind: str = "parameters", step_offset: int = 0,
                 rename: Callable[[str], str] | None = None) -> dict:
    """Read every tensor file under `src` into a new store at `out`; returns a summary."""
    if default_kind not in KIND_NAMES:
        raise UsageError(f"unknown kind {default_kind!r}; known kinds: {', '.join(KIND_NAMES)}")
    files = _files(src)
    # rank -> step -> kind -> name -> tensor
    data: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    runs: dict[int, dict] = {}
    skipped: list[str] = []
    for path in files:
        rel = os.path.relpath(path, src) if os.path.isdir(src) else os.path.basename(path)
        key = parse_path(rel)
        meta: dict = {}
        if path.lower().endswith(".safetensors"):
            tensors, meta = _read_safetensors(path)
        else:
            obj = _read_torch(path)
            tensors, lost = {}, []
            _flatten(obj, "", tensors, lost)
            skipped += [f"{rel}:{k}" for k in lost]
            if set(tensors) == {""}:
                tensors = {_bare_name(path, meta.get("kind") or key.kind or default_kind): tensors[""]}
        rank = _int(meta, "rank", path)
        rank = key.rank if rank is None else rank
        step = _int(meta, "step", path)
        step = key.step if step is None else step
        kind = meta.get("kind") or key.kind or default_kind
        if step is None:
            raise UsageError(f"{rel}: cannot tell its step; put step<N> in its path (see docs/INTERCHANGE.md)")
        if rank is not None and not 0 <= rank < MAX_RANKS:
            raise UsageError(f"{rel}: impossible rank {rank} (ranks count from 0, fewer than {MAX_RANKS})")
        step += step_offset
        if step > MAX_STEP:
            raise UsageError(f"{rel}: impossible step {step} (more than {MAX_STEP})")
        if step < 0 or (step == INITIAL_STEP and kind != "parameters"):
            raise UsageError(f"{rel}: {kind} at step {step}: steps count from 1 (step 0 holds only the initial "
                             "parameters); shift numbering with --step-offset")
        if kind not in KIND_NAMES:
            raise UsageError(f"{rel}: unknown kind {kind!r}; known kinds: {', '.join(KIND_NAMES)}")
        if rank not in runs:  # what a tracekit export says about its rank's run and place in it
            runs[rank] = {k: v for k in ("run", "coords") if (v := _json(meta, k)) is not None}
            _check_coords(runs[rank].get("coords", {}), path)
            claimed = runs[rank].get("coords", {}).get("world_size")
            if claimed is not None and rank is not None and not rank < claimed <= MAX_RANKS:
                raise UsageError(f"{rel}: rank {rank} does not fit its metadata's world size {claimed}")
        bucket = data[rank][step][kind]
        for name, t in tensors.items():
            name = rename(name) if rename else name
            if name in bucket:
                raise UsageError(f"{rel}: rank {rank} step {step} {kind} tensor {name!r} comes from two files or names")
            if isinstance(t, TensorData):  # from safetensors, already in store form
                bucket[name] = TensorData(name, t.dtype, t.shape, t.data)
                continue
            if str(t.layout) != "torch.strided" or t.is_meta:  # a torch tensor (torch.load'ed: torch is imported)
                what = "a meta tensor (it has no data)" if t.is_meta else f"a {t.layout} tensor, not a dense one"
                raise UsageError(f"{rel}: tensor {name!r} is {what}; tracekit stores dense tensors "
                                 "(save t.to_dense() or the real tensor)")
            try:
                bucket[name] = from_torch(name, t)
            except ValueError:
                raise UsageError(f"{rel}: tensor {name!r} has dtype {t.dtype}, which a tracekit store cannot hold") from None
    if not data:
        raise UsageError(f"{src}: no tensors found")
    _write_store(out, src, data, runs, force)
    steps = sorted({s for r in data.values() for s in r})
    return {"store": out, "files": len(files), "ranks": sorted(data), "steps": steps,
            "kinds": sorted({k for r in data.values() for s in r.values() for k in s}),
            "skipped": skipped}


def _write_store(out: str, src: str, data: dict, runs: dict, force: bool) -> None:
    claims = {w for r in runs.values() if (w := r.get("coords", {}).get("world_size")) is not None}
    if len(claims) > 1:
        raise UsageError(f"the files disagree on the world size ({', '.join(map(str, sorted(claims)))})")
    world = max(max(data) + 1, *claims, 1)
    create_store(out, {"launcher": "tracekit import", **run_environment(["tracekit", "import", src, "-o", out]),
                       "imported_from": os.path.abspath(src)}, force=force)
    for rank in sorted(data):
        # What a dump says about parallelism is unknown: each rank reads as a data-parallel replica.
        coords = {"rank": rank, "local_rank": rank, "world_size": world, "dp_degree": world, "dp_rank": rank,
                  "tp_degree": 1, "tp_rank": 0, "meshes": []}
        coords.update({**runs.get(rank, {}).get("coords", {}), "rank": rank})
        run = {**runs.get(rank, {}).get("run", {}), "world_size": world}
        writer = RankWriter(out, rank, {"coords": coords, "run": run, "imported": True})
        order: dict[str, list[str]] = {}  # each kind keeps the tensor order of its first step
        for step in sorted(data[rank]):
            for kind, bucket in sorted(data[rank][step].items()):
                names = order.setdefault(kind, list(bucket))
                if set(names) != set(bucket):
                    missing, extra = sorted(set(names) - set(bucket)), sorted(set(bucket) - set(names))
                    raise UsageError(f"rank {rank} {kind}: step {step} has other tensors than earlier steps "
                                     f"(missing {missing[:3]}, extra {extra[:3]}); a store keeps one set per kind")
                writer.write(step, kind, [bucket[n] for n in names])
            if step != INITIAL_STEP:
                writer.complete_step(step)
        writer.close("finished")
    finalize_store(out, 0)
