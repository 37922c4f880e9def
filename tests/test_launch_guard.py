"""tests/launch_guard.py tells a launch of training workers from the other processes tests start."""

import sys

import pytest

from tests.launch_guard import launches_workers

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
    assert launches_workers(["true"], caller_module="tracekit.recorders.launch")
    assert not launches_workers(["true"], caller_module="subprocess")
