"""How a zero-code rank's local losses combine into the global loss, when `--loss-reduction auto`.

A DDP script's loss is each rank's mean, and the global loss their mean. TorchTitan's trainer
divides each rank's summed token losses by the global token count before backward()
(torchtitan/trainer.py, 0.3.0: "local SUM loss / global_valid_tokens") and logs the sum of the
data-parallel ranks' shares: the global loss is their sum. That is known in the rank, from
TorchTitan's own objects: the first optimizer step is taken inside `Trainer.train_step` (a frame
on the stack whose `self` is a torchtitan.trainer.Trainer), whichever way the job was launched
(`-m torchtitan.train`, samples/torchtitan/train.py, a script calling the Trainer). Anything else
is assumed to be a mean, and the store says that it was assumed.
"""

from __future__ import annotations

import sys

AUTO = "auto"
TORCHTITAN = "TorchTitan pre-divides by global tokens"
ASSUMED_MEAN = "assumed: no TorchTitan trainer seen; --loss-reduction sum if each rank's loss is pre-divided"


def resolve(asked: str) -> tuple[str, str]:
    """(reduction, why): what `--loss-reduction` asked for ("mean", "sum" or "auto"), made definite.

    Called once, from the training optimizer's first step (its pre-hook), so that the trainer's
    frames are on the stack. An explicit reduction always wins."""
    if asked != AUTO:
        return asked, f"--loss-reduction {asked}"
    if torchtitan_trainer_stepping():
        return "sum", TORCHTITAN
    return "mean", ASSUMED_MEAN


def torchtitan_trainer_stepping() -> bool:
    """Whether the optimizer step under way was taken by TorchTitan's Trainer.train_step."""
    module = sys.modules.get("torchtitan.trainer")  # never imported here: a job without it has no trainer
    trainer = getattr(module, "Trainer", None)
    if not isinstance(trainer, type):
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "train_step" and isinstance(frame.f_locals.get("self"), trainer):
            return True
        frame = frame.f_back
    return False
