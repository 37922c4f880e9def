"""Zero-code recording in-process: torch's original entry points and the runner the zero-code tests share (test_zerocode, test_roots)."""

import torch

from tracekit.recorders.zerocode import ZeroCode
from tracekit.store import finalize_store, is_store


ORIGINAL_CALL = torch.nn.Module.__call__
ORIGINAL_BACKWARD = torch.autograd.backward


class ZeroCodeRun:
    """ZeroCode installed for the duration of a with block, as the bootstrap would install it; the
    store is then finalized as `tracekit record` finalizes it (which derives the global loss)."""

    def __init__(self, store, **env):
        self.store = store
        self.zero = ZeroCode({"TRACEKIT_STORE": store, **env})

    def __enter__(self):
        return self.zero.install()

    def __exit__(self, *exc):
        try:
            self.zero._at_exit()
        finally:
            self.zero.stand_down(final=True)
        if self.zero.recorder is not None and exc[0] is None and is_store(self.store):
            finalize_store(self.store, 0)
