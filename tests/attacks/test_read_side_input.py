"""Issue 39, read side: bad input to diff/export is one `Error: ...` line and exit 2, never a
traceback or a hang (docs/RELIABILITY.md, "Damage and bad input on the read side")."""

import os

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.testing import write_store


def _data(scale=1.0):
    return {r: {s: {"parameters": {"w": np.arange(3, dtype=np.float32) * s + r},
                    "loss": {"loss": np.float32(s * scale)}} for s in range(3)} for r in range(2)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    return write_store(d / "ref", _data()), write_store(d / "cand", _data())


def cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


def one_line(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize("content, fragment", [
    (b"rtol = \xff\xfe\n", "not UTF-8"),
    (b"rtol = true\n", "rtol must be a number, not true"),
    (b"atol = false\n", "atol must be a number, not false"),
    (b"[kind.loss]\nrtol = true\n", "rtol must be a number, not true"),
])
def test_a_bad_config_file_is_one_line(pair, tmp_path, content, fragment):
    cfg = tmp_path / "tol.toml"
    cfg.write_bytes(content)
    one_line(cli("diff", "--config", cfg, *pair), fragment)


def test_a_boolean_in_the_config_is_not_read_as_one(pair, tmp_path):
    """The same config with rtol = 1.0 is accepted: only the boolean is refused."""
    cfg = tmp_path / "tol.toml"
    cfg.write_text("rtol = 1.0\n")
    assert cli("diff", "--config", cfg, *pair).exit_code == 0


def test_a_fifo_as_config_is_refused_without_waiting_for_a_writer(pair, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line(cli("diff", "--config", fifo, *pair), "not a regular file")


def test_dev_zero_as_config_is_refused(pair):
    one_line(cli("diff", "--config", "/dev/zero", *pair), "not a regular file")


def test_an_oversized_config_is_refused_before_it_is_read(pair, tmp_path):
    cfg = tmp_path / "huge.toml"
    with open(cfg, "wb") as f:
        f.truncate((1 << 20) + 1)  # sparse: no disk used
    one_line(cli("diff", "--config", cfg, *pair), "more than the")


def test_a_bogus_scheduler_address_is_one_line(pair):
    pytest.importorskip("distributed")
    one_line(cli("diff", "--scheduler", "bogus", *pair), "--scheduler bogus: cannot connect")


@pytest.mark.parametrize("target", ["{ref}", "{ref}/sub", "{ref}/rank_0"])
def test_export_into_a_store_is_refused_and_writes_nothing(pair, target):
    ref = pair[0]
    before = sorted(os.path.relpath(os.path.join(d, f), ref) for d, _, fs in os.walk(ref) for f in fs)
    one_line(cli("export", ref, "-o", target.format(ref=ref)), "is a tracekit store")
    one_line(cli("export", ref, "--rank", "0", "--step", "1", "-o", target.format(ref=ref) + "/x.safetensors"),
             "is a tracekit store")
    after = sorted(os.path.relpath(os.path.join(d, f), ref) for d, _, fs in os.walk(ref) for f in fs)
    assert after == before


def test_export_beside_a_store_still_works(pair, tmp_path):
    result = cli("export", pair[0], "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert os.path.exists(tmp_path / "out" / "rank_1" / "step_2" / "loss.safetensors")
