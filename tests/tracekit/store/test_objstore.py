"""Stores on an S3-compatible object store (moto on 127.0.0.1): write, read, diff, open, damage.

Tests that hold for both store formats run on each: format 2 (content-addressed objects PUT
through the store's API, the default) and format 1 (packed arrays, still readable and writable)."""

import json
import uuid

import numpy as np
import pytest
import xarray as xr

import tracekit
from tracekit.errors import StoreError
from tracekit.store import RankWriter, TensorData, create_store, finalize_store, open_store
from tracekit.store.format import OBJECTS_DIR, object_key
from tracekit.store.hashing import tensor_hash
from tracekit.store.location import storage_options_scope
from tracekit.store.verify import verify_store
from tracekit.testing import write_store
from tracekit.store.places import located

from tests.conftest import S3_SECRET

both_formats = pytest.mark.parametrize("fmt", [2, 1])


def _data(seed: int, steps=(1, 2, 3)):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    out = {}
    for rank in (0, 1):
        out[rank] = {0: {"parameters": {"w": w}}}
        for s in steps:
            out[rank][s] = {"loss": {"loss": np.float32(1.0 / s)},
                            "gradients": {"w": (w * s + rank).astype(np.float32), "b": np.arange(5, dtype=np.float32)},
                            "parameters": {"w": (w - 0.1 * s).astype(np.float32)}}
    return out


@pytest.fixture(scope="module")
def written(s3_server):
    """Per format, _data(0) as `ref` (finalized, exit code 0) and _data(1) as `cand`, written once
    into a bucket of this worker's S3 server with the environment's credentials (as the `s3`
    fixture sets them): (bucket, {fmt: (ref, cand)}). For the tests that only read them; a test
    that writes or damages a store writes its own."""
    bucket = f"objstore-written-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env(S3_SECRET).items():
            mp.setenv(k, v)
        mp.delenv("TRACEKIT_STORAGE_OPTIONS", raising=False)
        s3_server.make_bucket(bucket, S3_SECRET)
        stores = {}
        for fmt in (2, 1):
            ref = write_store(f"s3://{bucket}/f{fmt}/ref", _data(0), format_version=fmt)
            finalize_store(ref, 0)
            stores[fmt] = (ref, write_store(f"s3://{bucket}/f{fmt}/cand", _data(1), format_version=fmt))
    return bucket, stores


@both_formats
def test_a_store_written_to_a_bucket_reads_back_like_the_same_store_on_disk(s3, written, tmp_path, fmt):
    local = write_store(tmp_path / "local", _data(0), format_version=fmt)
    remote = written[1][fmt][0]
    a, b = open_store(local), open_store(remote)
    assert b.path == f"s3://{written[0]}/f{fmt}/ref"
    assert a.format_version == b.format_version == fmt
    assert a.ranks == b.ranks == [0, 1]
    for r in a.ranks:
        assert a.rank(r).completed_steps == b.rank(r).completed_steps == [1, 2, 3]
        for kind in a.rank(r).kinds:
            for s in a.rank(r).steps(kind):
                for name, value in a.rank(r).read_kind(kind, s).items():
                    np.testing.assert_array_equal(b.rank(r).read(kind, s, name), value)


@both_formats
def test_diff_of_bucket_and_local_stores_is_the_same_report(s3, written, tmp_path, fmt):
    local_ref = write_store(tmp_path / "ref", _data(0), format_version=fmt)
    local_cand = write_store(tmp_path / "cand", _data(1), format_version=fmt)
    s3_ref, s3_cand = written[1][fmt]

    def comparable(report):
        d = report.to_dict()
        for key in ("ref", "cand", "drift"):  # drift: the replay command, which names the stores
            d.pop(key, None)
        d["stats"].pop("seconds")
        return json.dumps(d, sort_keys=True, default=str)

    on_disk = tracekit.diff(local_ref, local_cand)
    on_s3 = tracekit.diff(s3_ref, s3_cand)
    mixed = tracekit.diff(local_ref, s3_cand)
    assert not on_disk.passed and on_disk.bytes_compared > 0
    assert comparable(on_s3) == comparable(on_disk) == comparable(mixed)
    assert tracekit.diff(s3_ref, local_ref).passed


def test_a_deleted_chunk_object_is_an_error_not_zeros(s3):
    url = write_store(s3.url("ref"), _data(0), format_version=1)
    chunk = f"{s3.bucket}/ref/rank_1/gradients/float32/c/1/0"
    assert s3.fs.exists(chunk)
    s3.fs.rm(chunk)
    with pytest.raises(StoreError, match="rank 1 gradients step 2: unreadable data"):
        open_store(url).rank(1).read("gradients", 2, "w")
    with pytest.raises(StoreError, match="chunk file rank_1/gradients/float32/c/1/0 is missing"):
        tracekit.diff(url, write_store(s3.url("cand"), _data(0)))


def test_a_deleted_or_altered_object_of_a_format_2_bucket_store_is_damage(s3):
    """Reads check each object's bytes against its hash on a bucket as on disk: a missing object
    or one whose bytes changed (same size) is a damaged store, never zeros or a numeric verdict."""
    url = write_store(s3.url("ref"), _data(0), format_version=2)
    view = open_store(url).rank(1)
    info = view.tensor("gradients", "w")
    key = object_key(view.digests("gradients", 2)["w"])
    obj = f"{s3.bucket}/ref/{key}"
    good = s3.fs.cat_file(obj)
    assert len(good) == info.nbytes
    s3.fs.pipe_file(obj, bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(StoreError, match=f"damaged store: .*rank 1 gradients step 2.*w.*bytes do not match their hash \\(object {key}\\)"):
        open_store(url).rank(1).read("gradients", 2, "w")
    s3.fs.rm(obj)
    with pytest.raises(StoreError, match=f"its object {key} is missing"):
        open_store(url).rank(1).read("gradients", 2, "w")


def test_a_damaged_pack_member_in_a_bucket_is_damage(s3):
    """Format 3 on a bucket: a flipped bit in one tensor's range of a pack is damage named for
    that tensor (read with a ranged GET); a pack gone is damage for each of its members."""
    url = write_store(s3.url("ref"), _data(0))
    loc = located(open_store(url).rank(1), "gradients", 2, "w")
    assert loc.length is not None, "small tensors are packed in format 3"
    obj = f"{s3.bucket}/ref/{loc.key}"
    good = bytearray(s3.fs.cat_file(obj))
    good[loc.base + 1] ^= 1
    s3.fs.pipe_file(obj, bytes(good))
    with pytest.raises(StoreError, match=r"damaged store: .*rank 1 gradients step 2 tensor w: bytes do not match their hash"):
        open_store(url).rank(1).read("gradients", 2, "w")
    assert [(p.rank, p.step, p.tensor) for p in verify_store(url).problems] == [(1, 2, "w")]
    s3.fs.rm(obj)
    with pytest.raises(StoreError, match=r"is missing"):
        open_store(url).rank(1).read("gradients", 2, "w")


@pytest.mark.parametrize("fmt", [2, 3])
def test_an_object_already_in_the_bucket_is_not_put_again(s3, monkeypatch, fmt):
    """Content addressing on an object store: bytes identical across ranks or steps are one object,
    PUT once (the second writer finds it with a HEAD, or in its own list of what it wrote). Format 3:
    the step-1 pack holding w, then (w unchanged) w's own object, each PUT once for both ranks."""
    from tracekit.store.location import Location

    asked = []  # the object keys each call asks the bucket about (HEAD, then PUT if absent)
    put_missing = Location.put_missing

    def counted(self, items):
        asked.append([k for k, _ in items])
        return put_missing(self, items)

    monkeypatch.setattr(Location, "put_missing", counted)
    url = s3.url("dedup")
    create_store(url, {}, format_version=fmt)
    w = np.arange(12, dtype=np.float32)
    written = []
    for rank in (0, 1):
        rw = RankWriter(url, rank, {"coords": {"rank": rank}})
        for step in (1, 2, 3):  # the same parameters at every step (frozen) and on both ranks (a replica)
            rw.write(step, "parameters", [TensorData("w", "float32", (12,), w)])
            rw.complete_step(step)
        written.append(rw.kinds["parameters"].objects_written)
        rw.close()
    key = object_key(tensor_hash("w", "float32", (12,), w))
    if fmt == 2:
        assert written == [1, 0]
        assert asked == [[key], [key]]  # once per writer: steps 2 and 3 of a writer ask nothing
    else:
        from tracekit.store.packs import pack_key

        assert written == [2, 0]
        assert asked == [[pack_key([bytes.fromhex(key.replace("/", "")[len(OBJECTS_DIR):])])], [key]] * 2
    objects = [k for k in s3.keys() if f"/dedup/{OBJECTS_DIR}/" in k and not k.endswith("zarr.json")]
    assert len(objects) == fmt - 1
    store = open_store(url)
    for rank in (0, 1):
        np.testing.assert_array_equal(store.rank(rank).read("parameters", 3, "w"), w)


@both_formats
def test_a_rank_dead_mid_step_leaves_its_completed_steps_readable(s3, fmt):
    """A rank that dies after writing some of a step's objects: the step was never listed, so
    readers see exactly the completed steps (object PUTs are whole; the listing is written last)."""
    url = s3.url("crash")
    create_store(url, {}, format_version=fmt)
    w = RankWriter(url, 0, {"coords": {"rank": 0}})
    grad = lambda s: [TensorData("w", "float32", (4,), np.full(4, s, np.float32))]  # noqa: E731
    for s in (1, 2):
        w.write(s, "gradients", grad(s))
        w.write(s, "loss", [TensorData("loss", "float32", (), np.float32(s))])
        w.complete_step(s)
    w.write(3, "gradients", grad(3))  # step 3: gradients written, then the rank is gone
    objects = s3.keys()
    landed = (f"{s3.bucket}/crash/rank_0/gradients/float32/c/2/0" if fmt == 1 else  # its bytes did land
              f"{s3.bucket}/crash/{object_key(tensor_hash('w', 'float32', (4,), np.full(4, 3, np.float32)))}")
    assert landed in objects
    view = open_store(url).rank(0)
    assert view.completed_steps == [1, 2]
    assert view.steps("gradients") == [1, 2]
    assert view.status == "running"
    np.testing.assert_array_equal(view.read("gradients", 2, "w"), np.full(4, 2, np.float32))
    summary = finalize_store(url, 137)
    assert summary["ranks"]["0"]["completed_steps"] == [1, 2]
    assert tracekit.diff(url, url).passed


@both_formats
def test_plain_xarray_and_tracekit_open_read_a_bucket_store(s3, written, fmt):
    url = written[1][fmt][0]  # finalized
    tree = xr.open_datatree(url, engine="zarr", storage_options={"endpoint_url": s3.endpoint})
    expected = _data(0)[1][2]["gradients"]["w"]
    if fmt == 1:
        packed = tree["rank_1/gradients"]["float32"].values
        assert packed.shape == (3, 45)  # steps 1-3, w (40) and b (5) packed in one row
        np.testing.assert_array_equal(packed[1, :40], expected.ravel())
    else:  # plain xarray sees the index: one 16-byte hash per tensor and step
        assert tree["rank_1/gradients"]["hash"].values.shape == (3, 32)
    ds = tracekit.open(url)
    assert ds.attrs["store"] == url
    assert "gradients" in str(ds)
    np.testing.assert_array_equal(ds["gradients"]["w"].sel(rank=1, step=2).values, expected)


@both_formats
def test_nothing_written_or_reported_holds_the_secret(s3, written, monkeypatch, fmt):
    """Credentials come from the environment (the AWS chain) or options, and stay there."""
    url = written[1][fmt][0]  # written and finalized with the environment's credentials
    report = tracekit.diff(url, url)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # a second secret travels as a storage option only
    option_secret = "tracekit-option-secret-55aa"
    with storage_options_scope({"key": "k", "secret": option_secret}):  # what --storage-option does
        write_store(s3.url("cand"), _data(1), meta={"note": "written with options"}, format_version=fmt)
        opened = open_store(s3.url("cand"))
        assert opened.ranks == [0, 1]
        report2 = tracekit.diff(opened, url)
        text = (json.dumps(report.to_dict(), default=str) + json.dumps(report2.to_dict(), default=str) + repr(opened)
                + json.dumps(opened.meta, default=str) + str(tracekit.open(opened)))
    stored = s3.objects()  # the store written with options
    stored.update((k, s3.fs.cat_file(k)) for k in s3.fs.find(f"{written[0]}/f{fmt}/ref"))  # and with the environment's
    assert len(stored) > 20 and any(k.startswith(f"{written[0]}/") for k in stored)
    for secret in (s3.secret, option_secret):
        assert secret not in text
        assert not any(secret.encode() in blob for blob in stored.values())


def test_create_refuses_a_foreign_prefix_and_overwrites_only_with_force(s3):
    s3.fs.pipe_file(f"{s3.bucket}/mine/notes.txt", b"keep me")
    with pytest.raises(StoreError, match="not a tracekit store; refusing"):
        create_store(s3.url("mine"), {}, force=True)
    assert s3.fs.cat_file(f"{s3.bucket}/mine/notes.txt") == b"keep me"
    url = write_store(s3.url("ref"), _data(0))
    with pytest.raises(StoreError, match="already holds a tracekit store"):
        create_store(url, {})
    write_store(url, {0: {1: {"loss": {"loss": np.float32(7)}}}}, force=True)
    store = open_store(url)
    assert store.ranks == [0] and store.rank(0).read("loss", 1, "loss") == np.float32(7)


def test_a_missing_bucket_or_prefix_is_one_line(s3):
    with pytest.raises(StoreError, match="no such store"):
        open_store(s3.url("nothing/here"))
    with pytest.raises(StoreError):
        open_store("s3://no-such-bucket-tracekit/ref")


@both_formats
def test_both_s3_clients_write_and_read_the_same_store(s3, monkeypatch, fmt):
    """zarr's ObjectStore (obstore) and FsspecStore (s3fs) are interchangeable on one store."""
    from zarr.storage import FsspecStore, ObjectStore

    from tracekit.store.location import resolve

    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "obstore")
    assert isinstance(resolve(s3.url("x")).zarr_store(), ObjectStore)
    by_obstore = write_store(s3.url("ob"), _data(0), format_version=fmt)
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "fsspec")
    assert isinstance(resolve(s3.url("x")).zarr_store(), FsspecStore)
    by_fsspec = write_store(s3.url("fs"), _data(0), format_version=fmt)
    assert tracekit.diff(by_obstore, by_fsspec, exact=True).passed
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "obstore")
    assert tracekit.diff(by_fsspec, by_obstore, exact=True).passed
    for url in (by_obstore, by_fsspec):  # each client reads every byte the other wrote
        store = open_store(url)
        np.testing.assert_array_equal(store.rank(1).read("gradients", 3, "w"), _data(0)[1][3]["gradients"]["w"])
        assert verify_store(url).ok


def test_auto_client_choice(monkeypatch):
    from zarr.storage import FsspecStore, ObjectStore

    from tracekit.errors import UsageError
    from tracekit.store.location import resolve

    monkeypatch.delenv("TRACEKIT_S3_CLIENT", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert isinstance(resolve("s3://b/r", {"key": "k", "secret": "s"}).zarr_store(), ObjectStore)
    # an option only s3fs knows, or a named profile (botocore reads profiles): s3fs serves the URL
    assert isinstance(resolve("s3://b/r", {"default_block_size": 1 << 20}).zarr_store(), FsspecStore)
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert isinstance(resolve("s3://b/r").zarr_store(), FsspecStore)
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "obstore")
    with pytest.raises(UsageError, match="not one the obstore client takes"):
        resolve("s3://b/r", {"default_block_size": 1}).zarr_store()
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "boto")
    with pytest.raises(UsageError, match="auto, obstore or fsspec"):
        resolve("s3://b/r").zarr_store()


def test_any_fsspec_url_holds_format_2_memory(tmp_path):
    """Not only S3: a memory:// store (zarr's FsspecStore) is written in format 2 as well, reads back
    equal to the same store on disk, and a changed object in it is damage verify names."""
    import uuid

    import fsspec

    url = f"memory://tracekit-{uuid.uuid4().hex}/ref"
    write_store(url, _data(0))
    local = write_store(tmp_path / "local", _data(0))
    store = open_store(url)
    assert store.format_version == 6  # the current format: packs (3), sealed rows (4), index text (5), flat keys (6)
    assert tracekit.diff(url, local, exact=True).passed
    np.testing.assert_array_equal(store.rank(1).read("gradients", 3, "w"), _data(0)[1][3]["gradients"]["w"])
    assert verify_store(url).ok
    fs = fsspec.filesystem("memory")
    # format 6: each index row's chunk at a flat key (`hash/c.<row>.0`), listed and read as such
    rows = [k for k in fs.find(url.removeprefix("memory://")) if "/hash/" in k and not k.endswith("zarr.json")]
    assert rows and all(k.rsplit("/hash/", 1)[1].startswith("c.") for k in rows), rows
    loc = located(store.rank(0), "gradients", 1, "b")
    path = f"{url.removeprefix('memory://')}/{loc.key}"
    good = bytearray(fs.cat_file(path))
    n = store.rank(0).tensor("gradients", "b").stored_nbytes
    good[loc.base:loc.base + n] = good[loc.base:loc.base + n][::-1]  # same size, other bytes
    fs.pipe_file(path, bytes(good))
    problems = verify_store(url).problems
    # named once per entry whose bytes lie there (format 3: b's range of the pack rank 0 wrote at step 1)
    uses = [(r, "gradients", s, "b") for r in (0, 1) for s in (1, 2, 3) if located(store.rank(r), "gradients", s, "b") == loc]
    assert uses and [(p.rank, p.kind, p.step, p.tensor) for p in problems] == uses
    assert all("bytes do not match their hash" in p.what for p in problems)
    fs.rm(url.removeprefix("memory://"), recursive=True)
