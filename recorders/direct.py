"""A step's capture written straight into its spool entry, each byte once.

The general path copies gradients and the parameters before the update at begin_step, computes
deltas into new tensors after it, and then copies everything again into a new spool file. Here,
when begin_step already knows the whole entry (every tensor a CPU tensor or a local piece of a
DTensor, no optimizer state), the entry's layout is fixed at begin_step and filled in place in a
mapped spool file (a Handoff slab, reused from step to step):

- begin_step: the gradients are copied into their places in the entry, the parameters before
  the update into buffers of the recorder's own, kept from step to step;
- after the update: the parameters are copied into the entry, the deltas computed into it
  (torch.sub(after, before, out=...): the same kernel as `after - before`, so the same bits),
  the staged output and loss copied; then the entry is handed over (durable on return).

The entry is the one write_entry() would write for the same tensors, byte for byte but for the
padding between tensors (a reused slab keeps old bytes there; no reader looks at them).
Anything the plan did not foresee (a parameter's layout or a staged tensor changed, a capture the
plan does not cover) falls back to the general path, which finds the gradients and the snapshots
here in the forms snapshot_piece() gives.
"""

from __future__ import annotations

import numpy as np
import torch

from tracekit.recorders.coords import is_dtensor
from tracekit.recorders.materialize import local_piece
from tracekit.recorders.spool import entry_head, layout
from tracekit.store.dtypes import storage_dtype


# Filling in place holds memory the general path frees at each step's end: the slab it maps and
# the buffers it keeps (parameters before the update, deltas on their way to a fresh slab), about
# two entries' worth in the rank's RSS. It is taken only while an entry is at most this share of
# the queue cap (--queue-mb), so the rank's extra peak RSS stays within the cap (bench_record at
# 100M params: a 601 MB entry filled in place gave 1.21x the 1024 MB cap on one rank).
DIRECT_SHARE = 4


def cpu_piece(t: torch.Tensor):
    """(the CPU tensor this rank holds of `t`, its Shard or None), or None when taking it needs a
    gather or a device copy (the general path's business)."""
    if is_dtensor(t):
        piece = local_piece(t)
        if piece is None:
            return None
        local, shard = piece
    else:
        local, shard = t.detach(), None
    if local.device.type != "cpu":
        return None
    return local, shard


_DTYPES: dict = {}  # torch dtype -> its store name, or None when a store cannot hold it


def _spec(kind: str, name: str, local: torch.Tensor, shard) -> tuple | None:
    dtype = _DTYPES.get(local.dtype, False)
    if dtype is False:
        dtype = str(local.dtype).removeprefix("torch.")
        try:
            storage_dtype(dtype)
        except ValueError:  # the general path raises it, as it always has
            dtype = None
        _DTYPES[local.dtype] = dtype
    if dtype is None:
        return None
    return (kind, name, dtype, tuple(local.shape), local.numel() * local.element_size(), shard)


def _slot(whole: torch.Tensor, offset: int, spec: tuple) -> torch.Tensor:
    _, _, dtype, shape, nbytes, _ = spec
    return whole[offset:offset + nbytes].view(getattr(torch, dtype)).view(shape)


def _unpack(t) -> tuple:
    return t if isinstance(t, tuple) else (t, None)


def _snapshot(local: torch.Tensor, shard):
    return local if shard is None else (local, shard)


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous tensor, any dtype (bfloat16 too), as a buffer."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class DirectCapture:
    """One step's entry, laid out at begin_step and filled in place (see the module's doc)."""

    def __init__(self, handoff, step: int, plan: list[tuple], befores: dict, buffers: dict):
        self.handoff = handoff
        self.step = step
        self.plan = plan  # (spec, source, name) per tensor, in the entry's order; source: a staged kind,
        self.befores = befores  # or "gradients", "parameters", "deltas"; befores: name -> snapshot
        self.spare = buffers.setdefault("spare", {})  # name -> a buffer for a delta on its way to a fresh slab
        specs = [spec for spec, _, _ in plan]
        cached = buffers.get("layout")
        if cached is None or cached[0] != specs:  # laid out again only when the tensors change
            cached = buffers["layout"] = (specs, layout(specs))
        self.layout = cached[1]
        head, self.offsets, size = entry_head(step, True, self.layout)
        self.slab = handoff.slab(size)
        self.published = False
        self._put_bytes(0, np.frombuffer(head, dtype=np.uint8))

    # ---- writing into the slab: pwrite() into a fresh one, through the mapping into a reused one ----
    def _put_bytes(self, offset: int, data: np.ndarray) -> None:
        if self.slab.fresh:
            self.slab.write_at(offset, data)
        else:
            self.slab.array[offset:offset + data.nbytes] = data

    def _slot(self, offset: int, spec: tuple) -> torch.Tensor:
        cache = self.slab.cache  # the views of a reused slab, made once per layout
        if cache.get("layout") is not self.layout:
            cache.clear()
            cache["layout"], cache["views"] = self.layout, {}
        views = cache["views"]
        view = views.get(offset)
        if view is None:
            view = views[offset] = _slot(torch.from_numpy(self.slab.array), offset, spec)
        return view

    def _put(self, offset: int, spec: tuple, t: torch.Tensor) -> None:
        if self.slab.fresh:
            self.slab.write_at(offset, _raw(t.contiguous()))
        else:
            self._slot(offset, spec).copy_(t)

    def _put_difference(self, offset: int, spec: tuple, name: str, after: torch.Tensor) -> None:
        before = self.befores[name]
        if not self.slab.fresh:
            torch.sub(after, before, out=self._slot(offset, spec))
            return
        buf = self.spare.get(name)
        if buf is None or buf.shape != before.shape or buf.dtype != before.dtype:
            buf = self.spare[name] = torch.empty_like(before)
        self.slab.write_at(offset, _raw(torch.sub(after, before, out=buf)))

    @classmethod
    def begin(cls, handoff, step: int, staged: dict, grads: list, params: list, keep_params: bool,
              deltas: bool, buffers: dict) -> "DirectCapture | None":
        """Lay out the step's entry and take the before-the-update copies: gradients into the entry,
        parameters (when `deltas`) into buffers of the recorder's (`buffers`, a dict kept across
        steps and updated here). `staged`: kind -> {name: tensor or (piece, Shard)} as observe()
        left it; `grads`, `params`: (name, tensor) to record, the parameters as kind `parameters`
        when `keep_params`, their deltas when `deltas` (in that order, as the general path). None
        when the step needs the general path (nothing taken then)."""
        plan, pieces = [], {}
        for kind, tensors in staged.items():
            for name, t in tensors.items():
                local, shard = _unpack(t)
                if local.device.type != "cpu":
                    return None
                plan.append((_spec(kind, name, local, shard), kind, name))
        for kind, items in (("gradients", grads), ("parameters", params if keep_params or deltas else [])):
            for name, t in items:
                piece = cpu_piece(t)
                if piece is None:
                    return None
                pieces[kind, name] = piece
        for kind, wanted in (("gradients", True), ("parameters", keep_params), ("deltas", deltas)):
            if wanted:
                of = "parameters" if kind == "deltas" else kind
                plan += [(_spec(kind, name, *pieces[of, name]), kind, name) for name, _ in (grads if kind == "gradients" else params)]
        if any(spec is None for spec, _, _ in plan):
            return None
        if sum(spec[4] for spec, _, _ in plan) > handoff.max_bytes // DIRECT_SHARE:  # the entry's tensor bytes
            return None
        befores = {}
        snapshots = buffers.setdefault("before", {})
        for name, _ in params if deltas else ():
            local = pieces["parameters", name][0]
            buf = snapshots.get(name)
            if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
                buf = snapshots[name] = torch.empty_like(local, memory_format=torch.contiguous_format)
            befores[name] = buf.copy_(local)
        cap = cls(handoff, step, plan, befores, buffers)
        for (spec, source, name), offset in zip(plan, cap.offsets):
            if source == "gradients":
                cap._put(offset, spec, pieces[source, name][0])
        return cap

    def snapshots(self) -> tuple[list, list]:
        """The gradients and parameters taken before the update, as snapshot_piece() gives them (copies,
        not views of the entry), for the general path when this capture falls back to it."""
        grads, before = [], []
        for (spec, source, name), offset in zip(self.plan, self.offsets):
            if source == "gradients":
                grads.append((name, _snapshot(self._slot(offset, spec).clone(), spec[5])))
            elif source == "deltas":
                before.append((name, _snapshot(self.befores[name], spec[5])))
        return grads, before

    def capture(self, staged: dict, current: dict) -> bool:
        """Fill the entry with the tensors after the update and hand it over (provisional). False,
        with nothing handed over, when the step no longer matches the plan (then the general path
        records it). `current`: name -> the parameter now."""
        sources, after = {}, {}  # (source, name) -> the CPU tensor to copy from; name -> the parameter's piece
        for spec, source, name in self.plan:
            if source == "gradients":
                continue
            if source in ("parameters", "deltas"):
                piece = after.get(name) or (cpu_piece(current[name]) if name in current else None)
                after[name] = piece
            else:
                t = staged.get(source, {}).get(name)
                piece = _unpack(t) if t is not None and _unpack(t)[0].device.type == "cpu" else None
            if piece is None or _spec(spec[0], name, *piece) != spec:
                return False
            sources[source, name] = piece[0]
        staged_planned = sum(1 for spec, source, _ in self.plan if source not in ("gradients", "parameters", "deltas"))
        if sum(len(v) for v in staged.values()) != staged_planned:
            return False  # something staged the plan has no place for
        if self.published:  # a further capture of the step (zero-code: another optimizer): a new entry
            old, self.slab = self.slab, self.handoff.slab(self.slab.size)
            self._put_bytes(0, old.array)  # the head and the gradients, as taken before the update
        for (spec, source, name), offset in zip(self.plan, self.offsets):
            if source == "deltas":
                self._put_difference(offset, spec, name, sources[source, name])
            elif source != "gradients":
                self._put(offset, spec, sources[source, name])
        self.handoff.provisional_slab(self.step, self.slab)
        self.published = True
        return True

    def abandon(self) -> None:
        """The step ends, or falls back to the general path: an entry not handed over gives its slab back."""
        if not self.published:
            self.handoff.release(self.slab)
