"""io.write_parts: a chunk file written whole (padded), its folder made when missing and only then
(a mkdir per file, 15 a writer's rank-step, locked the folder each time)."""

import os

from tracekit.store import io


def test_a_file_in_a_missing_folder_makes_the_folder_and_is_padded(tmp_path):
    io.write_parts(str(tmp_path), "a/b/c.0.0", [b"ab", b"cd"], pad_to=8)
    assert (tmp_path / "a" / "b" / "c.0.0").read_bytes() == b"abcd\0\0\0\0"


def test_a_file_in_an_existing_folder_asks_for_no_folder(tmp_path, monkeypatch):
    (tmp_path / "hash").mkdir()
    made = []
    real = os.makedirs
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: (made.append(a[0]), real(*a, **k)))
    for row in range(3):
        io.write_parts(str(tmp_path), f"hash/c.{row}.0", [bytes([row]) * 4])
    assert made == []
    assert [(tmp_path / "hash" / f"c.{row}.0").read_bytes() for row in range(3)] == [b"\0" * 4, b"\1" * 4, b"\2" * 4]
    io.write_parts(str(tmp_path), "finite/c.0.0", [b"x"])  # a new folder: made once
    assert made == [str(tmp_path / "finite")]
