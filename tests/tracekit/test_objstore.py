"""Stores on an S3-compatible object store (moto on 127.0.0.1): write, read, diff, open, damage."""

import json

import numpy as np
import pytest
import xarray as xr

import tracekit
from tracekit.errors import StoreError
from tracekit.store import RankWriter, TensorData, create_store, finalize_store, open_store
from tracekit.store.location import storage_options_scope
from tracekit.testing import write_store


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


def test_a_store_written_to_a_bucket_reads_back_like_the_same_store_on_disk(s3, tmp_path):
    local = write_store(tmp_path / "local", _data(0))
    remote = write_store(s3.url("runs/ref"), _data(0))
    a, b = open_store(local), open_store(remote)
    assert b.path == s3.url("runs/ref")
    assert a.ranks == b.ranks == [0, 1]
    for r in a.ranks:
        assert a.rank(r).completed_steps == b.rank(r).completed_steps == [1, 2, 3]
        for kind in a.rank(r).kinds:
            for s in a.rank(r).steps(kind):
                for name, value in a.rank(r).read_kind(kind, s).items():
                    np.testing.assert_array_equal(b.rank(r).read(kind, s, name), value)


def test_diff_of_bucket_and_local_stores_is_the_same_report(s3, tmp_path):
    local_ref = write_store(tmp_path / "ref", _data(0))
    local_cand = write_store(tmp_path / "cand", _data(1))
    s3_ref, s3_cand = write_store(s3.url("ref"), _data(0)), write_store(s3.url("cand"), _data(1))

    def comparable(report):
        d = report.to_dict()
        for key in ("ref", "cand"):
            d.pop(key)
        d["stats"].pop("seconds")
        return json.dumps(d, sort_keys=True, default=str)

    on_disk = tracekit.diff(local_ref, local_cand)
    on_s3 = tracekit.diff(s3_ref, s3_cand)
    mixed = tracekit.diff(local_ref, s3_cand)
    assert not on_disk.passed and on_disk.bytes_compared > 0
    assert comparable(on_s3) == comparable(on_disk) == comparable(mixed)
    assert tracekit.diff(s3_ref, local_ref).passed


def test_a_deleted_chunk_object_is_an_error_not_zeros(s3):
    url = write_store(s3.url("ref"), _data(0))
    chunk = f"{s3.bucket}/ref/rank_1/gradients/float32/c/1/0"
    assert s3.fs.exists(chunk)
    s3.fs.rm(chunk)
    with pytest.raises(StoreError, match="rank 1 gradients step 2: unreadable data"):
        open_store(url).rank(1).read("gradients", 2, "w")
    with pytest.raises(StoreError, match="chunk file rank_1/gradients/float32/c/1/0 is missing"):
        tracekit.diff(url, write_store(s3.url("cand"), _data(0)))


def test_a_rank_dead_mid_step_leaves_its_completed_steps_readable(s3):
    """A rank that dies after writing some of a step's objects: the step was never listed, so
    readers see exactly the completed steps (object PUTs are whole; the listing is written last)."""
    url = s3.url("crash")
    create_store(url, {})
    w = RankWriter(url, 0, {"coords": {"rank": 0}})
    grad = lambda s: [TensorData("w", "float32", (4,), np.full(4, s, np.float32))]  # noqa: E731
    for s in (1, 2):
        w.write(s, "gradients", grad(s))
        w.write(s, "loss", [TensorData("loss", "float32", (), np.float32(s))])
        w.complete_step(s)
    w.write(3, "gradients", grad(3))  # step 3: gradients written, then the rank is gone
    objects = s3.objects()
    assert f"{s3.bucket}/crash/rank_0/gradients/float32/c/2/0" in objects  # its bytes did land
    view = open_store(url).rank(0)
    assert view.completed_steps == [1, 2]
    assert view.steps("gradients") == [1, 2]
    assert view.status == "running"
    np.testing.assert_array_equal(view.read("gradients", 2, "w"), np.full(4, 2, np.float32))
    summary = finalize_store(url, 137)
    assert summary["ranks"]["0"]["completed_steps"] == [1, 2]
    assert tracekit.diff(url, url).passed


def test_plain_xarray_and_tracekit_open_read_a_bucket_store(s3):
    url = write_store(s3.url("ref"), _data(0))
    finalize_store(url, 0)
    tree = xr.open_datatree(url, engine="zarr", storage_options={"endpoint_url": s3.endpoint})
    packed = tree["rank_1/gradients"]["float32"].values
    assert packed.shape == (3, 45)  # steps 1-3, w (40) and b (5) packed in one row
    np.testing.assert_array_equal(packed[1, :40], (_data(0)[1][2]["gradients"]["w"]).ravel())
    ds = tracekit.open(url)
    assert ds.attrs["store"] == url
    assert "gradients" in str(ds)


def test_nothing_written_or_reported_holds_the_secret(s3, monkeypatch):
    """Credentials come from the environment (the AWS chain) or options, and stay there."""
    url = write_store(s3.url("ref"), _data(0))
    finalize_store(url, 0)
    report = tracekit.diff(url, url)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # a second secret travels as a storage option only
    option_secret = "tracekit-option-secret-55aa"
    with storage_options_scope({"key": "k", "secret": option_secret}):  # what --storage-option does
        write_store(s3.url("cand"), _data(1), meta={"note": "written with options"})
        opened = open_store(s3.url("cand"))
        assert opened.ranks == [0, 1]
        report2 = tracekit.diff(opened, url)
        text = (json.dumps(report.to_dict(), default=str) + json.dumps(report2.to_dict(), default=str) + repr(opened)
                + json.dumps(opened.meta, default=str) + str(tracekit.open(opened)))
    stored = s3.objects()
    assert len(stored) > 20
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


def test_both_s3_clients_write_and_read_the_same_store(s3, monkeypatch):
    """zarr's ObjectStore (obstore) and FsspecStore (s3fs) are interchangeable on one store."""
    from zarr.storage import FsspecStore, ObjectStore

    from tracekit.store.location import resolve

    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "obstore")
    assert isinstance(resolve(s3.url("x")).zarr_store(), ObjectStore)
    by_obstore = write_store(s3.url("ob"), _data(0))
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "fsspec")
    assert isinstance(resolve(s3.url("x")).zarr_store(), FsspecStore)
    by_fsspec = write_store(s3.url("fs"), _data(0))
    assert tracekit.diff(by_obstore, by_fsspec, exact=True).passed
    monkeypatch.setenv("TRACEKIT_S3_CLIENT", "obstore")
    assert tracekit.diff(by_fsspec, by_obstore, exact=True).passed


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
