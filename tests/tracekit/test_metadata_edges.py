"""No raw store-metadata key read outside tracekit/store (issue 37, "typed metadata at the store's
edge"): the store parses a store's attributes once into typed records (store/runmeta.py RunMeta,
RankMeta, RankCoords, RunSetup; store/precision.py PrecisionContext; store/trace_events.py
TraceEvent) and every other package reads their fields.

The scan (AST, no import): in tracekit/ outside tracekit/store, and in cli/, a subscript, `.get(...)`
or `in` test on an expression that holds raw attributes: an attribute named in RAW_ATTRS (the
dicts RunStore.run/.meta, RankView.attrs/.coords, RankMeta.run, RankCoords.attrs, a precision
context's fsdp/flags), a call named in RAW_CALLS (the flat dicts of run facts), a `.values()` or
`.items()` of one, or a local name bound to one (assignment or loop). A whole dict handed on
unread (shown or exported as it is: `dict(view.meta.run)`) is not a key read.
"""

from __future__ import annotations

import ast
import os

from tests.paths import REPO
RAW_ATTRS = {"run", "attrs", "meta", "coords", "fsdp", "flags"}
RAW_CALLS = {"run_facts", "run_metadata"}
# Allowed: receivers of those names that are not a store's attributes, and why
NOT_A_STORE = {
    "ds": "an xarray Dataset (the diff view, tracekit/inspect): its attrs and coords are the view's own",
    "_ds": "the same Dataset, held by the accessor",
    "node": "a DataTree node of tracekit.open: xarray coords",
    "ref_v": "an xarray DataArray of one side (inspect/diffview.py): xarray coords",
    "cand_v": "the other side's",
}


def _receiver_allowed(expr: ast.expr) -> bool:
    src = ast.unparse(expr)
    return any(src == n or src.endswith("." + n) for n in NOT_A_STORE)


def raw_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every raw metadata key read in one module's source."""
    tree = ast.parse(source)
    hits = set()
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes:
        bound: set[str] = set()

        def raw(v) -> bool:
            if isinstance(v, ast.Attribute) and v.attr in RAW_ATTRS:
                return not _receiver_allowed(v.value)
            if isinstance(v, ast.Call) and isinstance(v.func, (ast.Attribute, ast.Name)):
                name = v.func.attr if isinstance(v.func, ast.Attribute) else v.func.id
                if name in RAW_CALLS:
                    return True
                return name in ("values", "items") and isinstance(v.func, ast.Attribute) and raw(v.func.value)
            if isinstance(v, ast.Name):
                return v.id in bound
            return isinstance(v, ast.Subscript) and raw(v.value)

        nodes = list(ast.walk(scope))
        for n in nodes:  # names bound to raw attributes, by assignment or as a loop's target
            if isinstance(n, ast.Assign) and raw(n.value):
                bound.update(t.id for t in n.targets if isinstance(t, ast.Name))
            elif isinstance(n, (ast.For, ast.comprehension)) and raw(n.iter):
                bound.update(x.id for x in ast.walk(n.target) if isinstance(x, ast.Name))
        for n in nodes:
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and raw(n.value):
                hits.add((n.lineno, ast.unparse(n)))
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and raw(n.func.value):
                hits.add((n.lineno, ast.unparse(n)))
            elif isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops) and any(
                    raw(c) for c in n.comparators):
                hits.add((n.lineno, ast.unparse(n)))
    return sorted(hits)


def _modules():
    for top in ("tracekit", "cli"):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            rel = os.path.relpath(folder, REPO)
            if rel == os.path.join("tracekit", "store") or rel.startswith(os.path.join("tracekit", "store") + os.sep):
                continue  # the store alone knows the keys
            yield from (os.path.join(rel, f) for f in sorted(files) if f.endswith(".py"))


def test_no_raw_metadata_key_read_outside_the_store():
    found = [f"{path}:{line}: {expr}" for path in _modules()
             for line, expr in raw_reads(open(os.path.join(REPO, path)).read())]
    assert found == [], "read these through the store's typed records (tracekit/store/runmeta.py):\n" + "\n".join(found)


def test_the_scan_finds_the_reads_it_forbids():
    """What catalog.describe and compare/precision did before the typed records, and what is fine."""
    before = '''
def describe(self):
    run = self.store.run
    return {k: run.get(k) for k in ("device", "backend") if run.get(k) is not None}

def compute(ctx, store, view):
    low = {p.get(f) for p in ctx.fsdp.values()}
    tf32 = ctx.flags.get("cuda_matmul_allow_tf32")
    facts = store.run_facts()["mode"]
    ok = "coords" in view.attrs
    return view.meta.coords.rank, ds.attrs["verdict"], dict(view.meta.run)
'''
    # lines 4, 7-10 read raw keys; line 11 reads typed fields, a Dataset's attrs and hands a dict on
    assert [line for line, _ in raw_reads(before)] == [4, 7, 8, 9, 10]
