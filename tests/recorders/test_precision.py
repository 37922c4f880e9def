"""The precision context a rank records (recorders/precision.py, tracekit/store/precision.py)."""

import pytest
import torch

from tracekit import open_store
from tracekit.errors import StoreError
from tracekit.recorders import Recorder
from tracekit.recorders.precision import compiled_region
from tracekit.store.precision import PrecisionContext


def _run(store, steps=2, autocast=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, store=str(store)) as rec:
        for step in range(1, steps + 1):
            x, y = torch.randn(32, 8), torch.randn(32, 4)
            if autocast:
                with torch.autocast("cpu", dtype=autocast):
                    out = model(x)
            else:
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
            rec.observe(output=out, loss=loss)
            opt.step()
            opt.zero_grad()
    return open_store(store).rank(0)


def test_autocast_seen_during_forward_is_recorded(tmp_path):
    ctx = _run(tmp_path / "s", autocast=torch.bfloat16).precision
    assert ctx.autocast == {"cpu": "bfloat16"}
    assert ctx.device == "cpu" and ctx.matmul_precision == torch.get_float32_matmul_precision()
    assert set(ctx.flags) >= {"cudnn_allow_tf32", "deterministic_algorithms"}
    assert "autocast: cpu bfloat16" in ctx.lines()


def test_a_float32_run_records_autocast_off_not_unknown(tmp_path):
    # run after the autocast test in the same process: the probe starts afresh with each recorder
    _run(tmp_path / "a", autocast=torch.bfloat16)
    ctx = _run(tmp_path / "b").precision
    assert ctx.autocast == {} and ctx.fsdp == {} and ctx.compiled == {}
    assert "autocast: off" in ctx.lines()


def test_a_damaged_context_is_one_store_error(tmp_path):
    rank = _run(tmp_path / "s", steps=1)
    rank.attrs["precision"] = {"autocast": {"cpu": 3}}
    with pytest.raises(StoreError, match="malformed precision context: autocast"):
        rank.precision
    with pytest.raises(StoreError, match="not an object"):
        PrecisionContext.from_attrs([1], "x")


def test_a_context_round_trips_through_its_attrs():
    ctx = PrecisionContext(autocast={"cuda": "bfloat16"}, fsdp={"": {"param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                                     "output_dtype": None}},
                           matmul_precision="high", flags={"cudnn_allow_tf32": True}, compiled={"m": {"backend": "inductor"}},
                           device="cuda", backend="nccl")
    assert PrecisionContext.from_attrs(ctx.to_attrs(), "x") == ctx


def test_compiled_region_names_the_backend_without_compiling():
    assert compiled_region(torch.compile(torch.nn.Linear(2, 2), backend="aot_eager"))["backend"] == "aot_eager"
    assert compiled_region(torch.nn.Linear(2, 2)) is None


def test_the_context_validates_against_the_schema_and_show_prints_it(tmp_path):
    import json

    import jsonschema
    from click.testing import CliRunner

    from tracekit.cli.main import main as cli
    from tracekit.schemas import load, part

    _run(tmp_path / "s", autocast=torch.bfloat16)
    attrs = json.load(open(tmp_path / "s" / "rank_0" / "zarr.json"))["attributes"]
    jsonschema.validate(attrs, part(load("store-metadata"), "rank"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**attrs, "precision": {"flags": {"x": "yes"}}}, part(load("store-metadata"), "rank"))
    out = CliRunner().invoke(cli, ["show", str(tmp_path / "s")])
    assert out.exit_code == 0, out.output
    assert "precision (what the forward" in out.output and "autocast: cpu bfloat16" in out.output
    out = CliRunner().invoke(cli, ["show", "--json", str(tmp_path / "s")])
    assert json.loads(out.output)["ranks"][0]["precision"]["autocast"] == {"cpu": "bfloat16"}
