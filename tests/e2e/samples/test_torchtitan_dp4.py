"""The loss at dp=4, against TorchTitan's logged loss, recorded without --loss-reduction.

docs/TORCHTITAN.md's layout block records FSDP on 4 ranks and HSDP 2 x 2 (both dp 4) with no
loss flag: `--loss-reduction auto` must find TorchTitan's trainer and take the sum of the 4 ranks'
pre-divided shares (a mean would be a quarter of it). The block runs once per test run
(`shared_once`, the name tests/e2e/samples/test_torchtitan_runs.py gives it): this file adds no
launch when both run.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.samples.torchtitan_doc import cli, logged_losses, ran, recorded_losses, run_block

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed (pip install -e '.[dev]' installs it)"),
]

CHOSEN = "global loss = sum over dp ranks (TorchTitan pre-divides by global tokens)"


@pytest.mark.parametrize("store", ["fsdp", "hsdp"], ids=["fsdp4", "hsdp2x2"])
def test_the_loss_at_dp4_is_the_loss_torchtitan_logs_without_a_loss_flag(shared_once, store):
    from tracekit.store.global_loss import dp_group

    folder, results = shared_once("torchtitan-layouts", lambda f: run_block(f, "layouts"))
    record = ran(results, f"tracekit record -o runs/{store} ")
    assert record["rc"] == 0, record["err"][-3000:]
    path = str(folder / "runs" / store)
    shown = json.loads(cli("show", "--json", path))
    assert [dp_group(r["coords"]).size for r in shown["ranks"]] == [4, 4, 4, 4]  # one dp group of 4 ranks
    logged = logged_losses(record["out"] + record["err"])
    recorded = recorded_losses(path)
    assert sorted(logged) == sorted(recorded) == [1, 2, 3]
    for step, value in logged.items():
        assert abs(recorded[step] - value) <= 5.1e-6, (step, recorded[step], value)  # TorchTitan prints 5 decimals
    assert CHOSEN in record["err"].splitlines()[-1], record["err"][-1000:]  # the record line says how
    assert shown["loss_derivation"] == CHOSEN
    text = cli("show", path)
    assert f"  {CHOSEN}" in text
