"""The byte-storage seam (tracekit/store/bytestore.py): one ByteStore per store root, chosen once
from its location, and what differs between a folder and an object store declared as flags."""

import os

import pytest

from tracekit.store import io
from tracekit.store.bytestore import byte_store
from tracekit.store.local_bytes import LocalBytes
from tracekit.store.location import resolve
from tracekit.store.object_bytes import ObjectBytes


def test_a_folder_and_a_url_get_their_implementation_and_flags(tmp_path):
    local = byte_store(str(tmp_path))
    assert isinstance(local, LocalBytes) and local.folder == str(tmp_path)
    assert isinstance(byte_store(resolve(str(tmp_path))), LocalBytes)
    assert local.atomic_rename and local.direct_io and local.read_hints and not local.batch_writes
    remote = byte_store(resolve("s3://bucket/runs/ref"))  # no request is made choosing it
    assert isinstance(remote, ObjectBytes)
    assert not remote.atomic_rename and not remote.direct_io and not remote.read_hints and remote.batch_writes
    assert remote.direct_writes() is None
    assert byte_store(local) is local and byte_store(remote) is remote  # chosen once, passed on as it is


def test_a_path_and_its_byte_store_read_and_write_the_same_objects(tmp_path):
    root = str(tmp_path)
    store = byte_store(root)
    present: set = set()
    assert io.write_objects(store, [("ab/one", [b"12", b"34"]), ("ab/two", [b"x"])], present) == 2
    assert present == {"ab/one", "ab/two"}
    assert io.write_objects(root, [("ab/one", [b"other"])]) == 0  # immutable: already there
    assert not io.write_once(store, "ab/two", [b"y"]) and io.write_once(root, "cd/three", [b"z"])
    for r in (root, store):
        assert io.exists(r, "ab/one") and not io.exists(r, "ab/none")
        assert io.size(r, "ab/one") == 4 and io.size(r, "ab/none") is None
        with io.reader(r, "ab/one", base=1, length=2) as rd:
            buf = bytearray(2)
            assert rd.readinto(0, memoryview(buf)) == 2 and bytes(buf) == b"23"
        io.prefetch(r, [("ab/one", 0, None), ("ab/none", 0, 4)])  # a hint: a missing object is no error
    assert not [f for f in os.listdir(tmp_path / "ab") if f.startswith(".tmp-")]
    with pytest.raises(FileNotFoundError):
        io.reader(store, "ab/none")
