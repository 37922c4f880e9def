"""FSDP2 on gloo: zero-code records the whole Llama-like model, named from its root, with selective
activation checkpointing and a chunked loss that applies lm_head itself (the order of module calls
TorchTitan's debug model produces; 2 ranks under torchrun, each tensor assembled from both ranks'
shards), and with full AC and each block compiled in place (naming, not sharding: FSDP2 on a world
of one, started as torchrun starts a worker, without its agent or a second rank to pay for). The
script has no tracekit code."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tracekit import open_store

from tests.recorders import llama_like
from tests.launching import TORCHRUN_TIMEOUT

N = 30  # llama_like.TinyLlama's parameter tensors


# a world of one as torchrun starts a worker (port 0: no peer looks for its store)
ONE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}


@pytest.mark.parametrize("layout, world", [(("--ac", "selective", "--chunked"), 2),
                                           (("--ac", "full", "--compile-blocks"), 1)],
                         ids=["selective_ac_chunked_loss", "full_ac_compiled_blocks"])
def test_fsdp2_records_every_parameter_by_its_full_name(tmp_path, layout, world):
    chunked = "--chunked" in layout
    store = str(tmp_path / "s")
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"] if world > 1 else []
    cmd = [sys.executable, "-m", "tracekit.cli.main", "record", "--strict", "-o", store,
           "--kinds", "outputs,parameters", "--", sys.executable, *launch, llama_like.__file__, *layout, "--steps", "2"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(ONE if world == 1 else {})})
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"{N} of {N} optimizer parameters" in result.stderr.splitlines()[-1]
    s = open_store(store)
    assert s.ranks == list(range(world))
    plain = [name for name, _ in llama_like.build().named_parameters()]
    for r in range(world):
        view = s.rank(r)
        # the parameters were FSDP2's DTensors, on its unnamed 1-D mesh of every rank
        assert view.coords["world_size"] == world and view.coords["meshes"]
        assert all(m["dim_names"] == ["dim0"] and m["shape"] == [world] for m in view.coords["meshes"])
        assert view.coverage.complete and view.coverage.optimizer_params == N
        assert view.coverage.outside_calls == (("lm_head",) if chunked else ())
        assert [t.name for t in view.tensors("parameters")] == plain
        assert list(view.read_kind("outputs", 1)) == ["output"]
    # whole tensors, assembled from the ranks' shards: the root's initial weights, as built
    initial = dict(llama_like.build().named_parameters())
    for name in ("layers.2.attention.wo.weight", "lm_head.weight", "tok_embeddings.weight"):
        assert np.array_equal(s.rank(0).read("parameters", 0, name), initial[name].detach().numpy()), name
    # the root's output: hidden states when the chunked loss applies lm_head, else the logits
    width = llama_like.DIM if chunked else llama_like.VOCAB
    assert s.rank(0).read("outputs", 1, "output").shape == (llama_like.BATCH, llama_like.SEQ, width)
