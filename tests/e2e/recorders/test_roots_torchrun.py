"""FSDP2 at 2 ranks on gloo: zero-code records the whole Llama-like model, named from its root,
with selective activation checkpointing and a chunked loss that applies lm_head itself (the
order of module calls TorchTitan's debug model produces), and with full AC and each block
compiled in place. The script has no tracekit code."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tracekit import open_store

from tests.recorders import llama_like
from tests.conftest import TORCHRUN_TIMEOUT

N = 30  # llama_like.TinyLlama's parameter tensors


@pytest.mark.parametrize("layout", [("--ac", "selective", "--chunked"), ("--ac", "full", "--compile-blocks")],
                         ids=["selective_ac_chunked_loss", "full_ac_compiled_blocks"])
def test_fsdp2_records_every_parameter_by_its_full_name(tmp_path, layout):
    chunked = "--chunked" in layout
    store = str(tmp_path / "s")
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "--strict", "-o", store, "--kinds", "outputs,parameters",
           "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           llama_like.__file__, *layout, "--steps", "2"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"{N} of {N} optimizer parameters" in result.stderr.splitlines()[-1]
    s = open_store(store)
    plain = [name for name, _ in llama_like.build().named_parameters()]
    for r in (0, 1):
        view = s.rank(r)
        assert view.coverage.complete and view.coverage.optimizer_params == N
        assert view.coverage.outside_calls == (("lm_head",) if chunked else ())
        assert [t.name for t in view.tensors("parameters")] == plain
        assert list(view.read_kind("outputs", 1)) == ["output"]
    # whole tensors, assembled from both ranks' shards: the root's initial weights, as built
    initial = dict(llama_like.build().named_parameters())
    for name in ("layers.2.attention.wo.weight", "lm_head.weight", "tok_embeddings.weight"):
        assert np.array_equal(s.rank(0).read("parameters", 0, name), initial[name].detach().numpy()), name
    # the root's output: hidden states when the chunked loss applies lm_head, else the logits
    width = llama_like.DIM if chunked else llama_like.VOCAB
    assert s.rank(0).read("outputs", 1, "output").shape == (llama_like.BATCH, llama_like.SEQ, width)
