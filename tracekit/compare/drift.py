"""Drift or error? A FAIL whose errors grow step after step may be legitimate noise amplified by
training (low precision, a different layout) or a small wrong step repeated; only a replay
(docs/REPLAY.md) tells them apart. When the candidate is not itself a replay, the report says so
and gives the command that records one."""

from __future__ import annotations

import shlex

from tracekit.store.kinds import kind_order

# Growth: the failing kind's largest error rises over at least this many steps, to at least
# GROWTH times where it started (a dip of up to DIP of the previous value still counts as rising).
MIN_STEPS = 3
GROWTH = 2.0
DIP = 0.9


def drift_note(report, refc, candc) -> dict | None:
    """{'kind', 'steps', 'errors', 'replay_command'} when the verdict FAILs and a failing kind's
    largest error grows from the first divergence on (the first such kind in compute order), the
    candidate not being a replay; else None."""
    if report.passed or report.first_divergence is None or _is_replay(candc):
        return None
    first = report.first_divergence.step
    failing = sorted({s.kind for s in report.summary if s.violating}, key=lambda k: (kind_order(k), k))
    grown = next(((k, rows) for k in failing if _grows(rows := sorted(
        (s.step, s.max_abs_err) for s in report.summary if s.kind == k and s.step >= first and s.max_abs_err is not None))),
        None)
    if grown is None:
        return None
    kind, rows = grown
    errors = [e for _, e in rows]
    command = candc.store.run_meta.command
    launch = shlex.join(str(a) for a in command) if command else "<the candidate's command>"
    replay = f"{candc.path.rstrip('/')}-replay"
    return {"kind": kind, "steps": [s for s, _ in rows], "errors": errors,
            "replay_command": f"tracekit record --replay-from {shlex.quote(refc.path)} -o {shlex.quote(replay)} -- {launch}"
                              f" && tracekit diff {shlex.quote(refc.path)} {shlex.quote(replay)}"}


def _grows(rows: list[tuple[int, float]]) -> bool:
    errors = [e for _, e in rows]
    if len(errors) < MIN_STEPS or errors[0] <= 0:
        return False
    return all(b >= DIP * a for a, b in zip(errors, errors[1:])) and errors[-1] >= GROWTH * errors[0]


def _is_replay(catalog) -> bool:
    if catalog.store.run_meta.replay_of:
        return True
    return any(rc.view.meta.is_replay for rc in catalog.ranks.values())
