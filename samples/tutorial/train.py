"""The reference workload, recorded with tracekit's Recorder.

    tracekit record -o STORE -- torchrun --standalone --nproc-per-node=2 samples/tutorial/train.py --parallelism ddp

Without a configured store (TRACEKIT_STORE, set by `tracekit record`) the Recorder is a
pass-through and this is exactly samples/plain/train.py.
"""

import os
import sys

# torchrun runs this file as a script: sys.path holds samples/tutorial only. Put samples/ first
# (for the shared `common` package) and, behind it, the repository root so a source checkout's
# tracekit is importable without installing it (an installed tracekit is found either way).
_SAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _SAMPLES)
sys.path.append(os.path.dirname(_SAMPLES))

from common import quick_exit  # noqa: E402

if __name__ == "__main__":
    quick_exit.arm()  # before torch is imported: the first exit handler registered runs last

from common.config import parse_config  # noqa: E402
from common.loop import Workload, run  # noqa: E402

from tracekit.recorders import Recorder  # noqa: E402


def train(workload: Workload) -> None:
    recorder = Recorder(workload.named_model, workload.optimizer, run_info=workload.config.run_info())
    with recorder:
        for step in range(1, workload.config.steps + 1):
            result = workload.forward_backward(step)
            recorder.observe(output=result.output, loss=result.global_loss)  # before optimizer.step()
            workload.optimizer_step(step)  # the recorder's optimizer hooks capture this step
            workload.report(step, result)


def main() -> int:
    config = parse_config(description="Reference distributed training workload, recorded with tracekit.")
    return run(config, train)


if __name__ == "__main__":
    sys.exit(quick_exit.ending(main()))  # ends without Python's teardown once the exit handlers ran
