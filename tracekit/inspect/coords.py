"""Rank coordinates (dp_rank, tp_rank, mesh positions, ...) as columns along the `rank` dim."""

from __future__ import annotations

from tracekit.store.runmeta import RankCoords

# Always shown per rank, even when constant, because users select on them.
_ALWAYS = ("local_rank", "dp_rank", "tp_rank")
# Whole-run facts: constant by construction, so they go to attrs instead of cluttering coords.
_RUN_WIDE = ("world_size", "dp_degree", "tp_degree")


def _mesh_coords(coords: RankCoords, n_meshes: int) -> dict[str, int]:
    out = {}
    for i, mesh in enumerate(coords.meshes):
        prefix = "mesh" if n_meshes == 1 else f"mesh{i}"
        for dim, pos in zip(mesh.dim_names, mesh.coordinate):
            out[f"{prefix}_{dim}"] = pos
    return out


def rank_columns(per_rank: dict[int, RankCoords]) -> tuple[dict[str, list], dict]:
    """{rank: its coordinates} -> (columns along rank, run-wide attrs).

    Columns: the scalar integer coordinates that vary over ranks or that users select on
    (dp_rank, tp_rank, local_rank), and mesh positions `mesh_<dim>` (`mesh<i>_<dim>` when a rank
    lives in several meshes). Missing values read -1, never a silent 0.
    """
    ranks = list(per_rank)
    n_meshes = max((len(c.meshes) for c in per_rank.values()), default=0)
    flat = {}
    for r in ranks:
        c = per_rank[r]
        row = dict(c.integers)
        row.update(_mesh_coords(c, n_meshes))
        flat[r] = row
    keys: list[str] = []
    for r in ranks:
        keys += [k for k in flat[r] if k not in keys]
    columns, attrs = {}, {}
    for k in keys:
        values = [flat[r].get(k, -1) for r in ranks]
        if k in _RUN_WIDE and len(set(values)) == 1:
            attrs[k] = values[0]
        elif k in _ALWAYS or k.startswith("mesh") or len(set(values)) > 1:
            columns[k] = values
        else:
            attrs[k] = values[0]
    meshes = next((c.meshes for c in per_rank.values() if c.meshes), None)
    if meshes:
        attrs["meshes"] = [{"dim_names": list(m.dim_names), "shape": list(m.shape)} for m in meshes]
    return columns, attrs
