"""Comparing two recorded runs (the parity verdict of `tracekit diff`).

    report = tracekit.diff("runs/ref", "runs/cand")          # tracekit.compare.diff
    report.passed, report.first_divergence, report.loss_table, report.violations, report.to_dict()

Modules, one job each: catalog (a checked snapshot of a store's structure), alignment (which
tensors are compared with which), tolerances (which rtol/atol applies), metrics (closeness and
error metrics of one array pair: `compare_arrays` is public), reading (chunk spans), engine (the
streaming, threaded diff), report (dataclasses), render (the human tables).
"""

from tracekit.compare.alignment import ALIGN_MODES, NotComparable, StructuralProblem
from tracekit.compare.engine import diff
from tracekit.compare.metrics import MetricsAccumulator, OracleMetrics, TensorMetrics, WorstElement, compare_arrays
from tracekit.compare.report import DiffReport, Divergence, KindSummary, LossRow, TensorResult
from tracekit.compare.tolerances import DEFAULT_ORACLE_FACTOR, DTYPE_DEFAULTS, Tolerance, Tolerances

__all__ = [
    "ALIGN_MODES", "DEFAULT_ORACLE_FACTOR", "DTYPE_DEFAULTS", "DiffReport", "Divergence", "KindSummary", "LossRow",
    "MetricsAccumulator", "NotComparable", "OracleMetrics", "StructuralProblem", "TensorMetrics", "TensorResult",
    "Tolerance", "Tolerances", "WorstElement", "compare_arrays", "diff",
]
