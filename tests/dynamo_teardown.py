"""Release torch.compile's state when the session ends (tests/conftest.py's pytest_unconfigure calls
release_dynamo()).

Tests that call torch.compile in the test process leave dynamo's cleanup hooks armed: weakref
callbacks (torch._dynamo.utils.CleanupManager) that fire when a compiled code object dies. Left
for interpreter teardown, they fire after the module globals they use were set to None, and
torch 2.14.1 prints `Exception ignored in: <function ExactWeakKeyDictionary.__setitem__.<locals>.<lambda>
...> AttributeError: 'NoneType' object has no attribute 'pop'` at the exit of a green run
(issue 38). So, while the interpreter is whole: torch._dynamo.reset() frees the compiled code it
caches (their hooks run now, normally), and the hooks of code that outlives it (a resume function
held by a module's globals) are disarmed: the process ends, so the globals they would delete go too.
Measured on torch 2.14.1: tests/recorders' compiling tests left 6 hooks armed at session end (resume
functions in torch.optim.optimizer's globals, llama_like's compiled blocks), 0 with the release.
Until issue 38's fix, conftest imported this module's hook as `pytest_unconfigure` and then defined
its own function of that name below it, so pytest saw only the second: the release never ran in
the suite (tests/test_dynamo_teardown.py now runs the real conftest, not this module alone).
"""

from __future__ import annotations

import sys


def armed_cleanup_hooks() -> int:
    """How many dynamo cleanup hooks would still fire when their code objects die (0 without dynamo)."""
    utils = sys.modules.get("torch._dynamo.utils")
    manager = getattr(getattr(utils, "CleanupManager", None), "instance", None)
    return len(getattr(manager, "refs", ()))


def release_dynamo() -> None:
    """torch._dynamo.reset(), then disarm the cleanup hooks left; nothing when dynamo was never imported."""
    if "torch._dynamo" not in sys.modules:  # no test compiled: nothing to release, and no import of it now
        return
    import torch._dynamo

    torch._dynamo.reset()
    manager = getattr(getattr(sys.modules.get("torch._dynamo.utils"), "CleanupManager", None), "instance", None)
    if manager is not None:
        manager.clear()  # drops the weakrefs, so their callbacks never run at teardown
