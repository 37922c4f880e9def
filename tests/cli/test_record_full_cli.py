"""`tracekit record --full`: a bad pattern is one line and exit 2, before anything is created."""

from click.testing import CliRunner

from tracekit.cli.record import record


def test_unknown_kind_in_full_is_refused_before_the_store_is_made(tmp_path):
    out = tmp_path / "s"
    res = CliRunner().invoke(record, ["-o", str(out), "--full", "loss:*,gradient:*", "--", "true"])
    assert res.exit_code == 2, res.output
    assert "unknown kind 'gradient'" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()
