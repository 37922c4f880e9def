"""Where work shared by every pytest-xdist worker of one test run lives (conftest's `shared_once`,
tests/e2e/conftest.py's `recorded_sample`)."""

from __future__ import annotations

import os
from pathlib import Path


def shared_root(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the workers' basetemps' parent); without
    xdist, this process's own basetemp (the parent would be shared with earlier runs)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
