"""samples/torchtitan without a launch: the generated assets, the runner's flags, the CPU shim's
attention, and docs/TORCHTITAN.md's CUDA and Neuron commands (which CI cannot run) parsed by
TorchTitan 0.3.0's own config parser."""

from __future__ import annotations

import importlib.util
import os
import shlex

import pytest

from tests.files import folder_bytes
from tests.paths import SAMPLES
from tests.samples.torchtitan_doc import block

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                reason="torchtitan is not installed (pip install -e '.[dev]' installs it)")



def _load_runner():
    """samples/torchtitan/train.py under a name no other test uses (it imports assets and cpu_shim)."""
    spec = importlib.util.spec_from_file_location("torchtitan_sample_runner",
                                                  os.path.join(SAMPLES, "torchtitan", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = _load_runner()
assets, cpu_shim = train.assets, train.cpu_shim


def test_assets_are_the_same_bytes_wherever_they_are_generated(tmp_path):
    assets.ensure_assets(str(tmp_path / "a"))
    assets.ensure_assets(str(tmp_path / "b"))
    a, b = folder_bytes(str(tmp_path / "a")), folder_bytes(str(tmp_path / "b"))
    assert a == b and {"tokenizer/tokenizer.json", "c4_tiny/data.json"} <= set(a)
    assert len(a["c4_tiny/data.json"].splitlines()) == 400  # documents, as docs/TORCHTITAN.md says


def test_the_tokenizer_fits_the_debug_model_and_adds_its_bos_and_eos(tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer_dir, _ = assets.ensure_assets(str(tmp_path))
    tokenizer = HuggingFaceTokenizer(tokenizer_path=tokenizer_dir)
    assert tokenizer.get_vocab_size() == 1503 <= 2048  # docs/TORCHTITAN.md's figure; the debug model's vocabulary
    first_doc = assets.documents(assets.words())[0]
    ids = tokenizer.encode(first_doc, add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert len(ids) == len(first_doc.split()) + 2 and 0 not in ids  # every word known: no <unk>


def test_a_complete_asset_folder_is_reused_not_rewritten(tmp_path):
    tokenizer_dir, _ = assets.ensure_assets(str(tmp_path))
    marker = os.path.join(tokenizer_dir, "tokenizer.json")
    os.utime(marker, (1, 1))
    assets.ensure_assets(str(tmp_path))
    assert os.stat(marker).st_mtime == 1


def test_the_runner_points_torchtitan_at_the_assets_and_the_cpu_backend(tmp_path):
    args = train.torchtitan_args(["--assets", str(tmp_path), "--module", "llama3", "--config", "llama3_debugmodel"],
                                 cpu=True)
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--hf-assets-path"] == str(tmp_path / "tokenizer")
    assert flags["--dataloader.dataset-path"] == str(tmp_path / "c4_tiny")
    assert flags["--parallelism.spmd-backend"] == "partial_dtensor"
    assert "--assets" not in args and args[-4:] == ["--module", "llama3", "--config", "llama3_debugmodel"]


def test_the_runner_keeps_what_the_command_names(tmp_path):
    given = ["--assets", str(tmp_path), "--hf-assets-path=/t", "--dataloader.dataset-path", "/d",
             "--parallelism.spmd-backend", "spmd_types"]
    assert train.torchtitan_args(given, cpu=True) == given[2:]
    # with an accelerator, only the assets
    assert "--parallelism.spmd-backend" not in train.torchtitan_args(["--assets", str(tmp_path)], cpu=False)


def test_the_runner_takes_every_planted_fault_and_passes_none_to_torchtitan():
    specs, rest = train.take_flags(["--fault", "nan_grad:0:2", "--module", "llama3", "--fault=ffn_bwd:1:3"], "--fault")
    assert specs == ["nan_grad:0:2", "ffn_bwd:1:3"] and rest == ["--module", "llama3"]
    assert [train.fault.parse(s) for s in specs] == [("nan_grad", 0, 2, None), ("ffn_bwd", 1, 3, None)]
    for bad in ("nan_grad:0", "opt_lr:1:0", "leaky:1:2"):
        with pytest.raises(ValueError, match="expected KIND:RANK:STEP"):
            train.fault.parse(bad)


def test_the_cpu_attention_is_block_causal_attention_over_packed_documents():
    """The shim's SDPA with the BlockMask's own mask_mod equals causal attention run on each packed
    document alone (what TorchTitan's FlexAttention computes)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import and_masks, create_block_mask
    from torchtitan.models.common.attention import (FlexAttention, get_causal_mask_mod,
                                                    get_efficient_causal_mask_mod_for_packed_document)

    from torchtitan.models.common import attention

    flex_forward, compiled = FlexAttention.forward, attention._compiled_create_block_mask
    cpu_shim._flex_attention_to_sdpa_on_cpu()
    try:
        torch.manual_seed(0)
        batch, length, heads, dim = 2, 32, 2, 8
        starts = [[0, 5, 17], [0, 30]]
        positions = torch.zeros(batch, length, dtype=torch.int64)
        for b, doc_starts in enumerate(starts):
            for s, e in zip(doc_starts, doc_starts[1:] + [length]):
                positions[b, s:e] = torch.arange(e - s)
        mask = create_block_mask(and_masks(get_causal_mask_mod(),
                                           get_efficient_causal_mask_mod_for_packed_document(positions)),
                                 batch, None, length, length, device="cpu")
        q, k, v = (torch.randn(batch, length, heads, dim, dtype=torch.float64) for _ in range(3))
        out = FlexAttention.forward(None, q, k, v, attention_masks=mask)
    finally:
        FlexAttention.forward, attention._compiled_create_block_mask = flex_forward, compiled
    for b, doc_starts in enumerate(starts):
        for s, e in zip(doc_starts, doc_starts[1:] + [length]):
            alone = F.scaled_dot_product_attention(*(t[b:b + 1, s:e].transpose(1, 2) for t in (q, k, v)),
                                                   is_causal=True).transpose(1, 2)
            assert torch.allclose(out[b:b + 1, s:e], alone, rtol=1e-12, atol=1e-12), (b, s, e)


def test_the_cpu_block_mask_is_built_without_compiling_and_other_devices_keep_torchtitans():
    """TorchTitan's compiled create_block_mask compiles with inductor in every CPU launch; the shim
    builds CPU masks eagerly (the SDPA path reads only their mask_mod) and leaves others to it."""
    import torch
    import torch._dynamo.utils
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import attention

    compiled, calls = attention._compiled_create_block_mask, []
    attention._compiled_create_block_mask = lambda *a, **k: calls.append(k["device"]) or "compiled"
    try:
        cpu_shim._block_mask_eager_on_cpu()

        def causal(b, h, q, kv):
            return kv <= q

        frames = torch._dynamo.utils.counters["frames"]["ok"]
        mask = attention.create_attention_mask(causal, 2, None, 256, 256, device="cpu", BLOCK_SIZE=128)
        assert torch._dynamo.utils.counters["frames"]["ok"] == frames  # nothing compiled
        assert calls == []
        assert mask.mask_mod is causal
        assert torch.equal(mask.to_dense(), create_block_mask(causal, 2, None, 256, 256, device="cpu").to_dense())
        assert attention.create_attention_mask(causal, 2, None, 256, 256, device="meta") == "compiled"
        assert calls == ["meta"]
    finally:
        attention._compiled_create_block_mask = compiled


def test_a_compile_at_import_compiles_at_its_first_call_with_the_arguments_given():
    """TorchTitan calls torch.compile as its modules are imported (FlexAttention's kernel, the block
    mask); while the runner imports it, torch.compile defers that to the function's first call."""
    import torch

    calls = []

    def real_compile(model=None, **kwargs):
        calls.append((model, kwargs))
        return lambda *a: ("compiled", model(*a))

    def double(x):
        return 2 * x

    compile = cpu_shim._compile_at_first_call(real_compile)
    f = compile(double, backend="eager", dynamic=False)
    assert calls == [] and f.__name__ == "double"  # nothing compiled at the call that compiled before
    assert f(3) == ("compiled", 6) and f(4) == ("compiled", 8)
    assert calls == [(double, {"backend": "eager", "dynamic": False})]  # once, as TorchTitan asked
    module = torch.nn.Identity()
    compile(module, backend="eager")  # a module, or the decorator form: compiled as asked, at once
    compile(backend="eager")
    assert calls[1:] == [(module, {"backend": "eager"}), (None, {"backend": "eager"})]


def test_torchtitan_is_imported_without_its_compiles_and_tensorboard(tmp_path, monkeypatch):
    """A module imported as the runner imports TorchTitan: its torch.compile waits for a call, its
    SummaryWriter imports TensorBoard's when a writer is made, and both are torch's again after."""
    import sys

    import torch

    (tmp_path / "titan_like.py").write_text(
        "import torch\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        "compiled = torch.compile(lambda x: x + 1, backend='eager')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    monkeypatch.delitem(sys.modules, "titan_like", raising=False)
    real_compile = torch.compile
    cpu_shim._import_torchtitan_without_compiling("titan_like")
    import titan_like

    assert torch.compile is real_compile
    assert "torch.utils.tensorboard" not in sys.modules
    assert titan_like.SummaryWriter is cpu_shim._summary_writer
    assert titan_like.compiled(torch.ones(1)).item() == 2.0
    writer = titan_like.SummaryWriter(str(tmp_path / "tb"))
    from torch.utils.tensorboard import SummaryWriter

    assert isinstance(writer, SummaryWriter)
    writer.close()


def test_the_config_parses_the_same_without_help_text_and_help_keeps_it(monkeypatch, tmp_path):
    """tyro reads each config class's source for help text while it parses (most of the parse's
    CPU time); the runner turns that off unless the command asks for --help: the same config."""
    import re

    from torchtitan.config import ConfigManager
    from tyro import _docstrings

    tt = next(line for line in block("setup") if line.startswith("TT="))  # docs/TORCHTITAN.md's sizes
    args = train.torchtitan_args([*shlex.split(tt.split("=", 1)[1])[0].split(), "--assets", str(tmp_path)], cpu=True)

    def parsed() -> str:  # the config, closures' addresses masked
        return re.sub(r" at 0x[0-9a-f]+", "", repr(ConfigManager().parse_args(args)))

    with_help = parsed()
    monkeypatch.setattr(_docstrings, "get_field_docstring", _docstrings.get_field_docstring)  # restored after
    monkeypatch.setattr(_docstrings, "get_callable_description", _docstrings.get_callable_description)
    from torchtitan.config.configs import DebugConfig

    def seed_help():
        return _docstrings.get_field_docstring(DebugConfig, "seed", ())

    assert "seed" in seed_help()  # `--debug.seed`'s help text, from DebugConfig's source
    assert not cpu_shim._help_text_only_for_help([*args, "--help"])
    assert "seed" in seed_help()
    assert cpu_shim._help_text_only_for_help(args)
    assert seed_help() is None
    assert parsed() == with_help and "seq_len=64" in with_help


def test_the_trainers_closing_sleep_is_skipped_and_its_clock_still_runs(monkeypatch):
    """Rank 0's 2 s sleep after the last step (`Trainer.train`, trainer.py's only sleep) returns at
    once under the shim; the step timings' perf_counter is the real one."""
    import inspect
    import time

    from torchtitan import trainer

    source = inspect.getsource(trainer)
    assert source.count("time.sleep(") == 1 and "time.sleep(2)" in inspect.getsource(trainer.Trainer.train)
    monkeypatch.setattr(trainer, "time", trainer.time)  # restored after the test
    cpu_shim._no_closing_sleep()
    assert trainer.time is not time
    start = time.monotonic()
    trainer.time.sleep(2)
    assert time.monotonic() - start < 1.0
    assert trainer.time.perf_counter is time.perf_counter


@pytest.mark.parametrize("name", ["cuda", "neuron"])
def test_the_accelerator_commands_flags_parse_under_torchtitan(name, tmp_path):
    """docs/TORCHTITAN.md's CUDA and Neuron commands, with the setup block's variables, parsed by
    TorchTitan's ConfigManager (the runner's additions included for the runner's command)."""
    from torchtitan.config import ConfigManager

    variables = {}
    for line in block("setup"):
        key, value = line.split("=", 1)
        variables[key] = shlex.split(value)[0]
    records = [line for line in block(name) if line.startswith("tracekit record")]
    assert records
    for line in records:
        for key, value in variables.items():
            line = line.replace(f"${key}", value)
        words = shlex.split(line)
        launched = words[words.index("torchrun"):]
        if "-m" in launched:
            assert launched[launched.index("-m") + 1] == "torchtitan.train"
            args = launched[launched.index("-m") + 2:]
        else:
            assert "samples/torchtitan/train.py" in launched
            args = train.torchtitan_args(launched[launched.index("samples/torchtitan/train.py") + 1:] +
                                         ["--assets", str(tmp_path)], cpu=False)
        config = ConfigManager().parse_args(args)
        assert config.model_spec.flavor == "debugmodel"


def test_the_debug_model_has_the_45_parameter_tensors_the_coverage_tests_expect():
    import torch
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        model = model_registry("debugmodel").model.build()
    names = {name for name, _ in model.named_parameters()}
    assert len(names) == 45
    assert {"tok_embeddings.weight", "norm.weight", "lm_head.weight", "layers.0.attention.wo.weight",
            "layers.5.feed_forward.w2.weight"} <= names


def test_bf16_mixed_precision_is_the_default_and_float32_turns_it_off():
    """What docs/TORCHTITAN.md says of the setup block's flags."""
    from torchtitan.config import ConfigManager

    tt = shlex.split(shlex.split(block("setup")[0].split("=", 1)[1])[0])
    default = ConfigManager().parse_args(tt).training
    assert (default.mixed_precision_param, default.mixed_precision_reduce) == ("bfloat16", "float32")
    off = ConfigManager().parse_args(tt + ["--training.mixed-precision-param", "float32"]).training
    assert off.mixed_precision_param == "float32"


def test_gloo_refuses_premul_sum_and_the_shims_set_timeout_sets_gloos(tmp_path):
    """Two of the shim's reasons, on a one-rank gloo group: PREMUL_SUM is refused (so FSDP2 must
    sum instead), and the supplied set_timeout changes the group's timeout without error."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="PREMUL_SUM"):
            dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4), op=dist._make_nccl_premul_sum(1.0))
        cpu_shim._set_timeout(timedelta(seconds=123))
        assert dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=123)
        dist.barrier()  # the group still works under the new timeout
    finally:
        dist.destroy_process_group()


def test_the_runners_fault_specs_parse_or_name_the_problem():
    # the bench's faults (bench/bench_sensitivity.py --workload titan): the factor only for grad_scale
    parse = train.fault.parse
    assert parse("ffn_act:1:3") == ("ffn_act", 1, 3, None)
    assert parse("ffn_bf16:0:2") == ("ffn_bf16", 0, 2, None)
    assert parse("grad_scale:1:2:1.001") == ("grad_scale", 1, 2, 1.001)
    for bad in ("grad_scale:1:2", "ffn_bf16:1:2:1.5", "grad_scale:1:0:2", "grad_scale:1:2:x", "other:1:2"):
        with pytest.raises(ValueError, match="expected KIND:RANK:STEP"):
            parse(bad)


def test_a_bad_fault_spec_is_one_line_and_exit_2(monkeypatch, capsys):
    """The runner's --fault error, before anything is patched or TorchTitan imported (in-process:
    the runner parses its own flags first, so no launch is needed to see it)."""
    import re

    monkeypatch.setattr("sys.argv", [os.path.join(SAMPLES, "torchtitan", "train.py"), "--fault", "ffn_act:1"])
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, os.environ.get(name, "0"))  # main() sets them; restored after the test
    applied = []
    monkeypatch.setattr(cpu_shim, "apply", lambda: applied.append("apply"))
    with pytest.raises(SystemExit) as exited:
        train.main()
    assert exited.value.code == 2 and applied == []
    captured = capsys.readouterr()
    assert re.fullmatch(r"Error: --fault 'ffn_act:1': .*\n", captured.err) and captured.out == "", captured.err

