"""The end of a test script's process as the samples end their ranks (samples/common/quick_exit.py):
imported first, before torch, so that its exit handler runs last; a script whose training returned
then ends with `sys.exit(quick_end.ending(status))` after every exit handler (a recorder's close
included), without Python's teardown of torch (~0.5 CPU-s a process, measured on this 2-core host).
An exception, or a script that never calls ending(), exits as Python does."""

import os
import sys

# tests/cli/scripts -> the repository's samples/ (appended: nothing of the scripts' own is shadowed)
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                             "samples"))

from common.quick_exit import arm, ending  # noqa: E402

arm()

__all__ = ["ending"]
