"""tracekit: record, diff, inspect and replay distributed PyTorch training runs.

The store format lives in :mod:`tracekit.store`; recording hooks in :mod:`tracekit.recorders`;
the command line in :mod:`tracekit.cli`.
"""

__version__ = "0.1.0"

# recorders/ and cli/ sit beside this package in the repository and ship as tracekit.recorders and
# tracekit.cli through pyproject.toml's package-dir mapping, for regular and editable installs alike:
# nothing here patches the import path.
from tracekit.errors import StoreError, TracekitError

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


from tracekit._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names('tracekit', _LAZY, globals())
