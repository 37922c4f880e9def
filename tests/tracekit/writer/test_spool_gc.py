"""Spool folders of dead recordings are removed; those of live (or starting) ones never are.

The owners' locks are held by real other processes (a small flock holder, or a real writer process),
since a lock's holder is what tells a live recording from a dead one.
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tracekit import open_store
from tracekit.writer import spool_gc, spool_names
from tracekit.writer.handoff import Handoff
from tracekit.writer.spool_writer import LOCK
from tracekit.store import TensorData, create_store

HOLD = ("import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")


@contextlib.contextmanager
def held(path):
    """Another process holds the flock on `path` (created if missing) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "locked\n"
        yield
    finally:
        proc.stdin.close()
        proc.wait()


def folder(parent, name, files=(), lock=None):
    """A spool-like folder `parent/name` holding `files` (and the lock file `lock`, if named)."""
    path = parent / name
    path.mkdir(parents=True)
    for f in [*files, *([lock] if lock else [])]:
        (path / f).write_bytes(b"x" * 10)
    return path


def contents(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def aged(path):
    """`path` as if unchanged for longer than spool_gc.STALE_S."""
    t = time.time() - spool_gc.STALE_S - 60
    os.utime(path, (t, t))
    return path


def test_a_rank_spool_whose_writer_died_is_removed_with_its_entries(tmp_path):
    dead = folder(tmp_path, "tracekit-rank0-abcd_123", ["attrs.json", "0000000001.step", "0000000002.prov"], LOCK)
    # no lock file at all (killed in the middle of its writer's removal): once unchanged for a day
    unlocked = aged(folder(tmp_path, "tracekit-rank12-zzzzzzzz", ["0000000003.step"]))
    # no lock file yet: its maker may be about to lock it
    young = folder(tmp_path, "tracekit-rank3-youngyou", ["attrs.json"])
    assert spool_gc.collect([str(tmp_path)]) == 2
    assert not dead.exists() and not unlocked.exists()
    assert contents(young) == ["attrs.json"]


def test_a_rank_spool_whose_writer_lives_is_kept_until_it_lets_go(tmp_path):
    live = folder(tmp_path, "tracekit-rank0-abcdefgh", ["attrs.json", "0000000001.step"], LOCK)
    before = contents(live)
    with held(live / LOCK):
        assert spool_gc.collect([str(tmp_path)]) == 0
        assert contents(live) == before
    assert spool_gc.collect([str(tmp_path)]) == 1  # the same folder, once the lock is free
    assert not live.exists()


def test_launcher_folders_go_only_with_their_launcher_and_every_writer_in_them(tmp_path):
    live = folder(tmp_path, "tracekit-spool-livelive", lock=spool_gc.LAUNCHER_LOCK)  # just made: still empty
    dead_empty = folder(tmp_path, "tracekit-spool-deadempt", lock=spool_gc.LAUNCHER_LOCK)
    dead_with_dead = folder(tmp_path, "tracekit-spool-deaddead", lock=spool_gc.LAUNCHER_LOCK)
    folder(dead_with_dead, "tracekit-rank1-abcdefgh", ["0000000004.step"], LOCK)
    # a writer that outlived its SIGKILLed launcher, still writing
    dead_with_live = folder(tmp_path, "tracekit-spool-deadlive", lock=spool_gc.LAUNCHER_LOCK)
    writer = folder(dead_with_live, "tracekit-rank0-abcdefgh", ["0000000005.step"], LOCK)
    # no lock file (a launcher of a tracekit without it, alive or not): its dead writers' spools go
    # at once, the folder once unchanged for a day
    old_style = folder(tmp_path, "tracekit-spool-oldstyle")
    folder(old_style, "tracekit-rank0-deadxxxx", ["0000000006.step"], LOCK)
    old_style_aged = aged(folder(tmp_path, "tracekit-spool-oldaged0"))
    with held(live / spool_gc.LAUNCHER_LOCK), held(writer / LOCK):
        # the dead launchers' folders (3), the dead rank spools (2)
        assert spool_gc.collect([str(tmp_path)]) == 5
        assert contents(live) == [spool_gc.LAUNCHER_LOCK]
        assert contents(writer) == ["0000000005.step", LOCK]
        assert contents(old_style) == []
    assert not dead_empty.exists() and not dead_with_dead.exists() and not old_style_aged.exists()
    # once they let go: the live launcher's folder, the writer's spool and its launcher's folder
    assert spool_gc.collect([str(tmp_path)]) == 3
    assert os.listdir(tmp_path) == [old_style.name]


def test_only_folders_of_ours_by_name_and_owner_are_touched_and_symlinks_never_followed(tmp_path):
    root, away = tmp_path / "root", tmp_path / "away"
    root.mkdir()
    elsewhere = folder(away, "tracekit-rank0-elsewher", ["0000000001.step"], LOCK)  # looks dead
    (root / "tracekit-rank0-linklink").symlink_to(elsewhere)
    (root / "tracekit-spool-linklink").symlink_to(away)
    (root / "tracekit-spool-afile000").write_text("not a folder")
    unrelated = [folder(root, n, ["0000000001.step"], LOCK) for n in
                 ("tracekit-rank0-short", "tracekit-rankx-abcdefgh", "tracekit-spool-abcdefgh-x", "torchelastic_abcdefgh",
                  "tracekit-spool-ABCDEFGH")]
    if os.getuid() == 0:  # only root can give a folder to another user
        others = folder(root, "tracekit-rank0-otheruid", ["0000000001.step"], LOCK)
        os.chown(others, 12345, 12345)
        unrelated.append(others)
    before = contents(tmp_path)
    assert spool_gc.collect([str(root)]) == 0
    assert contents(tmp_path) == before
    assert all((u / LOCK).exists() for u in unrelated)


def test_cleanup_never_fails(tmp_path):
    (tmp_path / "file").write_text("")
    assert spool_gc.collect([str(tmp_path / "missing"), str(tmp_path / "file")]) == 0


class _CollectorIn:
    """fcntl for spool_gc, with another recording's collector landing between the making of a folder
    and its owner's lock (the first time only)."""

    def __init__(self, root):
        self.root, self.done = root, False

    def __getattr__(self, name):
        import fcntl

        return getattr(fcntl, name)

    def flock(self, fd, op):
        import fcntl

        if op == fcntl.LOCK_EX and not self.done:
            self.done = True
            assert spool_gc.collect([self.root]) == 1  # the new folder, its lock not yet taken
        fcntl.flock(fd, op)


@pytest.mark.parametrize("moment", ["before-the-lock-file", "before-the-lock"])
def test_a_folder_being_made_is_never_lost(tmp_path, monkeypatch, moment):
    root = str(tmp_path)
    if moment == "before-the-lock":  # the collector removes it; the maker locks an unlinked file, sees that, starts over
        monkeypatch.setattr(spool_gc, "fcntl", _CollectorIn(root))
    else:  # the collector finds no lock file in a new folder
        made, real = [], tempfile.mkdtemp

        def mkdtemp(**kw):
            made.append(real(**kw))
            assert spool_gc.collect([root]) == 0  # no lock file yet, and new: left alone
            return made[-1]

        monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    path, fd = spool_gc.new_folder("tracekit-rank0-", root, LOCK)
    try:
        assert os.listdir(root) == [os.path.basename(path)]  # the first folder was removed, or is this one
        if moment == "before-the-lock-file":
            assert made == [path]
        monkeypatch.undo()
        assert spool_gc.collect([root]) == 0  # ours, locked
        assert os.path.exists(os.path.join(path, LOCK))
    finally:
        os.close(fd)
    assert spool_gc.collect([root]) == 1


def _put(handoff, step):
    handoff.put(step, [("parameters", TensorData("w", "float32", (3,), np.full(3, step, np.float32)))], complete=True)


def test_a_recorder_without_a_launcher_removes_dead_writers_spools_and_keeps_live_ones(tmp_path, monkeypatch):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    monkeypatch.setattr(spool_names, "SHM", str(shm))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv(spool_names.ENV_SPOOL, raising=False)
    stores = {n: str(tmp_path / n) for n in ("live", "killed", "next")}
    for s in stores.values():
        create_store(s, {})
    leftover = folder(tmp, "tracekit-rank7-leftover", ["0000000001.step"], LOCK)  # in the temp folder fallback
    live = Handoff(stores["live"], 0, {"coords": {"rank": 0}}, 1 << 20)
    assert not leftover.exists()
    killed = Handoff(stores["killed"], 1, {"coords": {"rank": 1}}, 1 << 20)
    _put(killed, 1)
    killed.flush()  # its writer runs
    os.kill(killed._proc.pid, signal.SIGSTOP)
    _put(killed, 2)  # spooled, never written: its writer is stopped, then killed
    os.kill(killed._proc.pid, signal.SIGKILL)
    killed._proc.wait()
    killed._in.close()
    killed._proc.stdout.close()
    assert "0000000002.step" in os.listdir(killed.spool)
    assert sorted(os.listdir(shm)) == sorted(os.path.basename(h.spool) for h in (live, killed))
    nxt = Handoff(stores["next"], 2, {"coords": {"rank": 2}}, 1 << 20)
    try:
        assert not os.path.exists(killed.spool)
        assert sorted(os.listdir(shm)) == sorted(os.path.basename(h.spool) for h in (live, nxt))
        _put(live, 1)
    finally:
        live.close("finished")
        nxt.close("finished")
    assert open_store(stores["live"]).rank(0).completed_steps == [1]
    assert open_store(stores["killed"]).rank(1).completed_steps == [1]  # step 2 went with its spool
    assert os.listdir(shm) == [] and os.listdir(tmp) == []
