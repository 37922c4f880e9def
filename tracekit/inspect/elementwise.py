"""Lazy elementwise views of a diff: |cand - ref|, relative error, and the violation mask.

The mask is torch.isclose, the rule tracekit.compare documents its metrics as (it mirrors
torch.testing.assert_close), evaluated in tracekit.compare.metrics.work_dtype's arithmetic, so a
mask's count of True equals the `violations` the diff reports for the same tolerances (tested).
"""

from __future__ import annotations

import numpy as np

from tracekit.compare.metrics import work_dtype


def _work(x: np.ndarray) -> np.ndarray:
    return x.astype(work_dtype(x.dtype), copy=False)


def abs_err(ref, cand):
    """|cand - ref| in the diff's arithmetic (float32 for float32/bfloat16, float64 otherwise)."""
    import xarray as xr

    return xr.apply_ufunc(lambda a, b: np.abs(_work(b) - _work(a)), ref, cand, dask="allowed")


def rel_err(ref, cand):
    """|cand - ref| / |ref| (inf where ref is 0 and cand is not, NaN where both are 0)."""
    import xarray as xr

    def block(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):  # x / 0 is inf here, by definition
            return np.abs(b - a) / np.abs(a)

    def f(a, b):
        a, b = _work(a), _work(b)
        if hasattr(a, "map_blocks"):  # dask: the division runs at compute time, under the same errstate
            import dask.array as da

            return da.map_blocks(block, a, b, dtype=np.result_type(a.dtype, b.dtype))
        return block(a, b)

    return xr.apply_ufunc(f, ref, cand, dask="allowed")


def _violated_block(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    import torch

    wd = np.result_type(work_dtype(a.dtype), work_dtype(b.dtype))
    ta, tb = torch.from_numpy(np.ascontiguousarray(a, wd)), torch.from_numpy(np.ascontiguousarray(b, wd))
    return ~torch.isclose(tb, ta, rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()


def violated(ref, cand, rtol: float, atol: float, equal_nan: bool = False):
    """True where cand is outside tolerance of ref (lazy when the inputs are dask-backed)."""
    import xarray as xr

    return xr.apply_ufunc(_violated_block, ref, cand, kwargs={"rtol": float(rtol), "atol": float(atol),
                                                              "equal_nan": bool(equal_nan)},
                          dask="parallelized", output_dtypes=[bool])
