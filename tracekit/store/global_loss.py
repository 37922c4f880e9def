"""The global loss of a step, derived from the ranks' recorded local losses (no torch, no collective).

Zero-code recording never runs a collective for the loss (a peer dying mid-step would cost the
surviving ranks their step): each rank records its own local loss (kind `local_loss`) and says,
in its group's `loss_derivation` attribute, how the global loss follows from it. The launcher
derives it at finalize (finalize.py writes it as the `loss` kind); readers of a store left
unfinalized derive it the same way.

Which ranks combine is read from each rank's recorded coordinates (docs/FORMAT.md, `coords`):
  - no device mesh (DDP, one process): every rank of the world is a data-parallel replica;
  - DTensor meshes (FSDP2, TP, HSDP, SimpleFSDP+TP): the dims named like dp (DP_NAMES), or FSDP2's
    unnamed 1-D mesh. Ranks that differ only in those dims combine; tensor-parallel ranks (and any
    other dim) hold the same loss and are never combined.
A group combines only when every one of its ranks recorded the step; otherwise the step has no
global loss (tracekit cannot tell it, so it does not guess).

The combination is what a DDP script computes: all_reduce(SUM) in the loss's own dtype, then
(for "mean") divided by the number of ranks in that dtype. The sum adds the ranks' values one by
one from the highest rank down: the order gloo's all_reduce of one element uses (bitwise equal at
2, 3 and 4 ranks: tests/e2e/tracekit/store/test_global_loss_gloo.py and the samples' tests). Another backend
or world size may add in another order: the result is then within an ulp per addition of the script's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Mesh dimension names read as data parallel (torchtitan's names included); recorders/coords.py
# reads the same names when it records a rank's coordinates.
DP_NAMES = ("dp", "dp_shard", "dp_replicate", "fsdp", "ddp", "data_parallel", "dp_shard_cp")
UNNAMED_DIM = "dim0"  # how coords names the dim of an unnamed 1-D mesh (FSDP2's default)

DERIVATION_KEY = "loss_derivation"  # rank group attribute: {"from": "local_loss", "reduction": ...}
SOURCE_KIND = "local_loss"
REDUCTIONS = ("mean", "sum")


def derivation_attrs(reduction: str = "mean", why: str | None = None) -> dict:
    """What a rank's group says when its `loss` is to be derived from its `local_loss`; `why`: how
    the reduction was chosen (a flag, TorchTitan's trainer, or what was assumed), for show."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"loss reduction must be one of {', '.join(REDUCTIONS)}, not {reduction!r}")
    return {DERIVATION_KEY: {"from": SOURCE_KIND, "reduction": reduction, **({"why": why} if why else {})}}


def derivation_line(attrs: dict) -> str | None:
    """'global loss = sum over dp ranks (TorchTitan pre-divides by global tokens)', from a rank's
    group attributes; None when its loss is recorded, not derived."""
    reduction = derivation_of(attrs)
    if reduction is None:
        return None
    why = attrs[DERIVATION_KEY].get("why")
    return f"global loss = {reduction} over dp ranks" + (f" ({why})" if isinstance(why, str) and why else "")


def derivation_of(attrs: dict) -> str | None:
    """The reduction a rank's group asks for, or None when its loss is recorded, not derived."""
    rule = attrs.get(DERIVATION_KEY)
    if not isinstance(rule, dict) or rule.get("from") != SOURCE_KIND or rule.get("reduction") not in REDUCTIONS:
        return None
    return rule["reduction"]


@dataclass(frozen=True)
class Group:
    """Where a rank's loss combines: its key (same key, same group) and how many ranks the group has."""

    key: tuple
    size: int


def dp_group(coords: dict) -> Group:
    """The data-parallel group of a rank, from its recorded coordinates."""
    world = int(coords.get("world_size", 1))
    tp_rank = coords.get("tp_rank", 0)
    for i, mesh in enumerate(coords.get("meshes") or []):
        names, shape, coord = mesh.get("dim_names"), mesh.get("shape"), mesh.get("coordinate")
        if not names or coord is None:
            continue
        dims = [d for d, n in enumerate(names) if n in DP_NAMES]
        if not dims and len(names) == 1 and names[0] == UNNAMED_DIM:
            dims = [0]
        if dims:
            others = tuple(c for d, c in enumerate(coord) if d not in dims)
            return Group(("mesh", i, tuple(names), others, tp_rank), int(np.prod([shape[d] for d in dims])))
    if coords.get("meshes"):  # DTensors on meshes with no dp dim (tp only): the rank's loss is global
        return Group(("rank", coords.get("rank")), 1)
    return Group(("world",), world)


def combine(values: list[tuple[int, np.ndarray]], reduction: str, bf16: bool = False) -> np.ndarray:
    """One global loss from (rank, local loss) pairs, in the losses' dtype (see the module doc).

    bfloat16 (handed over as its float32 value) is rounded back to bfloat16 after each operation,
    as torch computes in it; the result is then its float32 value, like every bfloat16 read.
    """
    ordered = [np.asarray(v) for _, v in sorted(values, key=lambda rv: rv[0], reverse=True)]
    dtype = ordered[0].dtype
    total = ordered[0].astype(dtype).reshape(())
    with np.errstate(all="ignore"):  # a NaN or Inf loss combines like torch's: no warning
        for v in ordered[1:]:
            total = dtype.type(total + v.astype(dtype).reshape(()))
            if bf16:
                total = round_bf16(total)
        if reduction == "mean":
            total = dtype.type(total / dtype.type(len(ordered)))
            if bf16:
                total = round_bf16(total)
    return np.asarray(total, dtype=dtype)


def round_bf16(x) -> np.float32:
    """float32 -> the nearest bfloat16 (ties to even), as a float32 value; NaN stays NaN."""
    a = np.asarray(x, dtype=np.float32).reshape(1)
    if np.isnan(a[0]):
        return a[0]
    bits = a.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return np.asarray(bits.astype(np.uint32)).view(np.float32)[0]


def derive(local: dict[int, dict[int, np.ndarray]], coords: dict[int, dict], reduction: str = "mean",
           dtypes: dict[int, str] | None = None) -> tuple[dict[int, dict[int, np.ndarray]], dict[int, str]]:
    """The global loss of each rank and step, and why a rank has none (rank -> one line).

    local: rank -> {step: its local loss (0-d numpy value)}; coords: rank -> its recorded coords;
    dtypes: rank -> the losses' logical dtype ("bfloat16" values are float32 widened from it).
    A step gets a global loss only where every rank of the rank's group recorded it; a group with
    ranks that recorded no local loss at all (`--ranks`, a rank that never started) gets none.
    """
    groups: dict[tuple, list[int]] = {}
    of_rank: dict[int, Group] = {}
    for r in sorted(coords):
        g = dp_group(coords[r])
        of_rank[r] = g
        groups.setdefault(g.key, []).append(r)
    out: dict[int, dict[int, np.ndarray]] = {}
    why: dict[int, str] = {}
    for r, g in of_rank.items():
        members = [m for m in groups[g.key] if m in local]
        if len(members) != g.size:
            held = ", ".join(map(str, members)) or "none"
            why[r] = (f"its data-parallel group has {g.size} ranks but only rank(s) {held} recorded a local loss: "
                      "the global loss cannot be derived")
            continue
        bf16 = any((dtypes or {}).get(m) == "bfloat16" for m in members)
        shared = set.intersection(*(set(local[m]) for m in members))
        steps = {}
        for s in sorted(shared):
            steps[s] = combine([(m, local[m][s]) for m in members], reduction, bf16)
        out[r] = steps
    return out, why

