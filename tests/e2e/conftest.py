"""tests/e2e/: the tests that launch real workers (torchrun, `tracekit record -- COMMAND`, a training
script), mirrored inside by package. Every test here is marked `torchrun`, so the slow tier is this
folder (`pytest tests/e2e`) or the marker (`-m torchrun`), and the fast tier is `-m "not torchrun"`;
the root conftest refuses a `torchrun` mark outside this folder."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there when it reads them
def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.torchrun)
