"""The scale fit per shard region (compare/structure.py region_signature): a scale of the rows one
rank owns in FSDP-sharded tensors that the whole tensors' fit cannot see, because a later op undid
it in total (TorchTitan clips the gradients to a norm after rank 1's shard was scaled: rank 1's rows
come out scaled up, rank 0's down, the norm kept, docs/DIFF.md)."""

import dataclasses

import numpy as np

import tracekit
from tracekit.compare.metrics import compare_arrays
from tracekit.compare.report import TensorResult
from tracekit.compare.structure import region_signature, step_signature
from tracekit.store import TensorData
from tracekit.store.shards import Shard
from tracekit.testing import write_store

NAMES = ("w1", "w2", "w3")
SHAPE = (64, 48)
UP, DOWN = 1.0086, 0.9986  # rank 1's rows and rank 0's at e = 1e-2 on TorchTitan


def _grads(step):
    rng = np.random.default_rng(step)
    return {n: rng.standard_normal(SHAPE).astype(np.float32) for n in NAMES}


def _store(path, fault_step=None, noise=0.0):
    """2 ranks, FSDP: each rank writes its half of the rows of every gradient. noise: a relative
    error per element (bfloat16-like, 6e-3 on TorchTitan's logits); fault_step: rank 1's rows
    scaled by UP and rank 0's by DOWN at that step."""
    data = {0: {}, 1: {}}
    half = SHAPE[0] // 2
    for step in (1, 2, 3):
        full = _grads(step)
        for rank in (0, 1):
            rng = np.random.default_rng(1000 * step + 10 * rank + (1 if noise else 0))
            pieces = {}
            for n, g in full.items():
                part = g[rank * half:(rank + 1) * half].copy()
                part = part * (1 + noise * rng.standard_normal(part.shape))
                if step == fault_step:
                    part = part * (UP if rank == 1 else DOWN)
                part = part.astype(np.float32)
                pieces[n] = TensorData(n, "float32", part.shape, part, Shard(SHAPE, (rank * half, 0), part.shape, (0, 1)))
            data[rank][step] = {"gradients": pieces}
    return write_store(path, data)


def test_a_one_rank_shard_scale_undone_in_norm_is_named_by_its_rows(tmp_path):
    ref = _store(tmp_path / "ref")
    clean = _store(tmp_path / "clean", noise=6e-3)
    faulty = _store(tmp_path / "faulty", fault_step=2, noise=6e-3)
    # bfloat16 bounds (--precision bf16): the noise and the fault are inside them
    assert tracekit.diff(ref, clean, precision="bf16").passed
    report = tracekit.diff(ref, faulty, precision="bf16")
    assert report.num_violations == 0 and not report.passed
    sigs = [s for s in report.signatures if s.shard]
    assert [(s.step, s.kind, s.ranks) for s in sigs] == [(2, "gradients", [1])]
    assert abs(sigs[0].factor - UP) < 2e-3 and sigs[0].z > 20
    assert "on rank 1's shard of 3 sharded tensors" in sigs[0].text
    doc = report.to_dict()
    assert doc["structure"]["signatures"][0]["shard"] is True
    # the whole tensors' fit sees nothing: every rank holds the same assembled tensor, the norm kept
    assert not [s for s in report.signatures if not s.shard]


def _results(up, down, noise=6e-3):
    """Synthetic results of one sharded tensor per name, on 2 ranks, with region fit sums."""
    out = []
    rng = np.random.default_rng(5)
    for n in NAMES:
        ref = rng.standard_normal(SHAPE).astype(np.float64)
        cand = ref * (1 + noise * rng.standard_normal(SHAPE))
        cand[:32] *= down
        cand[32:] *= up
        regions = []
        for owner, rows in ((0, slice(0, 32)), (1, slice(32, 64))):
            a, d = ref[rows].ravel(), (cand[rows] - ref[rows]).ravel()
            regions.append((owner, (float(a @ a), float(a @ d), float(d @ d), float(d.sum()), a.size)))
        m = compare_arrays(ref.astype(np.float32), cand.astype(np.float32), rtol=1.6e-2, atol=1e-5)
        m = dataclasses.replace(m, regions=tuple(regions))
        for rank in (0, 1):  # both ranks hold the same assembled tensor
            out.append(TensorResult(2, "gradients", rank, rank, n, "float32", SHAPE, m))
    return out


def test_regions_each_rank_holds_are_counted_once_and_a_uniform_scale_is_left_to_the_whole_fit():
    rs = _results(UP, DOWN)
    sig = region_signature(2, "gradients", rs)
    assert sig is not None and sig.ranks == [1] and sig.shard and abs(sig.factor - UP) < 2e-3
    # counted once: two ranks' copies give the z of one
    assert abs(sig.z - region_signature(2, "gradients", [r for r in rs if r.rank == 0]).z) < 1e-9
    # every owner scaled alike is the whole tensors' scale: step_signature says it, not the regions
    both = _results(1.01, 1.01)
    assert region_signature(2, "gradients", both) is None and step_signature(2, "gradients", both)[0] is not None
    # noise alone: nothing
    assert region_signature(2, "gradients", _results(1.0, 1.0)) is None


def test_under_a_precision_rule_a_region_scale_under_the_unit_roundoff_is_not_named():
    rs = _results(1.002, 0.9995)  # 0.5 u of bfloat16
    assert region_signature(2, "gradients", rs) is not None  # float32: named
    assert region_signature(2, "gradients", rs, floor=2.0 ** -8) is None
