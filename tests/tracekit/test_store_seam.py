"""Nothing outside tracekit/store knows how a store lays its bytes out (issue 37, "one read model"):
readers ask the store for tensors, regions of them, their saved pieces (regions and digests) and
batches of element ranges (store/planner.py, store/segments.py); rows, chunks, packs, offsets into
packed rows and format versions are the store's.

The scan (AST, no import), over tracekit/ outside tracekit/store, cli/ and recorders/:
- no import of the store's physical modules (PHYSICAL_MODULES);
- no use of a store-private member of a rank view or store from outside: an attribute whose name
  starts with `_` and is one of RankView's (store/reader.py, store/formats/index.py: its methods
  and the fields it sets) or RunStore's, on any receiver but `self`/`cls` (whose own class is not
  a store class).
"""

from __future__ import annotations

import ast
import os

from tests.paths import REPO

# what only the store's readers may know: packed rows and their chunk files, packs, objects, and
# the per-format readers
PHYSICAL_MODULES = ("tracekit.store.rows", "tracekit.store.chunks", "tracekit.store.packs",
                    "tracekit.store.objects", "tracekit.store.formats", "tracekit.store.format",
                    "tracekit.store.local_bytes", "tracekit.store.object_bytes", "tracekit.store.localmeta")
STORE_CLASSES = {os.path.join("tracekit", "store", "reader.py"): ("RankView", "RunStore"),
                 os.path.join("tracekit", "store", "formats", "index.py"): ("HashedIndex",)}


def store_private_names() -> set[str]:
    """The `_`-prefixed methods and fields of RankView (with its index mixin) and RunStore."""
    names = set()
    for path, classes in STORE_CLASSES.items():
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes):
            for n in ast.walk(cls):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_") \
                        and not n.name.startswith("__"):
                    names.add(n.name)
                elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                        and n.value.id == "self" and n.attr.startswith("_")):
                    names.add(n.attr)
    return names


def physical_uses(source: str, private: set[str]) -> list[tuple[int, str]]:
    """(line, what) of each physical import and store-private member use in one module's source."""
    hits = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module:
            mods = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
        elif isinstance(n, ast.Import):
            mods = [a.name for a in n.names]
        else:
            mods = []
        for m in mods:
            if any(m == p or m.startswith(p + ".") for p in PHYSICAL_MODULES):
                hits.append((n.lineno, f"imports {m}"))
                break
        if (isinstance(n, ast.Attribute) and n.attr in private
                and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
            hits.append((n.lineno, ast.unparse(n)))
    return sorted(set(hits))


def _modules():
    store = os.path.join("tracekit", "store")
    for top in ("tracekit", "cli", "recorders"):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            rel = os.path.relpath(folder, REPO)
            if rel == store or rel.startswith(store + os.sep):
                continue  # the store alone knows its layout
            yield from (os.path.join(rel, f) for f in sorted(files) if f.endswith(".py"))


def test_nothing_outside_the_store_knows_its_layout():
    private = store_private_names()
    found = [f"{path}:{line}: {what}" for path in _modules()
             for line, what in physical_uses(open(os.path.join(REPO, path)).read(), private)]
    assert found == [], "ask the store for tensors, regions, pieces (store/planner.py, store/segments.py):\n" + "\n".join(found)


def test_the_scan_finds_the_uses_it_forbids():
    """What compare/engine.py, catalog.py and pieces.py did before the engine read through the
    store's plans, and what is fine."""
    private = store_private_names()
    assert {"_row", "_storage_array", "_step_rows", "_locate", "_row_digests", "_check_finite_flag"} <= private
    before = '''
from tracekit.store.rows import Buffers, RowReader
from tracekit.store import objects
import tracekit.store.formats.v1

def unit(ref_rc, view, kind, key, step, p):
    width = view._storage_array(kind, key).chunks[1]
    row = view._step_rows(kind)[step]
    view._check_finite_flag(kind, p.row, 0, True, "here")
    return view.store._views
'''
    found = physical_uses(before, private)
    assert [line for line, _ in found] == [2, 3, 4, 7, 8, 9, 10], found
    fine = '''
from tracekit.store.planner import PieceReader
from tracekit.store.segments import SegmentReader, read_units

class Mine:
    def __init__(self):
        self._row = 0
        self._lock = None

def read(view, kind, step, name):
    return view.read_region(kind, step, name), view.saved_pieces(kind, step, name)
'''
    assert physical_uses(fine, private) == []
