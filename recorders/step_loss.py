"""A step's local loss from the scalars its backward() calls ran on (the rule of docs/ZEROCODE.md).

One backward() in a step: its scalar is the loss. Several:
  - a backward whose graph reaches a leaf that requires grad and is not a parameter (a detached
    activation: one chunk of a chunked loss, as torchtitan's ChunkedLossWrapper runs it) is
    *partial*: its scalar is part of a total that a later backward runs on;
  - the others are *whole* (they reach parameters only): gradient accumulation's microbatches,
    or the final backward of a chunked loss, which runs on the already accumulated total.
The step's loss is the sum of the whole ones' scalars; if every one was partial (a chunked loss
whose total is never backwarded), the sum of all of them.
Graphs are only walked when a step has several backward() calls: one costs nothing. The walk
uses each scalar's grad_fn, kept after its backward ran (the graph's saved tensors are freed by
then; the edges and the leaves' AccumulateGrad nodes stay).
"""

from __future__ import annotations

import torch

from tracekit.recorders.coords import is_dtensor


def is_partial(grad_fn) -> bool:
    """Whether the graph below grad_fn reaches a leaf that requires grad and is not a parameter."""
    seen, stack = set(), [grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if leaf is not None and not isinstance(leaf, torch.nn.Parameter):
            return True
        stack.extend(fn for fn, _ in node.next_functions)
    return False


class StepLoss:
    """The scalars backward() ran on since the last training step."""

    def __init__(self):
        self._seen: list[tuple[torch.Tensor, object]] = []  # (detached scalar, its grad_fn)

    def add(self, t: torch.Tensor) -> None:
        value = t.detach()
        if is_dtensor(value) and all(p.is_replicate() for p in value.placements):
            value = value.to_local()  # every rank holds the whole value: taking it needs no collective
        self._seen.append((value.reshape(()), t.grad_fn))

    def take(self) -> torch.Tensor | None:
        """The step's local loss (None: no scalar backward ran), and start the next step."""
        seen, self._seen = self._seen, []
        if not seen:
            return None
        if len(seen) > 1:
            whole = [v for v, fn in seen if fn is None or not is_partial(fn)]
            if whole:
                seen = [(v, None) for v in whole]
        total = seen[0][0]
        for v, _ in seen[1:]:
            total = total + v
        return total
