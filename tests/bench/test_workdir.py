"""bench/workdir.py: a bench removes only the folder it made, never the --dir a user names."""

import os

import pytest

from bench.workdir import SENTINEL, own_folder, remove_own


def test_the_bench_folder_is_made_inside_dir_and_only_it_is_removed(tmp_path):
    (tmp_path / "precious.txt").write_text("a user's file")
    folder = own_folder(str(tmp_path), "tracekit-bench-diff")
    assert folder == str(tmp_path / "tracekit-bench-diff")
    (tmp_path / "tracekit-bench-diff" / "ref").mkdir()
    assert own_folder(str(tmp_path), "tracekit-bench-diff") == folder  # reused (--keep)
    remove_own(folder)
    assert not os.path.exists(folder)
    assert (tmp_path / "precious.txt").read_text() == "a user's file"


def test_a_folder_of_that_name_the_bench_did_not_make_is_refused_and_never_removed(tmp_path):
    theirs = tmp_path / "tracekit-bench-diff"
    theirs.mkdir()
    (theirs / "data.bin").write_bytes(b"x")
    with pytest.raises(SystemExit, match="did not make"):
        own_folder(str(tmp_path), "tracekit-bench-diff")
    remove_own(str(theirs))
    assert (theirs / "data.bin").read_bytes() == b"x"
    assert not (theirs / SENTINEL).exists()


def test_a_link_or_a_file_in_its_place_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / SENTINEL).write_text("")
    (tmp_path / "linked").symlink_to(target)
    with pytest.raises(SystemExit, match="not a folder"):
        own_folder(str(tmp_path), "linked")
    remove_own(str(tmp_path / "linked"))
    assert target.exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="not a folder"):
        own_folder(str(tmp_path), "file")


def test_an_empty_folder_of_that_name_is_adopted(tmp_path):
    (tmp_path / "tracekit-bench-diff").mkdir()
    folder = own_folder(str(tmp_path), "tracekit-bench-diff")
    assert os.path.exists(os.path.join(folder, SENTINEL))
