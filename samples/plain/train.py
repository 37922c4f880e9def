"""The reference workload with no tracekit code at all (record it from the outside, zero-code).

    torchrun --standalone --nproc-per-node=2 samples/plain/train.py --parallelism ddp

Same model, data, modes and flags as samples/tutorial/train.py, minus the Recorder lines.
"""

import os
import sys

# torchrun runs this file as a script: sys.path holds samples/plain, not samples/ or the repo
# root, so put samples/ first to make the shared `common` package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import quick_exit  # noqa: E402

if __name__ == "__main__":
    quick_exit.arm()  # before torch is imported: the first exit handler registered runs last

from common.config import parse_config  # noqa: E402
from common.loop import Workload, run  # noqa: E402


def train(workload: Workload) -> None:
    for step in range(1, workload.config.steps + 1):
        result = workload.forward_backward(step)
        workload.optimizer_step(step)
        workload.report(step, result)


def main() -> int:
    config = parse_config(description="Reference distributed training workload (no tracekit).")
    return run(config, train)


if __name__ == "__main__":
    sys.exit(quick_exit.ending(main()))  # ends without Python's teardown once the exit handlers ran
