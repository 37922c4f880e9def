"""The order the test run hands tests out in (tests/conftest.py's pytest_collection_modifyitems).

The README's command runs `-n auto`, and pyproject's addopts pick `--dist worksteal`: pytest-xdist
(3.8) gives each of the W workers one slice of the collection up front, worker i the next
len/(W - i) of the items left (`WorkStealingScheduling.check_schedule`), and a worker whose slice
runs out takes the back half of the longest remaining queue. (`--dist load`'s first hand-out is
consecutive chunks of a quarter of each worker's share: with the slow tests first, every one of
them went to one worker, and an assigned test never moves again.)

So the slow work goes first, spread over the slices: each HEAVY group below is what a set of tests
launches between them (the first of them to run records for all, `shared_once` or
`recorded_sample`), kept together on one worker in the order listed, so none of its tests waits on
another worker for a recording; the groups are dealt to the slices longest first, each to the
slice with the least so far, at the slice's front. Behind them, each slice gets an equal share of
the other launching tests (tests/e2e/, in the collection's order), then quick tests: a worker that
steals takes the back of a queue, so what moves is quick tests and the run ends on quick tests. A
group missing from a run (`-k`, `-m`, a single file) costs nothing; a test named in no group keeps
its collection order within its kind.
"""

from __future__ import annotations

# (group, seconds its tests took in all, measured with `pytest tests/e2e -n 2 --durations=0`, node-id
# prefixes of its tests in the order they run). Only the order depends on the seconds: a stale
# figure costs time, never a result.
HEAVY: list[tuple[str, float, tuple[str, ...]]] = [
    ("torchtitan: same, locate, cells blocks", 300, (
        "tests/e2e/samples/test_torchtitan_runs.py::test_two_recordings",
        "tests/e2e/samples/test_torchtitan_runs.py::test_an_lr",
        "tests/e2e/samples/test_torchtitan_runs.py::test_the_recorded_loss_is_the_loss_torchtitan_logs[dp2]",
        "tests/e2e/samples/test_torchtitan_runs.py::test_every_optimizer_parameter_is_recorded_under_its_full_name[selective-ac-eager]",
        "tests/e2e/samples/test_torchtitan_locate.py::test_the_planted",
        "tests/e2e/samples/test_torchtitan_locate.py::test_the_faulty_replay",
        "tests/e2e/samples/test_torchtitan_locate.py::test_four_faults",
    )),
    ("torchtitan: layouts block (seed, fsdp 4, hsdp 2 x 2)", 150, (
        "tests/e2e/samples/test_torchtitan_dp4.py::",
        "tests/e2e/samples/test_torchtitan_runs.py::test_fsdp_and_hsdp",
    )),
    ("torchtitan: loss block (tp 2 compiled, fsdp x tp 2 x 2)", 110, (
        "tests/e2e/samples/test_torchtitan_runs.py::test_initial_weights",
        "tests/e2e/samples/test_torchtitan_runs.py::test_the_recorded_loss_is_the_loss_torchtitan_logs[tp2]",
        "tests/e2e/samples/test_torchtitan_runs.py::test_the_recorded_loss_is_the_loss_torchtitan_logs[fsdp2xtp2]",
        "tests/e2e/samples/test_torchtitan_runs.py::test_every_optimizer_parameter_is_recorded_under_its_full_name[tp-no-ac-compiled]",
    )),
    # tests/e2e/cli/tiny_runs.py's shared world-of-one recording: its readers on one worker, the first
    # recording it (the replay test waited ~10 s for it on the other worker)
    ("cli: the shared tiny recording and its readers", 30, (
        "tests/e2e/cli/test_record_cli.py::test_records_a_world_of_one",
        "tests/e2e/cli/test_record_cli.py::test_ends_with_a_one_line_summary",
        "tests/e2e/cli/test_record_cli.py::test_refuses_existing_store",
        "tests/e2e/cli/test_record_cli.py::test_says_what_it_waits_for",
        "tests/e2e/cli/test_hostile_input.py::test_replay_steps_beyond",
    )),
    # docs/LOCATE.md's group (its traced reference is tests/e2e/cli/test_trace_cli.py's recording too):
    # recorded by the first of these, none waits on another worker for it; the root-cause matrix's ddp
    # pair (test_clean_replay) is read last
    ("docs: locate group, then the clean replay", 60, (
        "tests/e2e/docs/test_locate_doc.py::test_locate_doc_commands_show_what_the_doc_shows",
        "tests/e2e/docs/test_locate_doc.py::test_replayed_traced_step",
        "tests/e2e/docs/test_doc_commands.py::test_doc_commands_run_as_written[locate]",
        "tests/e2e/docs/test_locate_doc.py::test_clean_replay",
    )),
    # the README's main job and docs/ZEROCODE.md's block record the same runs/ref (one launch)
    ("docs: main and zerocode groups", 40, (
        "tests/e2e/docs/test_doc_commands.py::test_doc_commands_run_as_written[main]",
        "tests/e2e/docs/test_doc_commands.py::test_doc_commands_run_as_written[zerocode]",
    )),
    # samples/device_check.py's dry run: 5 launches and 3 diffs in one test
    ("samples: the device check's dry run", 40, (
        "tests/e2e/samples/test_device_check.py::",
    )),
    # tests/e2e/samples/traced_layouts.py's recordings: per layout a traced reference (samples/plain's one
    # recording, which many tests read) and a replayed candidate
    ("root-cause matrix: traced layouts (simplefsdp_tp 2 x 2 first)", 130, (
        "tests/e2e/samples/test_root_cause_matrix.py::test_each_planted_fault_is_named_on_its_step_and_the_clean_step_names_nothing[simplefsdp_tp]",
        "tests/e2e/samples/test_root_cause_matrix.py::",
    )),
]


def _members(items: list, prefixes: tuple[str, ...]) -> list:
    out = []
    for prefix in prefixes:
        out += [item for item in items if item.nodeid.startswith(prefix) and item not in out]
    return out


def ordered(items: list, workers: int, slow=lambda item: False) -> list:
    """items reordered for `workers` work-stealing workers: in each worker's first slice, its HEAVY
    groups, then its share of the other `slow` tests (consecutive, as collected, so that tests of one
    file that share a recording stay together), then quick tests up to the slice's size. A worker
    that steals takes the back of a queue, so the quick tests move and the run ends on quick tests."""
    workers = max(1, workers)
    slices: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    taken: set[int] = set()
    for _, seconds, prefixes in sorted(HEAVY, key=lambda g: -g[1]):
        members = [item for item in _members(items, prefixes) if id(item) not in taken]
        if not members:
            continue
        i = load.index(min(load))
        slices[i] += members
        load[i] += seconds
        taken.update(id(item) for item in members)
    rest = [item for item in items if id(item) not in taken]
    slower = [item for item in rest if slow(item)]
    quick = [item for item in rest if not slow(item)]
    for i in range(workers):
        share = len(slower) // (workers - i)
        slices[i] += slower[:share]
        slower = slower[share:]
    out: list = []
    for i in range(workers):
        size = (len(items) - len(out)) // (workers - i)  # what worksteal's first hand-out gives worker i
        fill = max(0, size - len(slices[i]))
        out += slices[i] + quick[:fill]
        quick = quick[fill:]
    return out + quick
