import os

import pytest
from click.testing import CliRunner

from tracekit.cli.main import main


def test_help_shows_a_working_example():
    result = CliRunner().invoke(main, ["record", "--help"])
    assert result.exit_code == 0
    assert "tracekit record -o runs/ref -- torchrun --standalone" in result.output


@pytest.mark.parametrize("args, message", [
    (["--", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
    (["--kinds", "bogus", "--", "true"], "unknown kind 'bogus'"),
    (["--ranks", "a-b", "--", "true"], "ranks 'a-b'"),
])
def test_bad_arguments_fail_in_one_line(tmp_path, args, message):
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "s"), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "s")


def test_refuses_non_empty_foreign_directory_even_with_force(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path), "--force", "--", "true"])
    assert result.exit_code == 2
    assert "not a tracekit store" in result.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_forgotten_double_dash_gets_a_hint(tmp_path):
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "s"), "torchrun", "--standalone", "train.py"])
    assert result.exit_code == 2
    assert "No such option '--standalone'. The command to record goes after --, e.g. tracekit record" in result.output
    assert not os.path.exists(tmp_path / "s")


def test_record_refuses_a_nice_value_out_of_range_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "s"), "--writer-nice", "25", "--", "true"])
    assert r.exit_code == 2 and "--writer-nice" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s").exists()


def test_record_refuses_a_hold_larger_than_the_queue_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "s"), "--queue-mb", "8", "--hold-mb", "9", "--", "true"])
    assert r.exit_code == 2 and "--hold-mb" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s").exists()


def test_ranks_whose_writer_failed_get_a_line_per_cause():
    from tracekit.cli.record import recording_failed_lines

    done = {"recording_failed": {3: "OSError: disk full", 0: "OSError: disk full", 1: "OSError: disk full",
                                 2: "ValueError: refused"}}
    assert recording_failed_lines(done) == [
        "tracekit record: ranks 0-1,3: recording failed: OSError: disk full",
        "tracekit record: rank 2: recording failed: ValueError: refused",
    ]
    assert recording_failed_lines({"recording_failed": {}}) == []
