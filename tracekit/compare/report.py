"""The diff report: plain dataclasses the CLI renders and `to_dict()` turns into the JSON report
(schemas/diff-report.schema.json)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracekit.compare.alignment import NotComparable, StructuralProblem
from tracekit.compare.metrics import TensorMetrics, WorstElement, _num

REPORT_FORMAT = 2  # 2: norm rule, margins, nonfinite counts, n/a metrics (null), missing ranges


@dataclass(slots=True)
class TensorResult:
    """One (step, rank, kind, tensor) comparison."""

    step: int
    kind: str
    rank: int  # candidate rank
    ref_rank: int
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    metrics: TensorMetrics
    tolerance_source: str = ""
    oracle_rank: int | None = None
    # how it was decided: "elements" (bytes read), "hash" (equal content hashes) or "summaries"
    # (a side kept no bytes, --full: statistics compared, compare/by_summary.py)
    compared_by: str = "elements"
    # where a failing tensor's error lies (compare/rows.py: permuted rows, transposed, NaN/Inf place)
    layout: dict | None = None

    @property
    def passed(self) -> bool:
        return self.metrics.passed

    def to_dict(self) -> dict:
        return {"step": self.step, "kind": self.kind, "rank": self.rank, "ref_rank": self.ref_rank,
                "oracle_rank": self.oracle_rank, "tensor": self.tensor, "dtype": self.dtype,
                "shape": list(self.shape), "tolerance_source": self.tolerance_source, "compared_by": self.compared_by,
                **self.metrics.to_dict()}

    def alike_key(self) -> str:
        """Equal for two results that differ only in their rank: every metric equal, bit for bit
        (repr: exact floats, and nan equals nan). A tensor every rank holds alike (an all-reduced
        gradient, one assembled from the same shards) gives one key on all of them."""
        fields = self.to_dict()
        for per_rank in ("rank", "ref_rank", "oracle_rank"):
            fields.pop(per_rank)
        return repr(sorted(fields.items()))


@dataclass
class KindSummary:
    """All tensors of one kind at one step, over all ranks."""

    step: int
    kind: str
    tensors: int  # distinct tensor names
    ranks: int
    comparisons: int  # (rank, tensor) pairs compared
    violating: int  # of which outside tolerance
    violating_elements: int
    nonfinite: int  # of which NaN/Inf mismatches
    numel: int
    max_abs_err: float
    max_rel_err: float
    min_cosine: float | None
    max_rel_l2_err: float | None
    margin: float | None = None  # the worst tensor's error / bound (<= 1 passes; None: nothing comparable)
    margin_rule: str | None = None  # elementwise, norm or nonfinite
    margin_at: tuple[int, str] | None = None  # (rank, tensor) of the worst tensor
    ref_nonfinite: int = 0  # NaN + Inf elements in the reference
    cand_nonfinite: int = 0  # NaN + Inf elements in the candidate
    norm_failed: int = 0  # tensors outside the norm rule
    # NaN + Inf elements of the candidate with each tensor that several ranks hold alike (the same
    # result on each: gathered shards, a replicated or all-reduced tensor) counted once, and those
    # ranks: one NaN spread to 4 ranks is 1 here, 4 in cand_nonfinite
    cand_nonfinite_once: int = 0
    alike_ranks: tuple[int, ...] = ()

    @property
    def passed(self) -> bool:
        return self.violating == 0

    def to_dict(self) -> dict:
        return {"step": self.step, "kind": self.kind, "passed": self.passed, "tensors": self.tensors,
                "ranks": self.ranks, "comparisons": self.comparisons, "violating": self.violating,
                "violating_elements": self.violating_elements, "nonfinite": self.nonfinite, "numel": self.numel,
                "max_abs_err": _num(self.max_abs_err), "max_rel_err": _num(self.max_rel_err),
                "min_cosine": _num(self.min_cosine), "max_rel_l2_err": _num(self.max_rel_l2_err),
                "margin": _num(self.margin), "margin_rule": self.margin_rule,
                "margin_at": None if self.margin_at is None else {"rank": self.margin_at[0], "tensor": self.margin_at[1]},
                "ref_nonfinite": self.ref_nonfinite, "cand_nonfinite": self.cand_nonfinite,
                "norm_failed": self.norm_failed, "cand_nonfinite_once": self.cand_nonfinite_once,
                "alike_ranks": list(self.alike_ranks)}


@dataclass
class LossRow:
    step: int
    tensor: str
    rank: int  # the candidate rank the values are taken from (the loss is global: every rank has it)
    ref: float
    cand: float
    passed: bool  # the loss of every rank at this step is within tolerance

    @property
    def abs_diff(self) -> float:
        return abs(self.cand - self.ref)

    @property
    def rel_diff(self) -> float:
        d = self.abs_diff
        if self.ref == 0:
            return 0.0 if d == 0 else math.inf
        return d / abs(self.ref)

    def to_dict(self) -> dict:
        return {"step": self.step, "tensor": self.tensor, "rank": self.rank, "ref": _num(self.ref),
                "cand": _num(self.cand), "abs_diff": _num(self.abs_diff), "rel_diff": _num(self.rel_diff),
                "passed": self.passed}


@dataclass
class Divergence:
    """Where the runs first part: earliest step, first kind in compute order within it."""

    step: int
    kind: str
    tensor: str  # first violating tensor in recorded order
    tensors: list[str]  # every violating tensor of this kind at this step
    ranks: list[int]  # candidate ranks with a violation in this kind at this step
    rank: int  # the rank whose copy of `tensor` is worst
    ref_rank: int
    worst: WorstElement | None
    metrics: TensorMetrics
    compared_by: str = "elements"  # as TensorResult.compared_by
    signature: object = None  # compare.structure.Signature: the error's shape here, when it has one

    def to_dict(self) -> dict:
        return {"step": self.step, "kind": self.kind, "tensor": self.tensor, "tensors": self.tensors,
                "ranks": self.ranks, "rank": self.rank, "ref_rank": self.ref_rank, "compared_by": self.compared_by,
                "worst": self.worst.to_dict() if self.worst else None, "metrics": self.metrics.to_dict(),
                "signature": self.signature.to_dict() if self.signature is not None else None}


@dataclass
class DiffReport:
    ref: dict
    cand: dict
    oracle: dict | None
    align: str
    options: dict
    tolerances: list[dict] = field(default_factory=list)  # what applied, per (kind, dtype)
    precision: dict | None = None  # the precision rule and both sides' contexts (compare/precision.py)
    signatures: list = field(default_factory=list)  # compare.structure.Signature: structured errors (violations)
    shapes: dict = field(default_factory=dict)  # kind -> compare.structure.KindShape over the steps
    drift: dict | None = None  # growing errors and no replay: the command that decides it (compare/drift.py)
    ranks: list[int] = field(default_factory=list)  # candidate ranks compared
    steps: list[int] = field(default_factory=list)  # steps compared (0 = initial parameters)
    results: list[TensorResult] = field(default_factory=list)  # every comparison, or only violations
    summary: list[KindSummary] = field(default_factory=list)
    loss_table: list[LossRow] = field(default_factory=list)
    first_divergence: Divergence | None = None
    structural: list[StructuralProblem] = field(default_factory=list)
    not_comparable: list[NotComparable] = field(default_factory=list)
    mixed_dtypes: list[StructuralProblem] = field(default_factory=list)  # floats stored in other widths: compared
    stopped_early: bool = False  # --fail-fast stopped after the first violating step
    traces: list = field(default_factory=list)  # rootcause.TraceComparison per (rank, step, level) both traced
    bytes_compared: int = 0
    identical_by_hash: int = 0  # tensor comparisons decided by equal content hashes, without reading
    bytes_identical_by_hash: int = 0  # the bytes those comparisons did not need to read (both sides)
    compared_by_summaries: int = 0  # tensor comparisons decided by summaries: a side kept no bytes (--full)
    seconds: float = 0.0

    @property
    def root_cause(self):
        """The root-cause op named from the traces (tracekit.compare.rootcause.RootCause), or None.
        Never under a passing verdict: the values agree, so no op is to blame (trace_difference)."""
        from tracekit.compare.rootcause import first_root_cause

        return None if self.passed else first_root_cause(self.traces)

    @property
    def trace_difference(self):
        """Under a passing verdict, the first difference the traces show (a RootCause), or None."""
        from tracekit.compare.rootcause import first_root_cause

        return first_root_cause(self.traces) if self.passed else None

    # ---- display: short, never every result (a report can hold thousands) -------------------
    def __repr__(self) -> str:
        from tracekit.compare.display import short_repr

        return short_repr(self)

    def _repr_html_(self) -> str:
        from tracekit.compare.display import html_repr

        return html_repr(self)

    # ---- verdict ---------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        """False when structural problems stopped the comparison (allow_missing was not given)."""
        return not (self.structural and not self.options.get("allow_missing"))

    @property
    def violations(self) -> list[TensorResult]:
        """Every (step, rank, kind, tensor) outside tolerance."""
        return [r for r in self.results if not r.passed]

    @property
    def num_violations(self) -> int:
        return sum(s.violating for s in self.summary)

    @property
    def num_compared(self) -> int:
        """(step, rank, kind, tensor) comparisons made."""
        return sum(s.comparisons for s in self.summary)

    @property
    def nothing_compared(self) -> bool:
        """The comparison ran but found no tensor to compare: no verdict can be given, so not PASS."""
        return self.usable and self.num_compared == 0

    @property
    def nothing_compared_reason(self) -> str:
        if self.not_comparable:
            return "not comparable: " + "; ".join(f"{n.kind}{' ' + repr(n.tensor) if n.tensor else ''}: {n.reason}"
                                                  for n in self.not_comparable)
        if self.structural:
            return f"the stores have no step of any tensor in common ({len(self.structural)} difference(s) skipped)"
        return "no step of any tensor is recorded in both stores"

    @property
    def passed(self) -> bool:
        return self.usable and not self.nothing_compared and self.num_violations == 0 and not self.signatures

    @property
    def systematic_only(self) -> list:
        """Signatures where no tensor of the kind and step is outside its bounds: the violations that
        the structure alone finds (a signature beside failing tensors only names their error's shape)."""
        failing = {(s.step, s.kind) for s in self.summary if s.violating}
        return [s for s in self.signatures if (s.step, s.kind) not in failing]

    @property
    def status(self) -> str:
        if not self.usable or self.nothing_compared:
            return "error"
        return "pass" if self.passed else "fail"

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "error": 2}[self.status]

    @property
    def num_steps(self) -> int:
        """Training steps compared (numbered from 1; the initial parameters, step 0, not counted)."""
        return sum(1 for s in self.steps if s > 0)

    @property
    def missing(self) -> list[dict]:
        """What --allow-missing left out: per structural problem, the side lacking it, the (rank,
        kind, step) ranges ([first, last] pairs; steps None = every step) and the tensor."""
        if not self.options.get("allow_missing"):
            return []
        out = []
        for p in self.structural:
            out.append({"problem": p.problem, "side": p.side, "ranks": _spans(p.ranks), "kinds": p.kinds,
                        "steps": _spans(p.steps) if p.problem == "missing_steps" else None, "tensor": p.tensor})
        return out

    @property
    def missing_counts(self) -> dict[str, int]:
        """How much of the stores --allow-missing left out, by what is missing (only nonzero counts):
        missing_ranks, missing_kinds, missing_steps (distinct steps from 1), missing_tensors, mismatched."""
        if not self.options.get("allow_missing"):
            return {}
        ranks, kinds, steps, tensors, mismatched = set(), set(), set(), set(), set()
        for p in self.structural:
            if p.problem == "missing_rank":
                ranks.update((p.side, r) for r in p.ranks)
            elif p.problem == "missing_kind":
                kinds.update((p.side, r, k) for r in p.ranks for k in p.kinds)
            elif p.problem == "missing_steps":
                steps.update(s for s in p.steps if s > 0)
            elif p.problem == "missing_tensor":
                tensors.update((p.side, k, p.tensor) for k in p.kinds)
            else:
                mismatched.update((k, p.tensor) for k in p.kinds)
        counts = {"missing_ranks": len(ranks), "missing_kinds": len(kinds), "missing_steps": len(steps),
                  "missing_tensors": len(tensors), "mismatched": len(mismatched)}
        return {k: v for k, v in counts.items() if v}

    @property
    def summary_line(self) -> str:
        if self.nothing_compared:
            return f"ERROR comparison ranks={len(self.ranks)} compared=0: {self.nothing_compared_reason}"
        if self.status == "error":
            return f"ERROR comparison ranks={len(self.ranks)} structural_problems={len(self.structural)}"
        line = f"{self.status.upper()} comparison ranks={len(self.ranks)} steps={self.num_steps}"
        if self.status == "fail":
            line += f" violations={self.num_violations}"
            if self.systematic_only:  # structured errors where every tensor is in bounds
                line += f" systematic={len(self.systematic_only)}"
            line += f" first_step={self.first_divergence.step}"
        # a partial comparison says so: a plain PASS is for complete comparisons only
        line += "".join(f" {k}={v}" for k, v in self.missing_counts.items())
        # nor for one that judged some tensors by their summaries, not their elements
        if self.compared_by_summaries:
            line += f" by_summaries={self.compared_by_summaries}"
        return line

    def to_dict(self) -> dict:
        return {
            "format": REPORT_FORMAT,
            "status": self.status,
            "passed": self.passed,
            "summary_line": self.summary_line,
            "ref": self.ref, "cand": self.cand, "oracle": self.oracle,
            "align": self.align,
            "options": self.options,
            "tolerances": [{**t, "rel_l2": _num(t.get("rel_l2", math.inf))} for t in self.tolerances],
            "precision": self.precision,
            "drift": self.drift,
            "structure": {"signatures": [s.to_dict() for s in self.signatures],
                          "kinds": [k.to_dict() for k in self.shapes.values()]} if self.shapes else None,
            "ranks": self.ranks,
            "steps": self.steps,
            "violations": self.num_violations,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "summary": [s.to_dict() for s in self.summary],
            "loss_table": [r.to_dict() for r in self.loss_table],
            "results": [r.to_dict() for r in self.results],
            "structural": [p.to_dict() for p in self.structural],
            "skipped": [p.to_dict() for p in self.structural] if self.options.get("allow_missing") else [],
            "missing": self.missing,
            "missing_counts": self.missing_counts,
            "not_comparable": [n.to_dict() for n in self.not_comparable],
            "mixed_dtypes": [p.to_dict() for p in self.mixed_dtypes],
            "stopped_early": self.stopped_early,
            "traces": [t.to_dict() for t in self.traces],
            "root_cause": rc.to_dict() if (rc := self.root_cause) is not None else None,
            "trace_difference": td.to_dict() if (td := self.trace_difference) is not None else None,
            "stats": {"bytes_compared": self.bytes_compared, "identical_by_hash": self.identical_by_hash,
                      "bytes_identical_by_hash": self.bytes_identical_by_hash,
                      "compared_by_summaries": self.compared_by_summaries,
                      "seconds": round(self.seconds, 3)},
        }


def _spans(values) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]."""
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out
