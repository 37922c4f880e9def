"""How the benches print a figure measured several times: its median, then its range."""

from __future__ import annotations

import statistics


def spread(xs, unit: str = "", digits: int = 3, width: int = 6, scale: float = 1.0) -> str:
    """'median<unit> (min-max)' of `xs` times `scale` ('  0.935 s (0.729-1.075)')."""
    med, lo, hi = statistics.median(xs) * scale, min(xs) * scale, max(xs) * scale
    return f"{med:{width}.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"
