"""While its rank trains, the writer process leaves up to `hold_bytes` (--hold-mb) of sealed steps in
the spool; past that it stores the oldest, down to half of it, and it stores the rest when the rank is done, flushes,
or needs the room they take (tracekit/writer/spool_writer.py, handoff.py)."""

import os
import threading
import time

import numpy as np
import pytest

from tracekit import open_store
from tracekit.errors import UsageError
from tracekit.launch.config import RecordConfig
from tracekit.store import TensorData, create_store
from tracekit.writer.handoff import Handoff
from tracekit.writer.spool import entries
from tracekit.writer.spool_writer import _past_hold

MB = 1 << 20
ATTRS = {"coords": {"rank": 0}}


def _step(value: float):
    """A step of one 1 MiB tensor: its spool entry is a little over 1 MiB (a header, page-aligned bytes)."""
    return [("parameters", TensorData("w", "float32", (MB // 4,), np.full(MB // 4, value, np.float32)))]


def _heard(handoff: Handoff, line: str, bound_s: float = 60) -> bool:
    """Whether the writer said `line` within bound_s (a guard against a hang, not a sync: it says it
    once it has stored the entry, or never)."""
    return handoff._read_until(lambda heard: heard == line, until=time.monotonic() + bound_s)


def _store(tmp_path) -> str:
    store = str(tmp_path / "s")
    create_store(store, {})
    return store


def test_past_the_hold_the_writer_stores_the_oldest_down_to_half_of_it_until_the_rank_flushes(tmp_path):
    store = _store(tmp_path)
    handoff = Handoff(store, 0, ATTRS, 8 * MB, hold_bytes=int(2.5 * MB))  # room for two entries, not three
    for step in (1, 2, 3):
        handoff.put(step, _step(step), complete=True)
    # past the hold, the writer stores the oldest down to half of it (1.25 MiB: one entry stays), in
    # one batch; it stores nothing more until the rank speaks again
    assert _heard(handoff, "done 2")
    assert open_store(store).rank(0).completed_steps == [1, 2]
    assert len(entries(handoff.spool, final=False)) == 1  # step 3 waits in the spool
    handoff.flush()  # `drain`: every sealed step, held ones included
    view = open_store(store).rank(0)
    assert view.completed_steps == [1, 2, 3]
    handoff.close("finished")
    view = open_store(store).rank(0)
    assert view.status == "finished"
    assert [float(view.read("parameters", s, "w")[0]) for s in (1, 2, 3)] == [1.0, 2.0, 3.0]


def test_held_steps_are_stored_when_the_rank_closes(tmp_path):
    store = _store(tmp_path)
    handoff = Handoff(store, 0, ATTRS, 8 * MB, hold_bytes=8 * MB)  # holds all of them
    for step in (1, 2, 3):
        handoff.put(step, _step(step), complete=True)
    handoff.close("finished")
    view = open_store(store).rank(0)
    assert view.completed_steps == [1, 2, 3] and view.status == "finished"
    assert not os.path.exists(handoff.spool)


def test_a_rank_that_needs_the_room_held_steps_take_gets_it(tmp_path):
    """A hold as large as the queue cap: without the rank's `drain`, the writer would hold every step
    and the rank wait for room forever."""
    store = _store(tmp_path)
    handoff = Handoff(store, 0, ATTRS, 3 * MB, hold_bytes=3 * MB)
    handed = threading.Thread(target=lambda: [handoff.put(s, _step(s), complete=True) for s in range(1, 7)],
                              daemon=True)
    handed.start()
    handed.join(timeout=120)  # a guard against a hang, not a sync: the puts end when the writer makes room
    try:
        assert not handed.is_alive(), "put() waited for room the writer never made"
    finally:
        if handed.is_alive():
            handoff._proc.kill()
    assert handoff.peak_pending <= 3 * MB
    handoff.close("finished")
    view = open_store(store).rank(0)
    assert view.completed_steps == list(range(1, 7))
    assert [float(view.read("parameters", s, "w")[0]) for s in range(1, 7)] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_past_the_hold_the_oldest_entries_are_stored_down_to_half_of_it(tmp_path):
    sizes = {"a": 300, "b": 200, "c": 100}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    found = [(1, "a"), (2, "b"), (3, "c")]
    assert _past_hold(str(tmp_path), found, 600) == 0  # 600 held: not past the hold
    assert _past_hold(str(tmp_path), found, 599) == 2  # past it: down to 299 or less, 100 bytes stay held
    assert _past_hold(str(tmp_path), found, 1000) == 0
    assert _past_hold(str(tmp_path), found, 400) == 2  # down to 200
    assert _past_hold(str(tmp_path), found, 200) == 2  # down to 100: the last one stays
    assert _past_hold(str(tmp_path), found, 199) == 3  # down to 99.5: it goes too
    assert _past_hold(str(tmp_path), found, 0) == 3
    assert _past_hold(str(tmp_path), [(0, "gone"), *found], 600) == 0  # an entry gone meanwhile holds nothing


def test_the_hold_is_checked_defaults_to_half_the_queue_and_travels_to_the_ranks():
    assert RecordConfig(queue_mb=100).hold_bytes == 50 * MB
    assert RecordConfig(queue_mb=100, hold_mb=0).hold_bytes == 0
    with pytest.raises(UsageError, match=r"hold size \(--hold-mb\) must be 0 to the queue size \(--queue-mb, 100\), got 101"):
        RecordConfig(queue_mb=100, hold_mb=101)
    assert RecordConfig.from_env(RecordConfig(store="s", hold_mb=7).to_env()).hold_bytes == 7 * MB
    assert RecordConfig.from_env(RecordConfig(store="s", queue_mb=10).to_env()).hold_bytes == 5 * MB



def test_held_steps_are_stored_when_the_spools_filesystem_runs_short(tmp_path, monkeypatch):
    """The ranks of a machine share its /dev/shm: a rank whose spool has room for fewer than a few
    more entries asks its writer for the held ones, whose room storing frees."""
    from tracekit.writer import handoff as handoff_module

    store = _store(tmp_path)
    handoff = Handoff(store, 0, ATTRS, 8 * MB, hold_bytes=8 * MB)  # would hold all of them
    room = {"bytes": 1 << 40}
    monkeypatch.setattr(handoff_module, "spool_room", lambda folder: room["bytes"])
    handoff.put(1, _step(1), complete=True)
    room["bytes"] = 3 * MB  # less than SPOOL_ROOM_ENTRIES entries of a little over 1 MiB
    handoff.put(2, _step(2), complete=True)
    assert _heard(handoff, "done 2")  # both stored, in order, though within the hold
    assert open_store(store).rank(0).completed_steps == [1, 2]
    handoff.close("finished")
    assert open_store(store).rank(0).completed_steps == [1, 2]
