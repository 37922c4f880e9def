"""The human form of a DiffReport: readable tables, ending with the verdict line."""

from __future__ import annotations

import math

from tracekit.compare.alignment import ranges
from tracekit.compare.report import DiffReport, TensorResult
from tracekit.display import shown, terminal_safe
from tracekit.compare.rootcause import render_root_cause
from tracekit.store.kinds import kind_order


def _g(x: float | None) -> str:
    if x is None:
        return "n/a"  # no comparable element: no error to show, not an error of 0
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3e}" if x else "0"


def _m(x: float | None) -> str:
    """A margin (error / bound): two significant digits are enough to see a near-miss."""
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}"


def _cos(x: float | None, digits: int) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _v(x: float) -> str:
    """A value as recorded: enough digits to tell float32 neighbours apart."""
    if isinstance(x, float) and not math.isfinite(x):
        return _g(x)
    if isinstance(x, int):
        return str(x)  # integer data, every digit (int64 beyond 2**53 included)
    return f"{x:.9g}"


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = set(range(len(headers))) if right is None else right
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def fmt(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def _side(d: dict | None) -> str:
    if not d:
        return "-"
    extra = ", ".join(f"{k}={d[k]}" for k in ("device", "backend", "mode", "dtype") if d.get(k) is not None)
    line = f"{d['path']} ({d['ranks']} ranks, {d['steps']} steps{', ' + extra if extra else ''})"
    for r, u in (d.get("unfinished_ranks") or {}).items():
        line += f"\n           rank {r} {u['status']}" + (f": {u['cause']}" if u.get("cause") else "")
    return line


def _precision_lines(precision: dict | None) -> list[str]:
    """Both sides' precision contexts (one line per group of ranks that recorded the same), the facts
    that differ between them, and the rule the tolerances follow (compare/precision.py)."""
    if not precision:
        return []
    from tracekit.store.precision import PrecisionContext

    out = []
    for side in ("ref", "cand"):
        groups = precision["contexts"].get(side) or []
        for g in groups:
            who = "" if len(groups) == 1 else f" rank(s) {', '.join(map(str, g['ranks']))}"
            ctx = g["context"]
            text = "; ".join(PrecisionContext.from_attrs(ctx, side).lines()) if ctx is not None else "not recorded"
            out.append(f"precision {side}{who}: {text}")
    if precision["differs"]:
        out.append(f"precision differs: {', '.join(precision['differs'])}")
    out.append(f"precision rule: {precision['rule']}")
    return out


def _bias_text(report: DiffReport, bias) -> str:
    """The fit a rounding-like kind owes to the compute dtype's own bias (compare/structure.py)."""
    if bias is None:
        return ""
    compute = (report.precision or {}).get("compute") or "the compute dtype"
    what = (f"a scale of {1.0 + bias.size:.5f}" if bias.shape == "scale"
            else f"a shift of {bias.size:+.2e} x the values' rms")
    return (f"; {what} on all ranks at step {bias.step} (z = {bias.z:.0f}) is under {compute}'s unit roundoff "
            f"({bias.floor:.2g}): its arithmetic's own bias")


def _shape_lines(report: DiffReport) -> list[str]:
    """Each kind's error shape (compare/structure.py): systematic, with each run of signatures once
    (its strongest step), rounding-like, or identical."""
    shapes = [s for s in report.shapes.values() if (s.differs or s.signatures) and s.shape != "not fitted"]
    if not shapes:
        return []
    out = ["", "Error shape per kind (fits of cand - ref over each step's tensors: scale, sign flip, shift, "
               "systematic where |z| >= 20 and |rho| >= 0.05; exact or near matches with another step or rank; one rank; "
               "NaN/Inf; docs/DIFF.md):"]
    for shape in sorted(shapes, key=lambda s: (kind_order(s.kind), s.kind)):
        if not shape.signatures:
            out.append(f"  {shape.kind}: {shape.shape} (largest |z| {shape.max_z:.1f}){_bias_text(report, shape.bias)}")
            continue
        runs: dict[tuple, object] = {}
        for sig in shape.signatures:
            key = (sig.shape, sig.tensor, sig.first_step, tuple(sig.ranks))
            if key not in runs or abs(sig.z or 0.0) > abs(runs[key].z or 0.0):
                runs[key] = sig
        for sig in runs.values():
            steps = ", ".join(dict.fromkeys(str(s.step) for s in shape.signatures if (s.shape, s.tensor, s.first_step,
                                            s.ranks) == (sig.shape, sig.tensor, sig.first_step, sig.ranks)))
            out.append(f"  {shape.kind}: {sig.text} (steps {steps})")
    return out


def render(report: DiffReport, max_rows: int = 20) -> str:
    out = [f"reference: {_side(report.ref)}", f"candidate: {_side(report.cand)}"]
    if report.oracle:
        out.append(f"oracle:    {_side(report.oracle)}  (factor {report.options['oracle_factor']:g})")
    out.append(f"alignment: {report.align}" + ("   --exact" if report.options.get("exact") else "")
               + ("   --equal-nan" if report.options.get("equal_nan") else ""))
    out += _precision_lines(report.precision)
    if report.tolerances:
        tols = {}
        for t in report.tolerances:
            tols.setdefault((t["dtype"], t["rtol"], t["atol"], t.get("rel_l2", math.inf), t.get("elementwise", True)),
                            []).append(t["kind"])
        out.append("tolerances: " + "; ".join(
            f"{', '.join(k)} {d}: rtol={r:g} atol={a:g}" + ("" if math.isinf(n) else f" rel_l2={n:.2g}")
            + ("" if e else " (elementwise: NaN/Inf only)")
            for (d, r, a, n, e), k in tols.items()))

    if report.structural:
        title = "Skipped (present on one side only, or mismatched)" if report.usable else "Structural problems"
        out += ["", f"{title}:"] + [f"  - {p.message}" for p in report.structural]
    if report.mixed_dtypes:
        out += ["", "Stored in other float widths (compared as values, under the coarser width's bounds):"]
        out += [f"  - {p.message}" for p in report.mixed_dtypes]
    for n in report.not_comparable:
        out.append(f"not comparable: {n.kind}{' ' + repr(n.tensor) if n.tensor else ''}: {n.reason}")
    if not report.usable:
        out += ["", "Nothing was compared: pass --allow-missing to compare the common part.", report.summary_line]
        return terminal_safe("\n".join(out))

    if report.nothing_compared:
        out += ["", f"Nothing was compared: {report.nothing_compared_reason}.", report.summary_line]
        return terminal_safe("\n".join(out))

    out += ["", "Summary per step and kind (max abs error over finite elements, m= margin: the worst tensor's "
                "error / bound, at most 1 passes; FAIL n: n (rank, tensor) pairs outside tolerance):"]
    kinds = sorted({s.kind for s in report.summary}, key=lambda k: (kind_order(k), k))
    cells: dict[int, dict[str, str]] = {}
    for s in report.summary:
        err = "NaN/Inf" if s.nonfinite else _g(s.max_abs_err)
        cell = f"ok {err}" if s.passed else f"FAIL {s.violating} {err}"
        cells.setdefault(s.step, {})[s.kind] = f"{cell} m={_m(s.margin)}"
    rows = [[str(step), *(cells[step].get(k, "-") for k in kinds)] for step in sorted(cells)]
    out += table(["step", *kinds], rows, right={0})
    out += ["", "Margin per kind (worst tensor over all steps: error / bound, at most 1 passes):"]
    out += table(*_margin_rows(report, kinds), right={1, 2, 3})
    nonfinite = [s for s in report.summary if s.ref_nonfinite or s.cand_nonfinite]
    if nonfinite:
        out += ["", "NaN/Inf elements (n/a marks metrics with no element finite on both sides):"]
        out += [_nonfinite_line(s) for s in nonfinite]

    if report.loss_table:
        out += ["", "Loss:"]
        rows = [[str(r.step), _v(r.ref), _v(r.cand), _g(r.abs_diff), _g(r.rel_diff), "ok" if r.passed else "FAIL"]
                for r in report.loss_table]
        out += table(["step", "ref loss", "cand loss", "abs diff", "rel diff", "verdict"], rows, right={0, 1, 2, 3, 4})

    d = report.first_divergence
    if d is not None:
        m = d.metrics
        out += ["", f"First divergence: step {d.step}, {d.kind}, tensor {d.tensor!r}, "
                    f"rank{'s' if len(d.ranks) > 1 else ''} {ranges(d.ranks)}"]
        if d.signature is not None:
            out.append(f"  {d.signature.text}")
        if len(d.tensors) > 1:
            names = ", ".join(shown(t) for t in d.tensors[:8]) + (", ..." if len(d.tensors) > 8 else "")
            out.append(f"  {len(d.tensors)} {d.kind} tensors outside tolerance: {names}")
        if d.worst is not None:
            w = d.worst
            where = f"rank {d.rank}" + (f" (ref rank {d.ref_rank})" if d.ref_rank != d.rank else "")
            line = f"  worst element {list(w.index)} on {where}: ref={_v(w.ref)} cand={_v(w.cand)} |diff|={_g(w.abs_err)}"
            if w.oracle is not None:
                line += f" oracle={_v(w.oracle)} |cand-oracle|={_g(w.cand_oracle_err)} |ref-oracle|={_g(w.ref_oracle_err)}"
            out.append(line)
        if d.compared_by == "summaries":
            out.append(f"  compared by summaries (a side kept no bytes; see --full): {m.violations} of its statistics "
                       f"(min, max, mean, L2 norm, NaN/Inf counts) outside rtol={m.rtol:g} atol={m.atol:g}"
                       + (f" (NaN/Inf: {m.counts.ref_nan}/{m.counts.ref_inf} in ref, {m.counts.cand_nan}/{m.counts.cand_inf} in cand)"
                          if m.counts else "")
                       + f"; max rel err {_g(m.max_rel_err)}, margin {_m(m.margin)}")
        else:
            out.append(f"  {m.violations}/{m.numel} elements ({m.violation_fraction:.2%}) outside "
                       + (f"oracle rule (factor {m.oracle.factor:g}, atol={m.atol:g})" if m.oracle else f"rtol={m.rtol:g} atol={m.atol:g}")
                       + (f", {m.nonfinite} NaN/Inf" if m.nonfinite else "")
                       + (f" (NaN/Inf: {m.counts.ref_nan}/{m.counts.ref_inf} in ref, {m.counts.cand_nan}/{m.counts.cand_inf} in cand)"
                          if m.counts else "")
                       + f"; max rel err {_g(m.max_rel_err)}, rel L2 err {_g(m.rel_l2_err)}"
                       + (f" (bound {m.rel_l2:.2g}{', outside the norm rule' if m.norm_failed else ''})" if not math.isinf(m.rel_l2) else "")
                       + f", cosine {_cos(m.cosine, 9)}, margin {_m(m.margin)}")

    out += _shape_lines(report)
    out += render_root_cause(report.traces, passed=report.passed)
    bad = report.violations
    if bad:
        groups = group_violations(bad)
        shown_rows = f"the first {max_rows} shown (--max-rows)" if len(groups) > max_rows else "all shown"
        out += ["", f"Violations: {len(bad)} (step, rank, kind, tensor) comparisons outside tolerance, in "
                    f"{len(groups)} row{'s' if len(groups) != 1 else ''}, {shown_rows}; ranks with identical "
                    "results share a row (--json lists every rank):"]
        out += table(*_violation_rows(groups[:max_rows]), right={0, 4, 5, 6, 7, 8, 9})
    if report.stopped_early:
        out += ["", "Stopped after the first violating step (--fail-fast)."]
    if report.drift:
        dr = report.drift
        errs = " -> ".join(_g(e) for e in dr["errors"])
        out += ["", f"Drift or error? The {dr['kind']} errors grow over steps {ranges(dr['steps'])} ({errs}) and the "
                    "candidate is not a replay: legitimate noise amplified by training grows too. A replay gives each "
                    "step's own error (docs/REPLAY.md):", f"  {dr['replay_command']}"]
    if report.compared_by_summaries:
        out += ["", f"Note: compared by summaries: {report.compared_by_summaries} (step, rank, kind, tensor) comparisons "
                    "had no bytes on a side (recorded without matching --full); their min, max, mean, L2 norm and "
                    "NaN/Inf counts were compared, not their elements (docs/DIFF.md)."]
    if report.options.get("trust_index") and report.identical_by_hash:
        out += ["", f"Note: decided by hash: {report.identical_by_hash} (step, rank, kind, tensor) comparisons had equal "
                    "content hashes in the two indexes; their bytes were not read (--check-hashes reads and checks "
                    "them, `tracekit verify STORE` checks a whole store)."]
    out += ["", report.summary_line]
    # names are escaped where they are put in (a newline in one is data, not a line); this sweep
    # catches controls anywhere else (paths, run facts)
    return terminal_safe("\n".join(out))


def _nonfinite_line(s) -> str:
    line = f"  step {s.step} {s.kind}: {s.ref_nonfinite} in ref, {s.cand_nonfinite} in cand, {s.nonfinite} mismatched"
    if s.alike_ranks and s.cand_nonfinite_once < s.cand_nonfinite:
        # one tensor every rank holds alike (gathered, replicated): counted per rank above
        line += (f" (per rank: ranks {ranges(list(s.alike_ranks))} hold the same tensor alike, gathered or "
                 f"replicated: {s.cand_nonfinite_once} counted once, spread to them, not {s.cand_nonfinite} origins)")
    return line


def group_violations(results: list[TensorResult]) -> list[tuple[list[int], TensorResult]]:
    """Join the results that differ only in their rank: (the candidate ranks, the first result), in
    the order of each group's first result. Identical means every metric equal, bit for bit (a
    gradient all-reduced by DDP fails the same way on every rank)."""
    groups: dict[str, tuple[list[int], TensorResult]] = {}
    for r in results:
        groups.setdefault(r.alike_key(), ([], r))[0].append(r.rank)
    return list(groups.values())


def _violation_rows(groups: list[tuple[list[int], TensorResult]]):
    oracle = any(r.metrics.oracle for _, r in groups)
    headers = ["step", "ranks", "kind", "tensor", "violating", "max abs", "max rel", "rel L2", "cosine", "margin",
               "worst (index: ref -> cand)"]
    if oracle:
        headers += ["|cand-oracle|", "|ref-oracle|"]
    rows = []
    for ranks, r in groups:
        m, w = r.metrics, r.metrics.worst
        worst = f"{list(w.index)}: {_v(w.ref)} -> {_v(w.cand)}" if w else "-"
        nf = f", {m.nonfinite} NaN/Inf" if m.nonfinite else ""
        nr = ", norm rule" if m.norm_failed else ""
        row = [str(r.step), ranges(ranks), r.kind, shown(r.tensor), f"{m.violations} ({m.violation_fraction:.1%}{nf}{nr})", _g(m.max_abs_err),
               _g(m.max_rel_err), _g(m.rel_l2_err), _cos(m.cosine, 6), _m(m.margin), worst]
        if oracle:
            row += [_g(m.oracle.cand_max_err), _g(m.oracle.ref_max_err)] if m.oracle else ["-", "-"]
        rows.append(row)
    return headers, rows


def _margin_rows(report: DiffReport, kinds: list[str]):
    """Per kind, the summary row with the largest margin: how close the worst tensor came to its
    bound, and the reduction length its norm bound was derived with (docs/DIFF.md)."""
    rows = []
    for kind in kinds:
        terms = sorted({t["terms"] for t in report.tolerances if t["kind"] == kind and "terms" in t})
        n = ", ".join(map(str, terms)) or "-"
        rs = [s for s in report.summary if s.kind == kind and s.margin is not None]
        if not rs:
            rows.append([kind, "n/a", "-", n, "nothing comparable"])
            continue
        s = max(rs, key=lambda s: s.margin)
        rank, tensor = s.margin_at
        rows.append([kind, _m(s.margin), str(s.step), n, f"{s.margin_rule} rule, {tensor!r} rank {rank}"])
    return ["kind", "margin", "step", "terms", "worst tensor"], rows
