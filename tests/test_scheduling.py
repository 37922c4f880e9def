"""tests/scheduling.py: the slow groups go first, one worker's slice each, and none is stale."""

from __future__ import annotations

from tests.e2e_collection import e2e_collection
from tests.scheduling import HEAVY, ordered


class Item:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid

    def __repr__(self):
        return self.nodeid


def _items(n_fast: int = 40) -> list[Item]:
    fast = [Item(f"tests/tracekit/test_x.py::test_{i}") for i in range(n_fast)]
    heavy = [Item(prefix + ("" if prefix.endswith("]") else "_case")) for _, _, prefixes in HEAVY for prefix in prefixes]
    return fast[: n_fast // 2] + heavy[::-1] + fast[n_fast // 2:]  # heavy in the middle, in reverse


def _worksteal_slices(order: list, workers: int) -> list[list]:
    """What pytest-xdist 3.8's WorkStealingScheduling hands each worker first."""
    pending, out = list(order), []
    for i in range(workers):
        n = len(pending) // (workers - i)
        out.append(pending[:n])
        pending = pending[n:]
    return out


def test_every_item_stays_once():
    items = _items()
    for workers in (1, 2, 3, 4):
        got = ordered(items, workers)
        assert sorted(map(id, got)) == sorted(map(id, items)) and len(got) == len(items)


def test_one_worker_runs_the_heavy_groups_first_longest_first_in_their_listed_order():
    items = _items()
    got = [i.nodeid for i in ordered(items, 1)]
    want = [p + ("" if p.endswith("]") else "_case") for _, _, ps in sorted(HEAVY, key=lambda g: -g[1]) for p in ps]
    assert got[:len(want)] == want
    assert all(n.startswith("tests/tracekit/") for n in got[len(want):])
    fast = [i.nodeid for i in items if i.nodeid.startswith("tests/tracekit/")]
    assert got[len(want):] == fast  # the rest keep the collection's order


def test_each_worker_slice_starts_with_its_groups_and_the_seconds_balance():
    items = _items()
    for workers in (2, 3):
        slices = _worksteal_slices(ordered(items, workers), workers)
        groups_of = []
        for s in slices:
            names = [i.nodeid for i in s]
            heavy_head = []
            for n in names:
                if n.startswith("tests/tracekit/"):
                    break
                heavy_head.append(n)
            assert all(n.startswith("tests/tracekit/") for n in names[len(heavy_head):]), names  # heavy first
            groups_of.append({g for g, _, ps in HEAVY for n in heavy_head if any(n.startswith(p) for p in ps)})
        assert set().union(*groups_of) == {g for g, _, _ in HEAVY}
        assert all(groups_of), groups_of  # every worker starts on a slow group (there are more groups than workers)
        seconds = {g: s for g, s, _ in HEAVY}
        load = sorted(sum(seconds[g] for g in gs) for gs in groups_of)
        # longest-first greedy: no worker is given more than the lightest one plus the longest group
        assert load[-1] - load[0] <= max(seconds.values()), load


def test_nothing_heavy_leaves_the_order_as_collected():
    items = [Item(f"tests/tracekit/test_x.py::test_{i}") for i in range(9)]
    assert ordered(items, 2) == items


def test_every_listed_prefix_names_a_collected_test(shared_once):
    """A renamed or moved test would drop out of its group silently: the table must name real tests.
    (tests/e2e_collection.py: one collection of tests/e2e, shared with test_launch_guard.)"""
    collection = e2e_collection(shared_once)
    ids = collection["ids"]
    assert ids, collection["output"]
    stale = [p for _, _, ps in HEAVY for p in ps if not any(i.startswith(p) for i in ids)]
    assert not stale, stale


def test_other_launching_tests_are_shared_out_after_the_groups_and_before_the_quick_ones():
    launching = [Item(f"tests/e2e/cli/test_y.py::test_{i}") for i in range(10)]
    quick = [Item(f"tests/tracekit/test_x.py::test_{i}") for i in range(30)]
    heavy = [i for i in _items(0)]
    items = quick[:15] + launching + heavy + quick[15:]
    slow = lambda item: item.nodeid.startswith("tests/e2e/")  # noqa: E731
    slices = _worksteal_slices(ordered(items, 2, slow), 2)
    for s in slices:
        kinds = ["heavy" if any(i is h for h in heavy) else "launching" if slow(i) else "quick" for i in s]
        assert kinds == sorted(kinds, key=["heavy", "launching", "quick"].index), kinds
        assert kinds.count("launching") == 5 and kinds.count("heavy") > 0
    first, second = ([i for i in s if i in launching] for s in slices)
    assert first + second == launching  # consecutive shares, in the collection's order
