"""samples/plain's traced recordings in every layout (zero-code, torchrun), as the root-cause matrix
(test_root_cause_matrix.py) records them: steps 2 to STEPS traced at op level, fsdp with
--log-norms. One reference per layout, and one candidate replayed from it with a planted fault per
step; other tests that need a traced run of a layout read the same reference (no launch of their own).
"""

from __future__ import annotations

STEPS = 8
TRACE = ("--trace", "ops", "--trace-steps", f"2:{STEPS}")
LAYOUT_ARGS = {"ddp": (), "fsdp": ("--log-norms",), "tp": (), "simplefsdp_tp": ()}


def traced_reference(recorded_sample, layout: str) -> str:
    """The layout's traced reference store."""
    return recorded_sample(layout, script="plain", steps=STEPS, extra=LAYOUT_ARGS[layout], record_args=TRACE)[0]


def traced_replay(recorded_sample, layout: str, faults=()) -> str:
    """A traced candidate with `faults` (sample args), replayed from the layout's traced reference:
    every step from 2 on starts from the reference's state, so a fault reaches no later step."""
    ref = traced_reference(recorded_sample, layout)
    return recorded_sample(layout, script="plain", steps=STEPS, extra=(*LAYOUT_ARGS[layout], *faults),
                           record_args=(*TRACE, "--replay-from", ref))[0]
