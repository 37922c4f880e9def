"""Every command of README.md, docs/*.md and samples/README.md runs as written, and prints what
the doc shows: one test per group of blocks (tests/docs/doc_blocks.py has the marker rules).

A command passes when it exits 0 or 1 (a FAIL verdict is a result) and prints no traceback; a
python block when every `# == VALUE` it shows matches; an output block when its lines appear, in
order, in what its command printed (floats masked, counts and verdicts exact)."""

from __future__ import annotations

import pytest

from tests.docs.doc_blocks import missing_lines
from tests.docs.doc_runs import all_groups, group_blocks, run_group


def problems_of(group: str, result: dict) -> list[str]:
    problems = [f"{group}: the commands left {e!r} outside runs/ in the folder they ran in" for e in result["strays"]]
    ran = {r["where"]: r["commands"] for r in result["ran"]}
    latest = None
    for b in group_blocks(group):
        if b.kind in ("run", "python"):
            latest = ran[b.where]
            for c in latest:
                text = c["stdout"] + c["stderr"]
                if c["rc"] not in (0, 1) or "Traceback (most recent call last)" in text:
                    problems.append(f"{b.where}: `{c['cmd']}` exited {c['rc']}:\n{text[-3000:]}")
        elif b.kind == "output":
            n = int(b.args[1]) if len(b.args) > 1 else len(latest or [])
            if not latest or not 1 <= n <= len(latest):
                problems.append(f"{b.where}: output of command {n}, which the run block before it does not have")
                continue
            c = latest[n - 1]
            missing = missing_lines(b.text.splitlines(), c["stdout"] + c["stderr"])
            if missing:
                problems.append(f"{b.where}: `{c['cmd']}` did not print, in order:\n  " + "\n  ".join(missing)
                                + f"\nit printed:\n{c['stdout'][-3000:]}{c['stderr'][-1500:]}")
    return problems


@pytest.mark.parametrize("group", all_groups())
def test_doc_commands_run_as_written(group, recorded_sample, shared_once):
    folder, result = run_group(group, recorded_sample, shared_once)
    problems = problems_of(group, result)
    assert not problems, "\n\n".join(problems)
