"""samples/device_check.py in-process: how a check reports a failed command, commands shared
between checks, its flags, and its wheel list against what the tests run with. The dry run of its
checks under torchrun is tests/e2e/samples/test_device_check.py."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import time

import pytest

from tests import paths

if paths.REPO not in sys.path:
    sys.path.insert(0, paths.REPO)

from samples import device_check  # noqa: E402

TORCHRUN_ENDING = """\
Traceback (most recent call last):
  File "train.py", line 3, in <module>
ImportError: cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp'
E1207 06:35:11 failed (exitcode: 1) local_rank: 0
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""


def test_a_failure_is_told_by_its_error_not_by_torchruns_banner():
    line = device_check._telling_line(TORCHRUN_ENDING, 1)
    assert line == "ImportError: cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp'"


def test_a_ranks_exception_is_told_before_the_launchers_summary():
    output = ("[rank0]: Traceback (most recent call last):\n"
              "[rank0]: RuntimeError: The tensor has a non-zero number of elements\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
              "Error: nothing was recorded in titan-cpu: no rank started recording\n")
    assert device_check._telling_line(output, 1) == "[rank0]: RuntimeError: The tensor has a non-zero number of elements"
    assert device_check._telling_line("Error: /x is not a tracekit store\n", 2) == "Error: /x is not a tracekit store"


def test_a_success_is_told_by_its_last_line():
    assert device_check._telling_line("ImportError: printed, not raised\nPASS comparison ranks=1 steps=2\n\n", 0) == \
        "PASS comparison ranks=1 steps=2"
    assert device_check._telling_line("", 1) == ""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_failed_command_ends_its_check_and_every_check_that_shares_it(tmp_path):
    log = open(tmp_path / "checks.log", "w")
    checks = device_check.Checks(str(tmp_path), log)
    ok = ("ref", python("print('recorded')"), None)
    broken = ("seed", python("raise ImportError('no such name')"), None)
    checks.check("first", [ok, broken, ("cand", python("print('never')"), None)], python("print('PASS')"))
    checks.check("second", [ok, broken], python("print('PASS')"))
    log.close()
    for result in checks.results:
        assert result["result"] == "not run to the end: seed exited 1: ImportError: no such name"
        assert "verdict" not in result
    text = (tmp_path / "checks.log").read_text()
    assert text.count("print('recorded')") == 1 and text.count("no such name") == 2  # each command ran once
    assert "never" not in text


def test_the_diff_gives_the_verdict_and_an_exit_over_1_is_no_verdict(tmp_path):
    with open(tmp_path / "checks.log", "w") as log:
        checks = device_check.Checks(str(tmp_path), log)
        ref = ("ref", python("print('recorded')"), None)
        checks.check("passes", [ref], python("print('PASS comparison ranks=1 steps=5')"))
        checks.check("fails", [ref], python("import sys; print('Error: a line of the report'); "
                                            "print('FAIL comparison ranks=1 steps=5'); sys.exit(1)"))
        checks.check("broken", [ref], python("import sys; print('Error: not a tracekit store'); sys.exit(2)"))
    passes, fails, broken = checks.results
    assert passes["verdict"] == "PASS comparison ranks=1 steps=5" and "result" not in passes
    assert fails["verdict"] == "FAIL comparison ranks=1 steps=5" and "result" not in fails  # a FAIL is a finding
    assert broken["result"] == "the diff gave no verdict (exit 2): Error: not a tracekit store"


@pytest.mark.parametrize("argv", [[], ["--out", "x", "--steps", "0"], ["--out", "x", "--only", "titan"]])
def test_a_wrong_flag_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        device_check.main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_a_check_not_run_to_the_end_exits_1_and_the_summary_names_it(tmp_path, monkeypatch):
    """The summary and the log are written whatever the checks came to."""
    monkeypatch.setattr(device_check, "cuda_here", lambda: False)
    monkeypatch.setattr(device_check.Checks, "check", lambda self, name, commands, diff: self.results.append(
        {"check": name, "steps": [], "result": "not run to the end: seed exited 1: ImportError: x"}))
    assert device_check.main(["--out", str(tmp_path), "--only", "titan-eager"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cuda"] is False and [c["check"] for c in summary["checks"]] == ["titan-eager"]
    assert (tmp_path / "checks.log").exists()


def installed(name: str) -> str:
    return f"{name}=={name.upper()}.0"  # a version no release has: the pin comes from here


def test_an_out_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        device_check.main(["--out", str(tmp_path / "file" / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: cannot write into --out {tmp_path / 'file' / 'out'}: " in err and "Traceback" not in err


def test_prepare_fetches_each_wheel_at_the_version_installed_here_for_the_gpu_machines_python(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(device_check.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: f"{name.upper()}.0")
    assert device_check.prepare(str(tmp_path / "wheels")) == 0
    download, wheel = calls
    assert download[3:5] == ["download", "--no-deps"]
    assert {installed(name) for name in device_check.WHEELS} <= set(download)
    assert download[download.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in download
    assert wheel[3] == "wheel" and wheel[-1] == device_check.ROOT
    assert download[download.index("-d") + 1] == wheel[wheel.index("-w") + 1] == str(tmp_path / "wheels")


def test_prepare_refuses_when_a_package_is_not_installed_here(tmp_path, monkeypatch, capsys):
    def version(name):
        if name == "torchtitan":
            raise importlib.metadata.PackageNotFoundError(name)
        return "1.0"
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(device_check.subprocess, "run", lambda cmd, **kw: pytest.fail(f"ran {cmd}"))
    assert device_check.prepare(str(tmp_path / "wheels")) == 1
    assert capsys.readouterr().err.startswith("Error: torchtitan is not installed here")
    assert not (tmp_path / "wheels").exists()


def test_the_wheels_named_are_installed_here_with_the_tests():
    """Every package the GPU machine is sent is one the tests here run with ('.[dev]')."""
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (pip install -e '.[dev]' installs it)")
    for name in device_check.WHEELS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name} is in device_check.WHEELS but not installed with the tests (pyproject's dev extra)")


def test_prepare_stops_at_a_failed_download(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(device_check.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 1))
    assert device_check.prepare(str(tmp_path / "wheels")) == 1
    assert len(calls) == 1 and capsys.readouterr().err == "Error: pip download failed (above)\n"


def test_a_command_past_the_timeout_is_ended_with_its_process_group(tmp_path):
    """torchrun's ranks are the command's children: they end with it, and the check says so."""
    code = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(child.pid, flush=True); time.sleep(60)")
    with open(tmp_path / "checks.log", "w") as log:
        # 5 s: time for the command to start its child and say its pid on a loaded machine
        checks = device_check.Checks(str(tmp_path), log, timeout=5)
        checks.check("slow", [("ref", python(code), None)], python("print('PASS')"))
    (result,) = checks.results
    assert result["result"] == "not run to the end: ref exited 124: timed out after 5 s (--timeout)"
    child = int((tmp_path / "checks.log").read_text().splitlines()[1])
    assert ended(child), "the command's child outlived it"


def ended(pid: int, within: float = 10.0) -> bool:
    """Whether `pid` is gone or a zombie within `within` seconds. The output's end came when the
    child's files were closed, which an exiting process does before it becomes a zombie, so it
    may still show as running for a moment."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_each_check_is_reported_as_it_ends(tmp_path):
    """The summary is rewritten after each check, so a run cut short keeps the checks it finished."""
    seen = []
    with open(tmp_path / "checks.log", "w") as log:
        checks = device_check.Checks(str(tmp_path), log, on_result=lambda: seen.append([r["check"] for r in checks.results]))
        for name in ("first", "second"):
            checks.check(name, [], python("print('PASS comparison ranks=1 steps=1')"))
    assert seen == [["first"], ["first", "second"]]
