"""The writer process yields the cores to training (tracekit/writer/priority.py): it runs at the nice value
asked for while the rank trains, and goes back to where it started once the rank is done."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tracekit import open_store
from tracekit.errors import UsageError
from tracekit.launch.config import DEFAULT_WRITER_NICE, RecordConfig
from tracekit.writer import priority
from tracekit.writer.handoff import Handoff, _writer_env
from tracekit.writer.spool_writer import ATTRS
from tracekit.writer.spool import write_entry
from tracekit.writer.spool_names import PART, STEP, entry_name
from tracekit.store import TensorData, create_store

OURS = os.getpriority(os.PRIO_PROCESS, 0)


# Linux with CONFIG_SCHED_AUTOGROUP, as root: without CAP_SYS_ADMIN the kernel lets one autogroup
# change through per 100 ms machine-wide (EAGAIN), so parallel tests would race for it
AUTOGROUPS = priority.autogroup_nice() is not None and os.geteuid() == 0
needs_autogroups = pytest.mark.skipif(not AUTOGROUPS, reason="no /proc/self/autogroup here, or not root")


def _group_nice(pid: int) -> int | None:
    return priority.autogroup_nice(f"/proc/{pid}/autogroup")


@pytest.mark.parametrize("nice", [0, 7, DEFAULT_WRITER_NICE])
def test_the_writer_runs_at_the_nice_value_asked_for_and_never_above_its_rank(tmp_path, nice):
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20, nice=nice)
    try:
        handoff.put(1, [("parameters", TensorData("w", "float32", (3,), np.ones(3, np.float32)))], complete=True)
        handoff.flush()  # step 1 written: the writer is past its start, waiting for the next step
        assert os.getpriority(os.PRIO_PROCESS, handoff._proc.pid) == max(nice, OURS)
        if AUTOGROUPS:  # its session's scheduling group (its own: a new session's starts at 0) too
            assert _group_nice(handoff._proc.pid) == nice
            assert _group_nice(os.getpid()) == priority.autogroup_nice()  # ours untouched
    finally:
        handoff.close("finished")
    assert open_store(store).rank(0).completed_steps == [1]


LOWER_THEN_RESTORE = """
import os, threading
from tracekit.writer import priority
before = priority.lower(19)
seen = {}
go = threading.Event()
def later():  # a thread started after lower(): inherits the low priority, and is restored too
    seen['thread'] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    go.wait()
t = threading.Thread(target=later); t.start()
while 'thread' not in seen: pass
priority.restore(before)
tid = t.native_id
print(before, seen['thread'], os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, tid))
go.set(); t.join()
"""


def test_lower_reaches_every_later_thread_and_restore_puts_each_back_where_permitted():
    out = subprocess.run([sys.executable, "-c", LOWER_THEN_RESTORE], capture_output=True, text=True, check=True).stdout
    before, thread_low, main_after, thread_after = map(int, out.split())
    assert before == OURS and thread_low == 19
    # lowering a nice value needs a privilege: as root both threads are back, as a plain user they stay at 19
    expected = OURS if os.geteuid() == 0 else 19
    assert (main_after, thread_after) == (expected, expected)


GROUP = """
import os
from tracekit.writer import priority
group = priority.autogroup_nice()
before = priority.lower(19)
priority.lower_group(19)
low = priority.autogroup_nice()
priority.restore(before)
print(group, low, priority.autogroup_nice())
"""


@needs_autogroups
def test_a_session_leader_lowers_its_autogroup_too_and_restore_puts_it_back():
    """Across autogroups (one per session) a nice value counts for nothing: a writer in its own
    session at nice 19 got the share of a whole training rank. Leading its session, the group is its
    own: lower_group() sets the group's nice value, restore() puts it back."""
    out = subprocess.run([sys.executable, "-c", GROUP], capture_output=True, text=True, check=True,
                         start_new_session=True).stdout
    group, low, after = map(int, out.split())
    assert (group, low, after) == (0, 19, 0)  # a new session's group starts at 0


@needs_autogroups
def test_a_process_that_does_not_lead_its_session_leaves_the_group_alone():
    """Its group is its session's, shared with the processes that started it: never lowered."""
    out = subprocess.run([sys.executable, "-c", GROUP], capture_output=True, text=True, check=True).stdout
    group, low, after = map(int, out.split())
    assert group == low == after == priority.autogroup_nice()


EARLY = """
import runpy, sys
from tracekit.writer import priority
seen = []
lower, lower_group = priority.lower, priority.lower_group
def spy(nice):
    seen.append((nice, "numpy" in sys.modules, "zarr" in sys.modules))
    return lower(nice)
def group_spy(nice):
    seen.append(("group", nice, "numpy" in sys.modules, "zarr" in sys.modules))
    return lower_group(nice)
priority.lower, priority.lower_group = spy, group_spy
sys.argv = ["spool_writer", "--nice", "7"]  # the other arguments missing: argparse stops the writer after its imports
try:
    runpy.run_module("tracekit.writer.spool_writer", run_name="__main__", alter_sys=True)
except SystemExit as e:
    print(e.code, seen)
"""


def test_the_writer_program_takes_its_nice_value_before_its_heavy_imports():
    """Started as a program, the writer lowers its priority, and its scheduling group's, before numpy,
    zarr and the store's modules load (~0.35 s of CPU it would otherwise take at the rank's priority
    and share of the cores), once; imported, it does nothing."""
    out = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, check=True).stdout
    assert out.split(maxsplit=1) == ["2", "[(7, False, False), ('group', 7, False, False)]\n"]
    imported = subprocess.run([sys.executable, "-c", "import os, tracekit.writer.spool_writer; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                              capture_output=True, text=True, check=True).stdout
    assert int(imported) == OURS


def test_lower_never_raises_the_priority_of_a_process_already_niced_further():
    code = "import os; from tracekit.writer import priority; os.nice(15); print(priority.lower(3), os.getpriority(os.PRIO_PROCESS, 0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(min(OURS + 15, 19))] * 2


def test_the_nice_value_is_checked_and_travels_to_the_ranks_through_the_environment():
    with pytest.raises(UsageError, match="nice value must be 0 to 19, got 20"):
        RecordConfig(writer_nice=20)
    assert RecordConfig.from_env(RecordConfig(store="s", writer_nice=4).to_env()).writer_nice == 4
    assert RecordConfig.from_env({}).writer_nice == DEFAULT_WRITER_NICE


def _thread_nices(pid: int) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def test_the_writer_drains_what_is_left_at_its_starting_priority_once_its_rank_closes(tmp_path, monkeypatch):
    """The open step's capture is only written once the rank is done: the writer then runs every
    thread at its starting priority (where permitted), and stays there while it drains."""
    monkeypatch.setenv("TRACEKIT_WRITE_MBPS", "0.000001")  # 1 byte/s: the entry's write waits until SIGTERM
    store = str(tmp_path / "s")
    create_store(store, {})
    handoff = Handoff(store, 0, {"coords": {"rank": 0}}, 1 << 20, nice=DEFAULT_WRITER_NICE)
    pid = handoff._proc.pid
    try:
        handoff.flush()  # the writer is up, at its low priority, waiting for the rank
        assert set(_thread_nices(pid)) == {max(DEFAULT_WRITER_NICE, OURS)}
        handoff.provisional(1, [("parameters", TensorData("w", "float32", (3,), np.ones(3, np.float32)))])
        handoff.send_close("failed", {"cause": "test"})  # the writer takes the open step only now
        # Lowering a nice value needs a privilege: as root the drain runs at our priority; as a plain
        # user restore() is refused and the writer stays at 19 (test above), nothing to see here.
        expected = OURS if os.geteuid() == 0 else max(DEFAULT_WRITER_NICE, OURS)
        deadline = time.monotonic() + 60
        while set(_thread_nices(pid)) != {expected} and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a state that holds until SIGTERM below, not timing it
        assert set(_thread_nices(pid)) == {expected}
        if AUTOGROUPS:  # its group back at 0 too (restore() sets it before the threads)
            assert _group_nice(pid) == 0
        assert handoff._proc.poll() is None  # still draining (the rate cap holds it in the entry's write)
    finally:
        handoff._proc.terminate()  # cuts the capped write short
        handoff.close("failed")
    rank = open_store(store).rank(0)
    assert rank.completed_steps == [1] and rank.status == "failed"


def test_a_writer_that_hears_of_the_close_mid_batch_drains_the_rest_of_it_at_its_starting_priority(tmp_path):
    """The close can arrive while the writer is inside a batch of sealed entries it already listed
    (a signal right after a step): it must not write the rest of that batch at nice 19, where any
    busy core starves it past the job's --flush-timeout."""
    store, spool = str(tmp_path / "s"), tmp_path / "spool"
    create_store(store, {})
    spool.mkdir()
    (spool / ATTRS).write_text(json.dumps({"coords": {"rank": 0}}))
    small = [("loss", TensorData("loss", "float32", (), np.ones((), np.float32)))]
    big = [("parameters", TensorData("w", "float32", (1 << 20,), np.ones(1 << 20, np.float32)))]
    for seq, tensors in ((1, small), (2, big)):  # both sealed before the writer starts: one batch
        part = str(spool / entry_name(seq, PART))
        write_entry(part, seq, True, tensors)
        os.rename(part, str(spool / entry_name(seq, STEP)))
    # ~10 KB/s: the small entry takes a fraction of a second, the big one (4 MiB) about 7 minutes (cut short below)
    env = dict(_writer_env(), TRACEKIT_WRITE_MBPS="0.01")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.writer.spool_writer", "--spool", str(spool), "--store", store,
         "--rank", "0", "--rank-pid", str(os.getpid()), "--nice", str(DEFAULT_WRITER_NICE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"ready\n"  # it has listed entries 1 and 2 (run() lists first)
        proc.stdin.write(b"close failed\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"done 1\n"
        expected = OURS if os.geteuid() == 0 else max(DEFAULT_WRITER_NICE, OURS)
        deadline = time.monotonic() + 60
        while set(_thread_nices(proc.pid)) != {expected} and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a state that holds until SIGTERM below, not timing it
        assert set(_thread_nices(proc.pid)) == {expected}
        assert proc.poll() is None  # still inside entry 2's capped write
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert open_store(store).rank(0).completed_steps == [1, 2]
