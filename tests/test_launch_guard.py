"""tests/launch_guard.py tells a launch of training workers from the other processes tests start."""

import os
import sys

import pytest

from tracekit.launch import launcher

from tests.e2e_collection import e2e_collection
from tests.launch_guard import E2E, in_e2e, launches_workers, misplaced

PY = sys.executable


@pytest.mark.parametrize("argv", [
    [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"],
    ["torchrun", "--standalone", "train.py"],
    ["/venv/bin/torchrun", "train.py"],
    [PY, "-m", "tracekit.cli.main", "record", "--force", "-o", "s", "--", PY, "train.py"],
    [PY, "-m", "tracekit.cli.main", "record", "-o", "s", "--", "true"],
    ["bash", "-c", "tracekit record -o runs/ref -- torchrun --standalone samples/plain/train.py"],
    "tracekit record -o s -- python train.py",
], ids=["torch.distributed.run", "torchrun", "torchrun-path", "record", "record-true", "bash-line", "string"])
def test_worker_launches_are_recognized(argv):
    assert launches_workers(argv)


@pytest.mark.parametrize("argv", [
    [PY, "-m", "tracekit.cli.main", "record", "--help"],
    [PY, "-m", "tracekit.cli.main", "record", "-o", "s", "--writer-nice", "25"],
    [PY, "-m", "tracekit.cli.main", "show", "--json", "s"],
    [PY, "-m", "tracekit.recorders.spool_writer", "--spool", "d", "--store", "s", "--rank", "0"],
    ["bash", "-c", "tracekit diff runs/torchrun-ref runs/b"],
    ["chromium", "--headless", "--no-sandbox"],
], ids=["record-help", "record-refused", "show", "writer", "diff-of-a-store-named-torchrun", "browser"])
def test_other_processes_are_not_launches(argv):
    assert not launches_workers(argv)


def test_whatever_tracekits_launcher_starts_is_a_launch():
    assert launches_workers(["true"], caller_module=launcher.__name__)  # the module that starts the job
    assert not launches_workers(["true"], caller_module="subprocess")


class _Item:
    def __init__(self, path, marked):
        self.path, self.nodeid, self._marked = path, str(path) + "::t", marked

    def get_closest_marker(self, name):
        return object() if self._marked and name == "torchrun" else None


def test_the_torchrun_mark_belongs_to_tests_e2e_only(tmp_path):
    inside, outside = os.path.join(E2E, "cli", "test_x.py"), os.path.join(os.path.dirname(E2E), "cli", "test_x.py")
    assert in_e2e(inside) and not in_e2e(outside) and not in_e2e(E2E + "_not_it/test_x.py")
    assert misplaced(_Item(inside, marked=True)) is None and misplaced(_Item(outside, marked=False)) is None
    assert "move it to the same path under tests/e2e/" in misplaced(_Item(outside, marked=True))


def test_the_fast_tier_leaves_out_all_of_tests_e2e(shared_once):
    """tests/e2e/conftest.py marks what is collected there, though no file there says torchrun: a
    collection of tests/e2e that selects the marked tests deselects none, so `-m "not torchrun"`
    collects none of them. (tests/e2e_collection.py: one collection, shared with test_scheduling.)"""
    collection = e2e_collection(shared_once)
    assert collection["returncode"] == 0, collection["output"]
    assert collection["deselected"] == 0, collection["output"]
    assert collection["collected"] == len(collection["ids"]) > 100, collection["output"]
