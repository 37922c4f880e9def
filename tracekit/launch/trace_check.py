"""After `tracekit record --trace`: were the steps asked for traced? (The record line and its exit.)

A recorder can only trace a whole step: zero-code recording hooks in at the first optimizer step,
inside step 1, so it traces from step 2 (tracekit/launch/config.py, first_trace_step). A step asked for
that no rank traced (step 1 zero-code, a step beyond the run's end) must not go unsaid: a run
whose trace is missing would otherwise pass in CI and `tracekit diff` would compare nothing.
"""

from __future__ import annotations

from tracekit.launch.config import RecordConfig, first_trace_step


def _span(steps: list[int]) -> str:
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ",".join(map(str, steps))


def traced_line(traces: dict[str, list[int]]) -> str:
    """'traces: ops at step 2' (levels a store traced and where), or 'traces: none'."""
    held = [f"{level} at {_span(steps)}" for level, steps in sorted(traces.items()) if steps]
    return "traces: " + ("; ".join(held) if held else "none")


def untraced_problem(config: RecordConfig, completed: list[int], traces: dict[str, list[int]]) -> str | None:
    """A one-line message when --trace asked for steps that no rank traced, else None."""
    if not config.trace or not completed:
        return None
    traced = set(traces.get(config.trace, []))
    last = completed[-1]
    if config.trace_steps is None:  # the default: the first whole step the recorder saw
        if traced:
            return None
        return (f"--trace {config.trace} traced no step: by default it traces the first whole step (step 1 with "
                f"tracekit's Recorder, step {first_trace_step(True)} zero-code, which starts inside step 1) and the run "
                f"completed {_span(completed)}; name the steps with --trace-steps")
    lo, hi = config.trace_steps
    asked = list(range(lo, (last if hi is None else hi) + 1))
    missing = [s for s in asked if s not in traced]
    if not missing:
        return None
    beyond = [s for s in missing if s > last]
    why = []
    if any(s < first_trace_step(True) for s in missing):
        why.append(f"zero-code recording starts inside step 1 and traces from step {first_trace_step(True)}")
    if beyond:
        why.append(f"the run ended at step {last}")
    return (f"--trace-steps {lo}:{'' if hi is None else hi} asked to trace {_span(missing)}, which no rank traced"
            + (f" ({'; '.join(why)})" if why else ""))
