"""The writer process (tracekit/writer/spool_writer.py) stops when told, whatever it is doing."""

import os
import signal
import subprocess

import numpy as np
import pytest

from tracekit import open_store
from tracekit.writer.handoff import Handoff
from tracekit.store import TensorData, create_store

BOUND_S = 60  # an idle writer stops at once; far more than that is a writer that never stops


@pytest.mark.parametrize("signals", [1, 2])
def test_a_writer_told_to_stop_while_it_waits_on_a_live_rank_stops(tmp_path, signals):
    """`tracekit record` SIGTERMs a writer still running at --flush-timeout; its rank may outlive the
    command (an orphan of a killed agent) and say nothing more. The writer, idle in select() waiting
    for that rank, must stop anyway: Python resumes select() after a handler that does not raise."""
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20)  # its rank: this process, alive throughout
    proc = handoff._proc
    try:
        handoff.put(1, [("parameters", TensorData("w", "float32", (3,), np.ones(3, np.float32)))], complete=True)
        handoff.flush()  # step 1 written: the writer waits for the rank's next word
        for _ in range(signals):  # a second SIGTERM changes nothing
            os.kill(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the writer ignored SIGTERM for {BOUND_S} s while it waited for a live rank")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert rc == 0
    rank = open_store(store).rank(0)
    assert rank.completed_steps == [1]
    assert rank.attrs["unwritten_steps"] == []  # nothing was left to write


def _spool_backlog(spool, steps) -> list[str]:
    """A rank's spool folder holding sealed entries of `steps`, as a rank leaves them for its writer."""
    import json

    from tracekit.writer.spool import STEP, entry_name, write_entry
    from tracekit.writer.spool_writer import ATTRS

    os.makedirs(spool)
    with open(os.path.join(spool, ATTRS), "w") as f:
        json.dump({"coords": {"rank": 0, "world_size": 1}}, f)
    names = []
    for seq, step in enumerate(steps, 1):
        rng = np.random.default_rng(step)
        tensors = [("parameters", TensorData("w", "float32", (4, 3), rng.standard_normal((4, 3)).astype(np.float32))),
                   ("parameters", TensorData("big", "float32", (300_000,), rng.standard_normal(300_000).astype(np.float32))),
                   ("loss", TensorData("loss", "float32", (), np.array(1.0 / step, np.float32)))]
        part = os.path.join(spool, f"{seq}.part")
        write_entry(part, step, True, tensors)
        names.append(entry_name(seq, STEP))
        os.rename(part, os.path.join(spool, names[-1]))
    return names


def _store_files(path) -> dict[str, bytes]:
    import re

    out = {}
    for folder, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                raw = f.read()
            if name == "zarr.json":
                raw = re.sub(rb'"(start_time|end_time)": "[^"]*"', b"", raw)
            out[os.path.relpath(os.path.join(folder, name), path)] = raw
    return out


def test_a_backlog_is_stored_as_one_group_and_leaves_the_store_one_entry_at_a_time_leaves(tmp_path, monkeypatch):
    """Several sealed entries waiting: each is stored, then all are listed with one commit (each
    metadata document rewritten once), then unlinked and reported done. The store is byte for byte
    the one the writer leaves taking the same entries one at a time."""
    import io

    from tracekit.store import RankWriter
    from tracekit.writer import spool_writer

    steps = [1, 2, 3, 4, 5]
    stores = {}
    commits = []
    real_commit = RankWriter.commit
    monkeypatch.setattr(RankWriter, "commit", lambda self: (commits.append(len(self.completed)), real_commit(self))[1])
    for how in ("one at a time", "backlog"):
        spool, store = str(tmp_path / how / "spool"), str(tmp_path / how / "store")
        names = _spool_backlog(spool, steps)
        create_store(store, {})
        w = spool_writer._Writer(spool, store, 0, os.getpid())
        w.out = io.StringIO()
        w.closing = ("finished", {})  # the rank has closed: the writer drains what is spooled, then closes
        if how == "one at a time":
            for seq, name in enumerate(names, 1):
                w._write(seq, name)
            assert commits == [1, 2, 3, 4, 5]  # complete_step commits each step
            commits.clear()
        assert w.run() == 0
        said = w.out.getvalue().split("\n")
        assert [line for line in said if line.startswith("done")] == [f"done {seq}" for seq in range(1, len(steps) + 1)]
        assert said[-2:] == ["closed", ""]
        assert [n for n in os.listdir(spool) if n.endswith(".step")] == []
        stores[how] = _store_files(store)
        assert open_store(store).rank(0).completed_steps == steps
    assert commits == [len(steps)]  # the backlog: one commit for all five
    assert stores["backlog"] == stores["one at a time"]


def test_a_writer_killed_mid_group_keeps_the_groups_entries_spooled(tmp_path):
    """Killed after storing a group's bytes and before listing them: the group's entries are still in
    the spool (the launcher lists them as unwritten), and the store lists none of them."""
    import sys
    import textwrap

    from tracekit.writer.spool import spooled_steps

    spool, store = str(tmp_path / "spool"), str(tmp_path / "store")
    names = _spool_backlog(spool, [1, 2, 3])
    create_store(store, {})
    script = textwrap.dedent(f"""
        import os, signal, sys
        from tracekit.store import RankWriter
        def killed(self):
            os.kill(os.getpid(), signal.SIGKILL)  # as a kill would, after the group's bytes are stored
        RankWriter.commit = killed
        from tracekit.writer import spool_writer
        sys.exit(spool_writer.main(["--spool", {spool!r}, "--store", {store!r}, "--rank", "0",
                                    "--rank-pid", str(os.getpid())]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=BOUND_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert sorted(n for n in os.listdir(spool) if n.endswith(".step")) == sorted(names)
    assert spooled_steps(spool) == [1, 2, 3]
    rank = open_store(store).rank(0)
    assert rank.completed_steps == []
    assert rank.steps("parameters") == []
