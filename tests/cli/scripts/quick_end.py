"""The end of a test script's process as the samples end their ranks (samples/common/quick_exit.py):
imported first, before torch, so that its exit handler runs last; a script whose training returned
then ends with `sys.exit(quick_end.ending(status))` after every exit handler (a recorder's close
included), without Python's teardown of torch and tracekit (measured on this 2-core host, 3 runs
each: `tracekit record -- python tiny_train.py --steps 3` 5.7-7.0 -> 4.7-5.2 CPU-s, plain_tiny_train.py
recorded zero-code 5.6-7.2 -> 4.8-5.6 CPU-s, the launcher and writer included).
An exception, or a script that never calls ending(), exits as Python does."""

import os
import sys

# tests/cli/scripts -> the repository's samples/ (appended: nothing of the scripts' own is shadowed)
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                             "samples"))

from common.quick_exit import arm, ending  # noqa: E402

arm()

__all__ = ["ending"]
