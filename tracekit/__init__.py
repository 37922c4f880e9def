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
from tracekit.store import RunStore, open_store  # noqa: E402
from tracekit.compare import diff  # noqa: E402  (a function: the engine is the tracekit.compare package)
from tracekit.inspect import open, open_diff  # noqa: E402,A004 - lazy: xarray/dask load on first call

__all__ = ["RunStore", "StoreError", "TracekitError", "diff", "open", "open_diff", "open_store", "__version__"]
