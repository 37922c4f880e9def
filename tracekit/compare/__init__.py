"""Comparing two recorded runs (the parity verdict of `tracekit diff`).

    report = tracekit.diff("runs/ref", "runs/cand")          # tracekit.compare.diff
    report.passed, report.first_divergence, report.loss_table, report.violations, report.to_dict()

Modules, one job each: catalog (a checked snapshot of a store's structure), alignment (which
tensors are compared with which), tolerances (which rtol/atol applies), precision (the lowest
precision either run computed in), metrics (closeness and error metrics of one array pair:
`compare_arrays` is public), engine (the streaming, threaded diff), pieces (format 2 tensors region
by region), by_summary (tensors whose bytes were not kept), readahead, distributed (the diff on
dask.distributed), drift and structure (what a FAIL's errors look like), traces, trace_alignment
and rootcause (the root-cause op), report (dataclasses), render and display (the human forms).
"""

# Public names, imported on first use: `tracekit diff --help` needs only the option constants
# (tracekit.compare.options), not the engine, the store reader or zarr.
_LAZY = {
    "ALIGN_MODES": "options", "DEFAULT_ORACLE_FACTOR": "options",
    "NotComparable": "alignment", "StructuralProblem": "alignment",
    "diff": "engine",
    "MetricsAccumulator": "metrics", "OracleMetrics": "metrics", "TensorMetrics": "metrics",
    "WorstElement": "metrics", "compare_arrays": "metrics",
    "DiffReport": "report", "Divergence": "report", "KindSummary": "report", "LossRow": "report",
    "TensorResult": "report",
    "DTYPE_DEFAULTS": "tolerances", "Tolerance": "tolerances", "Tolerances": "tolerances",
}

__all__ = [
    "ALIGN_MODES", "DEFAULT_ORACLE_FACTOR", "DTYPE_DEFAULTS", "DiffReport", "Divergence", "KindSummary", "LossRow",
    "MetricsAccumulator", "NotComparable", "OracleMetrics", "StructuralProblem", "TensorMetrics", "TensorResult",
    "Tolerance", "Tolerances", "WorstElement", "compare_arrays", "diff",
]


from tracekit._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names('tracekit.compare', {k: f"tracekit.compare.{v}" for k, v in _LAZY.items()}, globals())
