"""samples/plain's zero-code recording of every layout (torchrun), the one the tests read: STEPS steps,
steps 2 to STEPS traced at op level, fsdp with --log-norms. A launch costs its start-up (torch, dynamo,
the agent), not its steps or its trace, so this one recording serves the root-cause matrix
(test_root_cause_matrix.py: the layout's traced reference, and a candidate replayed from it with a
planted fault per step) and every test that reads the plain sample's run (its store, its stdout;
`second_recording` in tests/launching.py): no launch of their own.
"""

from __future__ import annotations

from tests.launching import PLAIN_RECORD_ARGS

STEPS = 8
TRACE = ("--trace", "ops", "--trace-steps", f"2:{STEPS}")
LAYOUT_ARGS = {"ddp": (), "fsdp": ("--log-norms",), "tp": (), "simplefsdp_tp": ()}


def plain_run(recorded_sample, layout: str):
    """(store, the record command's result) of the layout's plain recording (the traced reference)."""
    return recorded_sample(layout, script="plain", steps=STEPS, extra=LAYOUT_ARGS[layout],
                           record_args=(*PLAIN_RECORD_ARGS.get(layout, ()), *TRACE))


def traced_reference(recorded_sample, layout: str) -> str:
    """The layout's traced reference store."""
    return plain_run(recorded_sample, layout)[0]


def traced_replay(recorded_sample, layout: str, faults=()) -> str:
    """A traced candidate with `faults` (sample args), replayed from the layout's traced reference:
    every step from 2 on starts from the reference's state, so a fault reaches no later step."""
    ref = traced_reference(recorded_sample, layout)
    return recorded_sample(layout, script="plain", steps=STEPS, extra=(*LAYOUT_ARGS[layout], *faults),
                           record_args=(*PLAIN_RECORD_ARGS.get(layout, ()), *TRACE, "--replay-from", ref))[0]
