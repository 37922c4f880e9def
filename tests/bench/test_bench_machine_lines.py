"""What the benches print about the machine and the run beside their figures: the file system their
stores are on (bench_record.folder_filesystem, read from a mountinfo and a jbd2 listing: real ones
on this machine, made-up ones below), and whether the TorchTitan bench's writers held every step."""

import os

import pytest

from bench.bench_record import folder_filesystem

LINE = "27 1 {dev} / / rw,relatime shared:1 - {fstype} /dev/{name} rw\n"


def _fake(folder, fstype, journals=()):
    """A mountinfo that mounts /dev/vdz (of `fstype`) where `folder` lies, and a jbd2 listing."""
    folder.mkdir()
    st = os.stat(folder)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    info = folder / "mountinfo"
    info.write_text("1 0 0:1 / /other rw - tmpfs tmpfs rw\n" + LINE.format(dev=dev, fstype=fstype, name="vdz"))
    jbd2 = folder / "jbd2"
    jbd2.mkdir()
    for name in journals:
        (jbd2 / name).mkdir()
    return str(info), str(jbd2)


def test_an_ext4_with_and_without_its_journal_and_other_types(tmp_path):
    info, jbd2 = _fake(tmp_path / "a", "ext4", journals=["vdz-8"])
    assert folder_filesystem(str(tmp_path / "a"), info, jbd2) == "ext4 with a journal"
    info, jbd2 = _fake(tmp_path / "b", "ext4", journals=["vdz1-8"])  # another device's journal
    assert folder_filesystem(str(tmp_path / "b"), info, jbd2).startswith("ext4 WITHOUT a journal")
    info, jbd2 = _fake(tmp_path / "c", "xfs")
    assert folder_filesystem(str(tmp_path / "c"), info, jbd2) == "xfs"


def test_what_proc_cannot_say_is_unknown(tmp_path):
    assert folder_filesystem(str(tmp_path / "missing")) == "unknown"
    assert folder_filesystem(str(tmp_path), mountinfo=str(tmp_path / "no-mountinfo")) == "unknown"


def test_the_real_mount_table_names_this_folders_type(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo (not Linux)")
    said = folder_filesystem(str(tmp_path))
    with open("/proc/self/mounts") as f:
        types = {line.split()[2] for line in f}
    assert said.split()[0] in types, said


def test_the_torchtitan_bench_reads_the_store_size_and_says_whether_every_step_was_held():
    from bench.bench_torchtitan import held_line, store_size_mib

    assert store_size_mib("tracekit record: 2 rank(s), ... 730.5 MiB in /tmp/s; ranks: 2 finished") == 730.5
    assert store_size_mib("... 2.5 GiB in /tmp/s; ...") == 2560
    assert store_size_mib("no record line") is None
    assert "every step held" in held_line(730.5, 2, 10)  # 365 MiB a rank, under the default hold
    past = held_line(2560, 2, 40)  # 1280 MiB a rank, 32 a step
    assert "past the hold after about 16 steps" in past, past
