"""Where a dump file's rank, step and kind come from: its tracekit metadata, else its path.

The path rules (documented in docs/INTERCHANGE.md), applied to the path relative to SRC:
  rank  the last `rank<N>` (also rank_N, rank-N); none: rank 0
  step  the last `step<N>` (also iter<N>, iteration<N>); none: an error
  kind  the last known kind name (or alias) standing as a word; none: the default kind
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracekit.store.kinds import KINDS

KIND_NAMES = KINDS
ALIASES = {"grads": "gradients", "grad": "gradients", "params": "parameters", "weights": "parameters",
           "output": "outputs"}
TENSOR_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")

_RANK = re.compile(r"(?<![a-z])rank[_-]?(\d+)")
_STEP = re.compile(r"(?<![a-z])(?:step|iteration|iter)[_-]?(\d+)")
# longest names first, so local_loss is not read as loss
_WORDS = sorted(KIND_NAMES + tuple(ALIASES), key=len, reverse=True)
_KIND = re.compile(r"(?<![a-z])(" + "|".join(map(re.escape, _WORDS)) + r")(?![a-z])")


@dataclass(frozen=True)
class FileKey:
    rank: int
    step: int | None  # None: the path names no step
    kind: str | None  # None: the path names no kind


def parse_path(relpath: str) -> FileKey:
    """Rank, step and kind named by a file's path relative to the dump folder."""
    path = relpath.replace("\\", "/").lower()
    for suffix in TENSOR_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    ranks = _RANK.findall(path)
    steps = _STEP.findall(path)
    kinds = _KIND.findall(path)
    kind = kinds[-1] if kinds else None
    return FileKey(
        rank=int(ranks[-1]) if ranks else 0,
        step=int(steps[-1]) if steps else None,
        kind=ALIASES.get(kind, kind),
    )
