"""Resolving what a user typed (a folder, file://, s3://, memory://) into a store location."""

import os

import pytest

from tracekit.errors import UsageError
from tracekit.store.location import (Location, canonical, child_env, is_url, parse_storage_options, resolve,
                                     same_store, storage_options_scope)


def test_paths_and_urls_are_told_apart():
    assert is_url("s3://bucket/runs/ref") and is_url("memory://x") and is_url("gs://b/k")
    assert not is_url("runs/ref") and not is_url("/abs/ref") and not is_url("file:///abs/ref")
    assert not is_url("weird:name/with://inside")  # a folder name with "://" after a path is no URL


def test_local_paths_become_absolute_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("runs/ref").path == str(tmp_path / "runs" / "ref")
    assert resolve(f"file://{tmp_path}/x").path == str(tmp_path / "x")
    assert canonical("runs/ref") == str(tmp_path / "runs" / "ref")
    assert canonical("s3://b/runs/ref/") == "s3://b/runs/ref"
    assert same_store("runs/ref", str(tmp_path / "runs" / "ref"))
    assert not same_store("s3://b/ref", "s3://b/cand")


def test_storage_options_parse_nested_and_typed():
    opts = parse_storage_options(["endpoint_url=http://127.0.0.1:9000", "anon=false", "client_kwargs.region_name=eu-west-1",
                                  "default_block_size=1048576", "secret=a=b"])
    assert opts == {"endpoint_url": "http://127.0.0.1:9000", "anon": False, "client_kwargs": {"region_name": "eu-west-1"},
                    "default_block_size": 1048576, "secret": "a=b"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])


def test_credentials_in_a_url_are_refused():
    with pytest.raises(UsageError, match="credentials in a store URL"):
        resolve("s3://AKIA:topsecret@bucket/runs/ref")


def test_options_never_show_in_the_location_text(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("TRACEKIT_STORAGE_OPTIONS", raising=False)
    loc = resolve("s3://bucket/runs/ref", {"secret": "topsecret", "key": "AKIA"})
    assert loc.options["secret"] == "topsecret"
    assert "topsecret" not in repr(loc) and "topsecret" not in str(loc)
    assert loc == Location("s3://bucket/runs/ref")  # options take no part in identity


def test_endpoint_from_the_environment_unless_an_option_names_one(monkeypatch):
    monkeypatch.delenv("TRACEKIT_STORAGE_OPTIONS", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert resolve("s3://b/r").options == {"endpoint_url": "http://127.0.0.1:1"}
    assert resolve("s3://b/r", {"endpoint_url": "http://127.0.0.1:2"}).options == {"endpoint_url": "http://127.0.0.1:2"}
    assert resolve("memory://r").options == {}


def test_scoped_options_reach_urls_and_child_processes_then_end(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("TRACEKIT_STORAGE_OPTIONS", '{"anon": false}')
    with storage_options_scope({"client_kwargs": {"region_name": "eu-west-1"}}):
        assert resolve("s3://b/r").options == {"anon": False, "client_kwargs": {"region_name": "eu-west-1"}}
        env = child_env()
    assert resolve("s3://b/r").options == {"anon": False}
    monkeypatch.setenv("TRACEKIT_STORAGE_OPTIONS", env["TRACEKIT_STORAGE_OPTIONS"])
    assert resolve("s3://b/r").options == {"anon": False, "client_kwargs": {"region_name": "eu-west-1"}}
    monkeypatch.setenv("TRACEKIT_STORAGE_OPTIONS", "[1]")
    with pytest.raises(UsageError, match="JSON object"):
        resolve("s3://b/r")


def test_memory_store_round_trip():
    from tracekit.store import open_store
    from tracekit.testing import write_store
    import numpy as np

    url = "memory://tracekit-test-location/run"
    write_store(url, {0: {1: {"loss": {"loss": np.float32(2.5)}}}})
    store = open_store(url)
    assert store.path == url and store.rank(0).read("loss", 1, "loss") == np.float32(2.5)
    assert not os.path.exists("memory:")


def test_sizes_under_walk_a_local_store_once_and_count_what_os_walk_counts(tmp_path):
    """Each rank group's bytes and the whole store's from one walk, as os.walk + getsize count them:
    a link to a file counts its target, a link to a folder is not followed."""
    from tracekit.store.location import resolve

    (tmp_path / "rank_0" / "a" / "c").mkdir(parents=True)
    (tmp_path / "rank_0" / "a" / "c" / "0").write_bytes(b"x" * 100)
    (tmp_path / "rank_0" / "zarr.json").write_bytes(b"y" * 7)
    (tmp_path / "rank_1").mkdir()
    (tmp_path / "rank_1" / "f").write_bytes(b"z" * 30)
    (tmp_path / "zarr.json").write_bytes(b"w" * 5)
    os.symlink(tmp_path / "rank_0" / "zarr.json", tmp_path / "rank_1" / "link")  # counted: 7
    os.symlink(tmp_path / "rank_0", tmp_path / "rank_1" / "folder-link")  # not followed

    def walked(folder):
        return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)

    loc = resolve(str(tmp_path))
    per_rank, total = loc.sizes_under(["rank_0", "rank_1", "rank_9"])
    assert per_rank == {"rank_0": 107, "rank_1": 37, "rank_9": 0}
    assert total == walked(tmp_path) == 149
    assert loc.size_under("rank_1") == walked(tmp_path / "rank_1") == 37
