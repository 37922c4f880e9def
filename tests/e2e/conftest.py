"""tests/e2e/: the tests that launch real workers (torchrun, `tracekit record -- COMMAND`, a training
script), mirrored inside by package. Every test here is marked `torchrun`, so the slow tier is this
folder (`pytest tests/e2e`) or the marker (`-m torchrun`), and the fast tier is `-m "not torchrun"`;
a `torchrun` mark outside this folder fails its test (tests/launch_guard.py)."""

import pytest

from tests.launch_guard import MARKER, in_e2e


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there when it reads them
def pytest_collection_modifyitems(items):
    for item in items:
        if in_e2e(item.path):
            item.add_marker(getattr(pytest.mark, MARKER))
