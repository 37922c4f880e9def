"""Large objects written around the page cache (O_DIRECT, tracekit/store/io.py): the same bytes
as a plain write, whatever the size's tail; taken only where it can be; refused quietly."""

import errno
import mmap
import os

import numpy as np
import pytest

from tracekit.store import io

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")


def _aligned(n: int, seed: int = 0) -> memoryview:
    """n random bytes at a page-aligned address (as a rank's spool holds them)."""
    m = mmap.mmap(-1, max(n, 1))
    view = memoryview(m)[:n]
    np.frombuffer(view, dtype=np.uint8)[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return view


def _direct(enabled=True):
    d = io.Direct.__new__(io.Direct)
    d.enabled = enabled
    return d


@pytest.fixture
def opens(monkeypatch):
    """The flags of every os.open, as (basename, flags)."""
    seen = []
    real = os.open

    def spy(path, flags, *a, **k):
        seen.append((os.path.basename(path), flags))
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    return seen


def test_head_is_the_whole_blocks_of_one_large_aligned_buffer():
    d = _direct()
    n = io.DIRECT_MIN + 4095
    assert d.head([_aligned(n)]) == io.DIRECT_MIN
    assert d.head([_aligned(io.DIRECT_MIN - 1)]) == 0  # small: buffered
    assert d.head([_aligned(n), _aligned(4096)]) == 0  # several parts: buffered
    assert d.head([_aligned(n + 1)[1:]]) == 0  # not at an aligned address
    assert _direct(False).head([_aligned(n)]) == 0


@pytest.mark.parametrize("extra", [0, 1, 4095, 4096, 10000])
def test_direct_and_plain_writes_store_the_same_bytes(tmp_path, opens, extra):
    if io.fs_type(str(tmp_path)) not in io.DIRECT_FS:
        pytest.skip(f"{tmp_path} is on {io.fs_type(str(tmp_path))}, which takes no O_DIRECT here")
    view = _aligned(io.DIRECT_MIN + extra, seed=extra)
    d = io.direct_writes(str(tmp_path))
    assert d.enabled
    (tmp_path / "ab").mkdir()  # one open per object
    assert io.write_objects(str(tmp_path), [("ab/direct", [view])], set(), d) == 1
    assert io.write_objects(str(tmp_path), [("ab/plain", [view])], set()) == 1
    direct = [flags for name, flags in opens if name.startswith(".tmp-")]
    assert direct[0] & os.O_DIRECT and not direct[1] & os.O_DIRECT
    assert (tmp_path / "ab" / "direct").read_bytes() == (tmp_path / "ab" / "plain").read_bytes() == bytes(view)
    assert d.enabled  # nothing refused
    assert not [f for f in os.listdir(tmp_path / "ab") if f.startswith(".tmp-")]


def test_a_file_system_that_refuses_o_direct_gets_a_plain_write(tmp_path, monkeypatch):
    """tmpfs and others refuse O_DIRECT at open (EINVAL): the object is written plainly, and the
    store's later objects too."""
    real = os.open

    def refuse(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", refuse)
    d = _direct()
    view = _aligned(io.DIRECT_MIN + 7)
    assert io.write_objects(str(tmp_path), [("cd/x", [view])], set(), d) == 1
    assert (tmp_path / "cd" / "x").read_bytes() == bytes(view)
    assert not d.enabled


def test_a_refused_direct_write_is_finished_plainly(tmp_path, monkeypatch):
    """A file system may take the open and refuse the write (EINVAL): the write goes on without
    O_DIRECT from where it stopped."""
    real = os.write
    calls = []

    def refuse_direct(fd, data):
        import fcntl
        calls.append(len(data))
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(os, "write", refuse_direct)
    d = _direct()
    view = _aligned(io.DIRECT_MIN + 100, seed=3)
    try:
        io.write_objects(str(tmp_path), [("ef/y", [view])], set(), d)
    except OSError as e:  # a file system with no O_DIRECT at all refuses the open first
        pytest.fail(f"not finished plainly: {e}")
    assert (tmp_path / "ef" / "y").read_bytes() == bytes(view)
    assert not d.enabled


def test_direct_writes_are_off_on_request_and_off_tmpfs(tmp_path, monkeypatch):
    monkeypatch.setenv(io.ENV_DIRECT, "0")
    assert not io.Direct(str(tmp_path)).enabled
    monkeypatch.delenv(io.ENV_DIRECT)
    if os.path.isdir("/dev/shm") and io.fs_type("/dev/shm") == "tmpfs":
        assert not io.Direct("/dev/shm").enabled


def test_fs_type_finds_the_innermost_mount(tmp_path):
    if not os.path.exists("/proc/self/mounts"):
        pytest.skip("no /proc/self/mounts")
    assert io.fs_type("/proc") == "proc"
    assert io.fs_type(str(tmp_path)) is not None


def test_a_rank_writer_writes_a_large_spooled_tensor_directly(tmp_path, opens):
    from tracekit.store import RankWriter, TensorData, create_store

    store = tmp_path / "s"
    if io.fs_type(str(tmp_path)) not in io.DIRECT_FS:
        pytest.skip(f"{tmp_path} is on {io.fs_type(str(tmp_path))}, which takes no O_DIRECT here")
    create_store(str(store), {"mode": "ddp"}, format_version=2)
    w = RankWriter(str(store), 0, {"coords": {"rank": 0, "world_size": 1}})
    data = np.frombuffer(_aligned(4 << 20, seed=5), dtype=np.float32)  # as a mapped spool entry holds it
    w.write(1, "parameters", [TensorData("w", "float32", data.shape, data)])
    w.complete_step(1)
    w.close()
    assert any(flags & os.O_DIRECT for name, flags in opens if name.startswith(".tmp-"))
    objects = [os.path.join(d, f) for d, _, fs in os.walk(store / "objects") for f in fs if f != "zarr.json"]
    assert [open(p, "rb").read() for p in objects] == [data.tobytes()]


def test_spooled_tensors_sit_at_page_boundaries(tmp_path):
    from tracekit.writer.spool import read_entry, write_entry
    from tracekit.store import TensorData

    path = tmp_path / "e.step"
    tensors = [("parameters", TensorData(f"t{i}", "float32", (n,), np.ones(n, np.float32))) for i, n in enumerate((3, 1000, 5))]
    write_entry(str(path), 1, True, tensors)
    entry = read_entry(str(path))
    try:
        got = entry.kinds["parameters"]
        assert [t.name for t in got] == ["t0", "t1", "t2"]
        assert all(np.asarray(t.data).ctypes.data % 4096 == 0 for t in got)
    finally:
        entry.close()
