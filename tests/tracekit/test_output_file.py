"""Users' output files: replaced whole where a rename is safe, written into where it would destroy."""

import os

from tracekit.output_file import write_output, written_in_place


def test_new_and_regular_files_are_replaced_links_fifos_and_devices_written_into(tmp_path):
    regular = tmp_path / "r.html"
    regular.write_text("old")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.html"
    link.symlink_to(regular)
    assert not written_in_place(str(tmp_path / "new.html"))
    assert not written_in_place(str(regular))
    assert written_in_place(str(link)) and written_in_place(str(fifo))
    if os.path.exists("/dev/null"):
        assert written_in_place("/dev/null")


def test_write_output_replaces_a_regular_file_whole(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("a much longer older content")
    write_output(str(out), b"new")
    assert out.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_opens(tmp_path):
    private = tmp_path / "private.html"
    private.write_text("old")
    os.chmod(private, 0o600)
    write_output(str(private), b"new")
    assert private.read_bytes() == b"new" and (os.stat(private).st_mode & 0o777) == 0o600
    umask = os.umask(0o022)
    os.umask(umask)
    write_output(str(tmp_path / "new.html"), b"x")
    with open(tmp_path / "as_open.html", "wb"):
        pass
    assert (os.stat(tmp_path / "new.html").st_mode & 0o777) == (os.stat(tmp_path / "as_open.html").st_mode & 0o777) \
        == 0o666 & ~umask
