"""`tracekit record` and `tracekit show` state what a zero-code recording covers: how many of the
optimizer's parameters, which were left out and why (--strict: an error), the root model and what
its recorded output is. The script (tests/recorders/llama_like.py) never imports tracekit."""

import os

from click.testing import CliRunner

from tracekit.cli.main import main


def test_model_option_reaches_the_workers_and_needs_zero_code(tmp_path):
    from tracekit.launch.bootstrap_env import bootstrap_env

    assert bootstrap_env(model="Llama3Model")["TRACEKIT_MODEL"] == "Llama3Model"  # zerocode.py reads it
    assert "TRACEKIT_MODEL" not in bootstrap_env()
    result = CliRunner().invoke(main, ["record", "--no-zero-code", "--model", "Llama3Model", "-o", str(tmp_path / "s"),
                                       "--", "true"])
    assert result.exit_code == 2 and result.output.startswith("Error: --model names the model zero-code recording")
    assert not os.path.exists(tmp_path / "s")
