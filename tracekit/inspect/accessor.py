"""`ds.tracekit`: the common questions about an `open_diff` Dataset, answered as `tracekit diff` would."""

from __future__ import annotations

import numpy as np
import xarray as xr

from tracekit.errors import UsageError


@xr.register_dataset_accessor("tracekit")
class TracekitDiffAccessor:
    """Registered on every Dataset; meaningful on what tracekit.open_diff returns."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def _need(self, *names):
        missing = [n for n in names if n not in self._ds.variables and n not in self._ds.attrs]
        if missing:
            raise UsageError(f"this Dataset does not come from tracekit.open_diff (no {', '.join(missing)})")

    # ---- the verdict -------------------------------------------------------------------------
    @property
    def verdict(self) -> str:
        """'PASS', 'FAIL' (or 'ERROR'), as `tracekit diff` prints it."""
        self._need("verdict")
        return self._ds.attrs["verdict"]

    def first_divergence(self) -> dict | None:
        """Where the runs first part, exactly as `tracekit diff` reports it: earliest step, first kind
        in compute order, first violating tensor, its worst rank and worst element.

        {'step', 'rank', 'ref_rank', 'kind', 'name', 'tensor' ('kind/name'), 'index' (tuple),
         'ref', 'cand', 'abs_err', 'ranks' (every violating rank there), 'tensors', 'signature' (the
         structured error's one line, e.g. 'systematic: deltas = 1.0100 x reference ...', or None)}; None on PASS.
        """
        self._need("first_divergence")
        fd = self._ds.attrs["first_divergence"]
        if fd is None:
            return None
        worst = fd.get("worst") or {}
        return {"step": fd["step"], "rank": fd["rank"], "ref_rank": fd["ref_rank"], "kind": fd["kind"],
                "name": fd["tensor"], "tensor": f"{fd['kind']}/{fd['tensor']}",
                "index": tuple(worst.get("index") or ()), "ref": worst.get("ref"), "cand": worst.get("cand"),
                "abs_err": worst.get("abs_err"), "ranks": fd["ranks"], "tensors": fd["tensors"],
                "signature": (fd.get("signature") or {}).get("text")}

    # ---- traces: the root-cause op -------------------------------------------------------------------
    def root_cause(self) -> dict | None:
        """The root-cause op `tracekit diff` names from the stores' traces (see docs/LOCATE.md):
        {'step', 'rank', 'level', 'kind', 'phase', 'module', 'op', 'call', 'src', 'reason', 'inputs',
        'outputs', 'metrics', 'chain', ...}; None when neither store traced a common step or no
        paired event went wrong."""
        self._need("root_cause")
        return self._ds.attrs["root_cause"]

    def events(self, rank: int | None = None, step: int | None = None, level: str = "ops") -> xr.Dataset:
        """The candidate's traced events of one (rank, step) as a Dataset along `event` (execution
        order): coordinates phase, module, op, call; variables paired, status (ok/bad/suspect/unknown,
        or opaque: made where the traces do not pair one to one), rel_l2_err and max_stat_abs_err of
        the first output against the reference, root_cause (bool).
        rank and step default to those of the root cause, else the first traced pair."""
        self._need("traces")
        traces = [t for t in self._ds.attrs["traces"] if t["level"] == level]
        rc = self._ds.attrs.get("root_cause")
        if rank is None and step is None and rc is not None and rc["level"] == level:
            rank, step = rc["rank"], rc["step"]
        chosen = [t for t in traces if (rank is None or t["rank"] == rank) and (step is None or t["step"] == step)]
        if not chosen:
            raise UsageError(f"no {level} traces of rank {rank} step {step} in both stores")
        t = chosen[0]
        ev = t["events"]
        coords = {"event": [e["index"] for e in ev]}
        for k in ("phase", "module", "op", "call"):
            coords[k] = ("event", [e[k] for e in ev])
        data = {k: ("event", np.array([e[k] for e in ev])) for k in ("paired", "status", "rel_l2_err",
                                                                        "max_stat_abs_err", "root_cause")}
        return xr.Dataset(data, coords=coords, attrs={"rank": t["rank"], "ref_rank": t["ref_rank"],
                                                      "step": t["step"], "level": level})

    # ---- counts under any tolerance ---------------------------------------------------------------
    def violations(self, rtol: float | None = None, atol: float | None = None, **diff_kwargs) -> xr.DataArray:
        """Violating elements per (rank, step, tensor).

        Without arguments: the counts of the diff this Dataset holds. With rtol/atol (or any other
        tracekit.compare.diff option, e.g. tol={"loss": (1e-4, 1e-6)}): the diff is run again on the
        same stores with those tolerances (and the original options otherwise), so the counts are
        exactly what `tracekit diff --rtol R --atol A` would report.
        """
        self._need("violations", "ref", "cand")
        if rtol is None and atol is None and not diff_kwargs:
            return self._ds["violations"]
        from tracekit.inspect.diffview import open_diff

        kwargs = {**self._ds.attrs.get("diff_kwargs", {}), **diff_kwargs}
        if rtol is not None:
            kwargs["rtol"] = rtol
        if atol is not None:
            kwargs["atol"] = atol
        again = open_diff(self._ds.attrs["ref"], self._ds.attrs["cand"], **kwargs)
        return again["violations"]

    def failing(self) -> xr.DataArray:
        """Boolean (rank, step, tensor): compared and outside tolerance (elementwise or norm rule)."""
        self._need("passed", "compared")
        return self._ds["compared"] & ~self._ds["passed"]

    def worst(self, n: int = 10, by: str = "max_rel_err") -> list[dict]:
        """The n worst (rank, step, tensor) comparisons by a metric (violating ones first)."""
        self._need(by, "violations")
        ds = self._ds
        metric = ds[by].values
        viol = np.nan_to_num(ds["violations"].values)
        order = []
        for idx in zip(*np.nonzero(~np.isnan(metric))):
            val = metric[idx]
            order.append(((viol[idx] > 0), -val if by == "cosine" else val, idx))
        order.sort(key=lambda t: (t[0], t[1]), reverse=True)
        out = []
        for _, _, (i, j, k) in order[:n]:
            out.append({"rank": int(ds["rank"].values[i]), "step": int(ds["step"].values[j]),
                        "tensor": str(ds["tensor"].values[k]), by: float(metric[i, j, k]),
                        "violations": int(viol[i, j, k])})
        return out

    # ---- elementwise, lazy ----------------------------------------------------------------------
    def _key(self, tensor: str) -> str:
        keys = [str(k) for k in self._ds["tensor"].values]
        if tensor in keys:
            return tensor
        hits = [k for k in keys if k.split("/", 1)[1] == tensor]
        if len(hits) == 1:
            return hits[0]
        raise UsageError(f"no tensor {tensor!r} in this diff" + (f" (ambiguous: {', '.join(hits)})" if hits else
                                                                  f"; tensors: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"))

    def values(self, tensor: str) -> xr.Dataset:
        """Lazy (ref, cand, abs_err, rel_err, violated) of one tensor over (rank, step, its dims).

        `violated` uses the tolerance the diff applied to this tensor; elements of (rank, step)
        pairs that were not compared are never violated.
        """
        from tracekit.inspect.diffview import _aligned, _stacked, error_dims
        from tracekit.inspect.elementwise import abs_err, rel_err, violated
        from tracekit.inspect.opener import open_tree

        self._need("ref", "cand", "ref_rank")
        key = self._key(tensor)
        ds = self._ds
        kind, name = key.split("/", 1)
        ranks, steps = [int(r) for r in ds["rank"].values], [int(s) for s in ds["step"].values]
        ref_rank = ds["ref_rank"].sel(tensor=key)
        ref_tree, cand_tree = open_tree(ds.attrs["ref"], kinds=kind), open_tree(ds.attrs["cand"], kinds=kind)
        if not (_stacked(ref_tree, kind, name) and _stacked(cand_tree, kind, name)):
            raise UsageError(f"{key} has a different shape on different ranks, so it has no elementwise view over "
                             f"ranks; read it per rank with tracekit.open(...)[{kind!r}][{name + '@rank0'!r}]")
        ref_v, cand_v = _aligned(ref_tree, cand_tree, kind, name, ref_rank, ranks, steps)
        dims = ("rank", "step", *error_dims(key, ref_v.ndim - 2))
        ref_v, cand_v = ref_v.rename(dict(zip(ref_v.dims, dims))), cand_v.rename(dict(zip(cand_v.dims, dims)))
        rtol, atol = float(ds["rtol"].sel(tensor=key)), float(ds["atol"].sel(tensor=key))
        equal_nan = bool((ds.attrs.get("options") or {}).get("equal_nan", False))
        compared = ds["compared"].sel(tensor=key, drop=True)
        return xr.Dataset({
            "ref": ref_v, "cand": cand_v, "abs_err": abs_err(ref_v, cand_v), "rel_err": rel_err(ref_v, cand_v),
            "violated": violated(ref_v, cand_v, rtol, atol, equal_nan) & compared,
        }, attrs={"tensor": key, "rtol": rtol, "atol": atol})

    def error(self, tensor: str, relative: bool = False) -> xr.DataArray:
        """Lazy |cand - ref| (or |cand - ref| / |ref|) of one tensor over (rank, step, its dims)."""
        from tracekit.inspect.diffview import error_var

        key = self._key(tensor)
        if not relative and error_var(key) in self._ds:
            return self._ds[error_var(key)]
        return self.values(key)["rel_err" if relative else "abs_err"]

    def violated(self, tensor: str) -> xr.DataArray:
        """Lazy boolean mask of the violating elements of one tensor, under the diff's tolerance."""
        return self.values(tensor)["violated"]

    def _check_at(self, step, rank) -> None:
        """UsageError (one line) for a step or rank this diff does not have, instead of pandas' KeyError."""
        for dim, value in (("step", step), ("rank", rank)):
            have = [int(x) for x in self._ds[dim].values]
            if value not in have:
                span = f"{have[0]}-{have[-1]}" if have == list(range(have[0], have[-1] + 1)) else ", ".join(map(str, have))
                raise UsageError(f"no {dim} {value!r} in this diff ({dim}s: {span or 'none'})")

    def locate(self, tensor: str, step: int, rank: int) -> dict:
        """The worst violating element of one tensor at (step, rank), as the diff picks it: the
        largest |cand - ref| among violating elements (else among all). {'index', 'ref', 'cand', 'abs_err'}."""
        self._need("step", "rank")
        key = self._key(tensor)
        self._check_at(step, rank)
        v = self.values(key).sel(step=step, rank=rank).compute()
        err = v["abs_err"].where(v["violated"]) if bool(v["violated"].any()) else v["abs_err"]
        if err.ndim == 0:
            where: dict = {}
        else:
            where = {d: int(i) for d, i in err.fillna(-np.inf).argmax(...).items()}
        return {"index": tuple(where[d] for d in err.dims), "ref": float(v["ref"].isel(where)),
                "cand": float(v["cand"].isel(where)), "abs_err": float(v["abs_err"].isel(where))}
