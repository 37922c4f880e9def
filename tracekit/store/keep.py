"""Which tensors keep their bytes (`--full`): the others keep only their summary and hash.

A pattern is an fnmatch glob over tensor names ('layers.0.*'), or KIND:GLOB for the tensors of
one kind only ('loss:*', 'parameters:*.weight'); KIND must be a registered kind (a typo is an
error, not a pattern that silently keeps nothing). No pattern at all keeps every tensor's bytes.
A sharded tensor matches by its full name, so all of its pieces keep bytes or none do.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from tracekit.errors import UsageError
from tracekit.store.kinds import KINDS


def parse_full(items) -> tuple[str, ...]:
    """Patterns as given (repeatable, each may be comma-separated) -> a checked tuple."""
    out = []
    for item in items or ():
        for p in str(item).split(","):
            p = p.strip()
            if not p:
                continue
            kind, sep, glob = p.partition(":")
            if sep and kind not in KINDS and not any(c in kind for c in "*?["):
                raise UsageError(f"--full {p!r}: unknown kind {kind!r}; use KIND:GLOB with one of {', '.join(KINDS)}, "
                                 "or a glob over tensor names")
            if sep and kind in KINDS and not glob:
                raise UsageError(f"--full {p!r}: give a glob after the kind, e.g. {kind}:*")
            out.append(p)
    return tuple(out)


def keeps_bytes(patterns, kind: str, name: str) -> bool:
    """Whether tensor `name` of `kind` keeps its bytes under `patterns` (empty: every tensor does)."""
    if not patterns:
        return True
    for p in patterns:
        k, sep, glob = p.partition(":")
        if sep and k in KINDS:
            if k == kind and fnmatchcase(name, glob):
                return True
        elif fnmatchcase(name, p):
            return True
    return False
