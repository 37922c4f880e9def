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

A tensor whose bytes are not kept (--full names others) is hashed and summarized here, on the
training thread, and travels as a digest record (tracekit/writer/spool.py) instead of its bytes: a
pass over the tensor in place of a copy into the spool, and the writer process then reads
nothing (it would hash and summarize the copy). A delta of that kind is computed block by block
into a small buffer and hashed and summarized while the block is in the CPU's cache, so it is
never written out whole. The hash and summary are the ones the writer computes from bytes
(tracekit.store.summaries.digest_and_summary), bit for bit.

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
from tracekit.writer.spool import DIGEST_RECORD, EntrySpec, digest_record, entry_head, layout
from tracekit.store import TensorData
from tracekit.store.dtypes import storage_dtype
from tracekit.store.hashing import identity
from tracekit.store.keep import keeps_bytes
from tracekit.store.shards import full_shape
from tracekit.store.summaries import BLOCK, DigestCache


# Filling in place holds memory in the rank that the general path frees at each step's end: the
# slabs it maps (a reused slab's pages count in the rank's RSS, fresh or in flight) and the copies
# of the parameters before the update. So the capture is taken only while one slab and those
# copies fit in the queue cap (--queue-mb), and a slab is taken only once the sealed entries
# waiting leave room for it beside the copies (Handoff.slab's budget): every slab in existence was
# made under that budget, so the rank's extra RSS stays within the cap. (Making room only at the
# hand-off, as put() does, let a slab be filled while a full cap of others waited: bench_record at
# 100M params, a 601 MB entry, 1.21x the 1024 MB cap on one rank, which had then kept the direct
# capture to entries of at most a quarter of the cap.)


# Tensors taken as they are, without detach(): the capture copies from them under no_grad(), and
# detach() (~2.5 us) was the largest single cost per tensor of a step's capture.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def cpu_piece(t: torch.Tensor):
    """(the CPU tensor this rank holds of `t`, its Shard or None), or None when taking it needs a
    gather or a device copy (the general path's business). A plain tensor comes as it is (not
    detached): read it under no_grad()."""
    if type(t) in _PLAIN:
        return (t, None) if t.device.type == "cpu" else None
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


def _spec(kind: str, name: str, local: torch.Tensor, shard, full=()) -> EntrySpec | None:
    """The tensor's place in the entry (None: a dtype no store holds); a digested one (its bytes not kept under the --full patterns `full`; never a complex one, whose
    finiteness the writer checks on its bytes) takes a digest record."""
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
    if full and not local.is_complex() and not keeps_bytes(full, kind, name):
        return EntrySpec(kind, name, dtype, tuple(local.shape), DIGEST_RECORD, shard, True)
    return EntrySpec(kind, name, dtype, tuple(local.shape), local.numel() * local.element_size(), shard, False)


def _slot(flats: dict, array: np.ndarray, offset: int, spec: EntrySpec) -> torch.Tensor:
    """The tensor at `offset` of a slab's mapping `array`, as `spec` lays it out. `flats` keeps the
    whole mapping as a tensor of each dtype: a slab's views are then one as_strided each (~1 us,
    against ~13 us for from_numpy, slicing and two views per tensor, paid for every tensor at each
    slab's first use)."""
    flat = flats.get(spec.dtype)
    if flat is None:
        flat = flats[spec.dtype] = torch.from_numpy(array).view(getattr(torch, spec.dtype))
    strides, step = [], 1
    for d in reversed(spec.shape):
        strides.append(step)
        step *= d
    return torch.as_strided(flat, spec.shape, strides[::-1], offset // flat.element_size())


def _values(t: torch.Tensor, dtype: str) -> np.ndarray:
    """A contiguous CPU tensor's flat data in storage dtype (a view, no copy)."""
    return np.frombuffer(_raw(t), dtype=storage_dtype(dtype))


def _difference_blocks(after: torch.Tensor, before: torch.Tensor, scratch: torch.Tensor, dtype: str):
    """after - before, one summaries.BLOCK at a time, computed into `scratch` (each block is gone
    when the next is made): the same kernel as the whole difference, elementwise, so the same bits."""
    a, b = after.contiguous().reshape(-1), before.reshape(-1)
    sdt = storage_dtype(dtype)
    for start in range(0, a.numel(), BLOCK):
        out = scratch[:min(BLOCK, a.numel() - start)]
        torch.sub(a[start:start + BLOCK], b[start:start + BLOCK], out=out)
        yield out.view(torch.uint8).numpy().view(sdt)


def _unpack(t) -> tuple:
    return t if isinstance(t, tuple) else (t, None)


def _snapshot(local: torch.Tensor, shard):
    return local if shard is None else (local, shard)


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous tensor, any dtype (bfloat16 too), as a buffer."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


class DirectCapture:
    """One step's entry, laid out at begin_step and filled in place (see the module's doc)."""

    def __init__(self, handoff, step: int, plan: list[tuple], befores: dict, buffers: dict, full=(), budget=None):
        self.handoff = handoff
        self.full = full
        self.step = step
        self.plan = plan  # (spec, source, name) per tensor, in the entry's order; source: a staged kind,
        self.befores = befores  # or "gradients", "parameters", "deltas"; befores: name -> snapshot
        self.budget = budget  # the queue bytes a slab may be taken under (the cap less the befores)
        self.digests: DigestCache = buffers.setdefault("digests", DigestCache())  # across steps: frozen tensors
        self.idents: dict = buffers.setdefault("idents", {})  # spec -> what its hash covers besides the bytes
        self.scratch: dict = buffers.setdefault("scratch", {})  # torch dtype -> one block of a delta
        self.digested_grads: dict = {}  # name -> (hash, summary) of a digested gradient, for snapshots()
        cached = buffers.get("layout")
        # laid out again only when the tensors change (a plan begin() reused is the very same list)
        if cached is None or (cached[0] is not plan and cached[0] != plan):
            cached = buffers["layout"] = (plan, layout([spec for spec, _, _ in plan]))
        self.layout = cached[1]
        head, self.offsets, size = entry_head(step, True, self.layout)
        self.slab = handoff.slab(size, budget)
        self.published = False
        self._put_bytes(0, np.frombuffer(head, dtype=np.uint8))

    # ---- writing into the slab: pwrite() into a fresh one, through the mapping into a reused one ----
    def _put_bytes(self, offset: int, data: np.ndarray) -> None:
        if self.slab.fresh:
            self.slab.write_at(offset, data)
        else:
            self.slab.array[offset:offset + data.nbytes] = data

    def _slot(self, offset: int, spec: EntrySpec) -> torch.Tensor:
        cache = self.slab.cache  # the views of a reused slab, made once per layout
        if cache.get("layout") is not self.layout:
            cache.clear()
            cache["layout"], cache["views"], cache["flats"] = self.layout, {}, {}
        views = cache["views"]
        view = views.get(offset)
        if view is None:
            view = views[offset] = _slot(cache["flats"], self.slab.array, offset, spec)
        return view

    def _ident(self, spec: EntrySpec) -> bytes:
        ident = self.idents.get(spec)
        if ident is None:
            ident = self.idents[spec] = identity(spec.name, spec.dtype, full_shape(spec.shape, spec.shard), spec.shard)
        return ident

    def _put_digest(self, offset: int, spec: EntrySpec, source: str, parts) -> None:
        """Hash and summarize a digested tensor (`parts`: its flat data, or a callable giving its
        blocks) and write its record."""
        digest, summary = self.digests.get((spec.kind, spec.name), self._ident(spec), parts, spec.dtype)
        self._put_bytes(offset, np.frombuffer(digest_record(digest, summary), dtype=np.uint8))
        if source == "gradients":  # only a fallback step needs them again (snapshots)
            self.digested_grads[spec.name] = digest, summary

    def _put(self, offset: int, spec: EntrySpec, t: torch.Tensor, source: str = "") -> None:
        if spec.digested:
            self._put_digest(offset, spec, source, _values(t.contiguous(), spec.dtype))
            return
        if self.slab.fresh:
            self.slab.write_at(offset, _raw(t.contiguous()))
        else:
            self._slot(offset, spec).copy_(t)

    def _put_all(self, items: list[tuple]) -> None:
        """_put() of each (offset, spec, tensor, source), the copies into a reused slab in one
        foreach call (a Python-level copy_ per tensor cost more than the copy of a small one)."""
        into, froms = [], []
        for offset, spec, t, source in items:
            if spec.digested or self.slab.fresh:
                self._put(offset, spec, t, source)
            else:
                into.append(self._slot(offset, spec))
                froms.append(t)
        if into:
            torch._foreach_copy_(into, froms)

    def _scratch(self, dtype: torch.dtype) -> torch.Tensor:
        scratch = self.scratch.get(dtype)
        if scratch is None:
            scratch = self.scratch[dtype] = torch.empty(BLOCK, dtype=dtype)
        return scratch

    def _put_difference(self, offset: int, spec: EntrySpec, name: str, after: torch.Tensor) -> None:
        before = self.befores[name]
        if spec.digested:
            scratch = self._scratch(before.dtype)
            self._put_digest(offset, spec, "deltas", lambda: _difference_blocks(after, before, scratch, spec.dtype))
            return
        if not self.slab.fresh:
            torch.sub(after, before, out=self._slot(offset, spec))
            return
        scratch = self._scratch(before.dtype)  # a fresh slab: block by block, each written with pwrite()
        for block in _difference_blocks(after, before, scratch, spec.dtype):
            self.slab.write_at(offset, block)
            offset += block.nbytes

    @classmethod
    def begin(cls, handoff, step: int, staged: dict, grads: list, params: list, keep_params: bool,
              deltas: bool, buffers: dict, full=()) -> "DirectCapture | None":
        """Lay out the step's entry and take the before-the-update copies: gradients into the entry,
        parameters (when `deltas`) into buffers of the recorder's (`buffers`, a dict kept across
        steps and updated here). `staged`: kind -> {name: tensor or (piece, Shard)} as observe()
        left it; `grads`, `params`: (name, tensor) to record, the parameters as kind `parameters`
        when `keep_params`, their deltas when `deltas` (in that order, as the general path); `full`:
        the --full patterns (tensors they do not name are digested). None when the step needs the
        general path (nothing taken then)."""
        plan, pieces = [], {}
        for kind, tensors in staged.items():
            for name, t in tensors.items():
                local, shard = _unpack(t)
                if local.device.type != "cpu":
                    return None
                plan.append((_spec(kind, name, local, shard, full), kind, name))
        for kind, items in (("gradients", grads), ("parameters", params if keep_params or deltas else [])):
            for name, t in items:
                piece = cpu_piece(t)
                if piece is None:
                    return None
                pieces[kind, name] = piece

        def planned():  # the tensors' places, in the entry's order
            yield from plan
            for kind, wanted in (("gradients", True), ("parameters", keep_params), ("deltas", deltas)):
                if wanted:
                    of = "parameters" if kind == "deltas" else kind
                    for name, _ in (grads if kind == "gradients" else params):
                        yield _spec(kind, name, *pieces[of, name], full), kind, name

        # The last step's plan while every tensor still matches it, compared one by one without
        # building a new one: the ~3 objects a tensor and kind of a new plan lived through the
        # step, and their promotion made Python's full collections come every few steps (at 2000
        # tensors ~140 ms each, more than the capture's own work; docs/RELIABILITY.md).
        last = buffers.get("plan")
        size = len(plan) + len(grads) + len(params) * (bool(keep_params) + bool(deltas))
        if last is not None and len(last) == size and all(a == b for a, b in zip(planned(), last)):
            plan = last
        else:
            plan = list(planned())
            if any(spec is None for spec, _, _ in plan):
                return None
        befores_bytes = sum(pieces["parameters", name][0].nbytes for name, _ in params) if deltas else 0
        if sum(spec.nbytes for spec, _, _ in plan) + befores_bytes > handoff.max_bytes:  # one slab and the befores
            return None
        buffers["plan"] = plan
        befores = {}
        snapshots = buffers.setdefault("before", {})
        for name, _ in params if deltas else ():
            local = pieces["parameters", name][0]
            buf = snapshots.get(name)
            if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
                buf = snapshots[name] = torch.empty_like(local, memory_format=torch.contiguous_format)
            befores[name] = buf
        cap = cls(handoff, step, plan, befores, buffers, full, handoff.max_bytes - befores_bytes)
        with torch.no_grad():  # the pieces are not detached (cpu_piece)
            if befores:
                torch._foreach_copy_(list(befores.values()), [pieces["parameters", name][0] for name in befores])
            cap._put_all([(offset, spec, pieces[source, name][0], source)
                          for (spec, source, name), offset in zip(plan, cap.offsets) if source == "gradients"])
        return cap

    def snapshots(self) -> tuple[list, list]:
        """The gradients and parameters taken before the update, as snapshot_piece() gives them (copies,
        not views of the entry), for the general path when this capture falls back to it. A
        digested gradient comes as its TensorData (hash and summary, no bytes)."""
        grads, before = [], []
        for (spec, source, name), offset in zip(self.plan, self.offsets):
            if source == "gradients" and spec.digested:  # digested at begin_step: its record stands in
                digest, summary = self.digested_grads[name]
                grads.append((name, TensorData(name, spec.dtype, spec.shape, np.empty(0, dtype=storage_dtype(spec.dtype)),
                                               spec.shard, digest=digest, summary=summary)))
            elif source == "gradients":
                grads.append((name, _snapshot(self._slot(offset, spec).clone(), spec.shard)))
            elif source == "deltas":
                before.append((name, _snapshot(self.befores[name], spec.shard)))
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
            if piece is None or _spec(spec.kind, name, *piece, self.full) != spec:
                return False
            sources[source, name] = piece[0]
        staged_planned = sum(1 for spec, source, _ in self.plan if source not in ("gradients", "parameters", "deltas"))
        if sum(len(v) for v in staged.values()) != staged_planned:
            return False  # something staged the plan has no place for
        if self.published:  # a further capture of the step (zero-code: another optimizer): a new entry
            old, self.slab = self.slab, self.handoff.slab(self.slab.size, self.budget)
            self._put_bytes(0, old.array)  # the head and the gradients, as taken before the update
        with torch.no_grad():  # the pieces are not detached (cpu_piece)
            self._put_all([(offset, spec, sources[source, name], source)
                           for (spec, source, name), offset in zip(self.plan, self.offsets)
                           if source not in ("deltas", "gradients")])
            for (spec, source, name), offset in zip(self.plan, self.offsets):
                if source == "deltas":
                    self._put_difference(offset, spec, name, sources[source, name])
        self.handoff.provisional_slab(self.step, self.slab)
        self.published = True
        return True

    def abandon(self) -> None:
        """The step ends, or falls back to the general path: an entry not handed over gives its slab back."""
        if not self.published:
            self.handoff.release(self.slab)
