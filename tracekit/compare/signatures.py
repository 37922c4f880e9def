"""Every signature of a step (compare/structure.py's fits, patterns.py, matches.py), in the order
the first divergence takes them: the most specific first."""

from __future__ import annotations

from tracekit.compare import matches, near, patterns, structure


def matcher(engine, pairs, align: str, read=None):
    """The match search of a step (compare/matches.py) over its rank pairs, by kind; None under
    --align global, whose pairs are not one rank's tensors against another's. read(view, kind,
    step, info) -> a side's whole tensor as numpy values: near matches too (compare/near.py)."""
    if align == "global":
        return None

    def match(step, kind, rs):
        finder = None if read is None else near.NearMatcher(read, engine.tol, engine.equal_nan, engine.ref, engine.cand,
                                                              step, kind)
        return matches.match_signatures(step, kind, [kp for kp in pairs if kp.kind == kind], engine.ref, engine.cand,
                                        rs, finder)
    return match


def step_shapes(step: int, kind: str, rs: list, match=None, floor: float = 0.0,
                biases: list | None = None) -> tuple[list, float, bool]:
    """Every signature of one kind at one step, the most specific first (the first divergence
    names the first): NaN/Inf, exact matches, permuted or transposed rows, a tensor's own sign flip or shift, the kind's scale
    (or sign flip) or shift, one rank. Tensors with a shape of their own are left out of the kind's
    fits (one flipped tensor would pass for a scale of the lot), unless every tensor has one: then
    the kind's fit says it once. `floor` (structure.bias_floor): the size under which an all-rank
    scale or shift is the compute dtype's own bias; such a fit is no signature, and is appended to
    `biases` (structure.Bias)."""
    found: list = []  # the biases of the kind's last scale fit and its shift fit

    def scale(rs_):
        found.clear()
        return structure.step_signature(step, kind, rs_, floor, found)

    sig, max_z, differs = scale(rs)
    sigs = [s for s in (patterns.nonfinite_signature(step, kind, rs),) if s is not None]
    matched = (match(step, kind, rs) if match is not None else []) + patterns.row_signatures(step, kind, rs)
    sigs += matched
    # a value matched exactly elsewhere (or its own rows moved) is explained: fitting it would name
    # its difference a scale
    explained = {m for s in matched for m in s.names}
    rs_fit = [r for r in rs if (r.rank, r.tensor) not in explained] if explained else rs
    if explained:
        sig = scale(rs_fit)[0] if rs_fit else None
    own = structure.tensor_signatures(step, kind, rs_fit)
    flagged = {n for s in own for n in s.names}
    rest = rs_fit
    if not own or flagged == {r.tensor for r in rs_fit} or (sig is not None and sig.shape in {s.shape for s in own}):
        own = []  # the kind's own fit says it once, over all its tensors
    else:
        rest = [r for r in rs_fit if r.tensor not in flagged]
        sig = scale(rest)[0] if rest else None
    fitted = [sig] if sig is not None else []
    if sig is None and rest:
        shift = structure.shift_signature(step, kind, rest, floor, found)
        fitted += [shift] if shift is not None else []
    if not fitted and rest:  # a scale of one rank's shard that the whole tensors' fit cannot see
        region = structure.region_signature(step, kind, rest, floor)
        fitted += [region] if region is not None else []
    sigs += own + fitted
    if not sigs:
        one = patterns.one_rank_signature(step, kind, rs)
        sigs += [one] if one is not None else []
    if biases is not None:
        biases.extend(found)
    return sigs, max_z, differs
