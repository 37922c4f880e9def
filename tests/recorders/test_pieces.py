"""Taking this rank's pieces of DTensors on the training thread (recorders/materialize.py): the
copies and differences taken on the local pieces equal the DTensor ones, bit for bit."""

import pytest
import torch
import torch.distributed as dist

from tracekit.errors import TracekitError
from tracekit.recorders.materialize import local_cpu, local_piece, minus_piece, snapshot_piece


@pytest.fixture
def mesh(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg"), 1), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_pieces_copies_and_deltas_equal_the_dtensor_ones(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(0)
    w = distribute_tensor(torch.randn(6, 5), mesh, [Shard(0)])
    r = distribute_tensor(torch.randn(4), mesh, [Replicate()])
    local, shard = local_piece(w)
    assert shard.full_shape == (6, 5) and shard.shape == tuple(local.shape) and shard.peers == (0,)
    assert local_piece(w)[1] is shard  # the layout is worked out once per (mesh, placements, shape)
    assert local_piece(r)[1] is None  # replicated: the local tensor is whole

    before_w, before_r = snapshot_piece(w), snapshot_piece(r)
    assert isinstance(before_w, tuple) and before_w[1] == shard and not isinstance(before_r, tuple)
    old_w, old_r = w.detach().clone(), r.detach().clone()
    with torch.no_grad():
        w.mul_(1.5).add_(0.25)  # an update in place after the snapshot
        r.sub_(0.125)
    assert torch.equal(before_w[0], old_w.to_local())  # the snapshot is a copy, not a view
    delta_w, delta_r = minus_piece(w, before_w, "w"), minus_piece(r, before_r, "r")
    assert delta_w[1] == shard and torch.equal(delta_w[0], (w - old_w).to_local())
    assert torch.equal(delta_r, (r - old_r).to_local())
    assert torch.equal(minus_piece(torch.ones(3), torch.zeros(3), "plain"), torch.ones(3))
    out = local_cpu([("w", w), ("d", delta_w), ("r", r)], copy=False)
    assert out["d"][0] is delta_w[0] and out["d"][1] == out["w"][1] == shard  # no copy: the spool is the copy and torch.equal(out["r"], r.to_local())


def test_a_layout_that_changed_within_a_step_is_refused(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    before = snapshot_piece(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    with pytest.raises(TracekitError, match="layout of parameter 'w' changed"):
        minus_piece(distribute_tensor(torch.ones(4, 2), mesh, [Replicate()]), before, "w")
