"""tracekit: record, diff, inspect and replay distributed PyTorch training runs.

The store format lives in :mod:`tracekit.store`; recording hooks in :mod:`tracekit.recorders`;
the command line in :mod:`tracekit.cli`.
"""

import os as _os

__version__ = "0.1.0"

# In a source checkout, recorders/, cli/ and schemas/ sit beside this package (the layout our user
# asked for) and are mapped into the tracekit namespace by pyproject.toml when installed. Running
# from the checkout itself (cwd on sys.path) finds this folder first, so we extend the package path
# the same way the installer maps it; an installed copy has no such siblings and is left alone.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "recorders", "__init__.py")
):
    __path__.append(_root)  # type: ignore[name-defined]

from tracekit.errors import StoreError, TracekitError  # noqa: E402

# Public names, imported on first use: every recorded worker imports tracekit at start-up (the
# zero-code bootstrap does), and it needs none of the diff or xarray machinery.
_LAZY = {
    "RunStore": "tracekit.store",
    "open_store": "tracekit.store",
    "diff": "tracekit.compare",  # a function: the engine is the tracekit.compare package
    "open": "tracekit.inspect",
    "open_diff": "tracekit.inspect",
}

__all__ = ["RunStore", "StoreError", "TracekitError", "diff", "open", "open_diff", "open_store", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
