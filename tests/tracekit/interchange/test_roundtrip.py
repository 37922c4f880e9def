"""safetensors export and dump import: bitwise round trips, the path layout, refused pickles."""

import json
import os
import pickle
import re

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tracekit import open_store
from tracekit.errors import UsageError
from tracekit.interchange import export_file, export_tree, import_dumps, parse_path
from tracekit.interchange.importer import DumpRefused
from tracekit.store.tensors import from_torch
from tracekit.store import RankWriter, create_store

# values that a sloppy conversion loses: NaN payloads, -0.0, infinities, subnormals
_SPECIAL = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-40, 3.14159, -2.5e38, 1.0])


def _tensors(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return {
        "w": torch.randn(4, 3, generator=g),
        "w_bf16": torch.cat([_SPECIAL, torch.randn(8, generator=g)]).to(torch.bfloat16).reshape(2, 8),
        "h": torch.randn(5, generator=g).to(torch.float16),
        "f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "count": torch.arange(3, dtype=torch.int64) + step,
    }


def _make_store(path, ranks=(0, 1), steps=(1, 2)):
    create_store(str(path), {"command": ["test"]})
    for r in ranks:
        w = RankWriter(str(path), r, {"coords": {"rank": r, "world_size": len(ranks), "dp_degree": len(ranks),
                                                 "dp_rank": r, "tp_degree": 1, "tp_rank": 0, "meshes": []},
                                      "run": {"device": "cpu", "mode": "ddp", "world_size": len(ranks)}})
        w.write(0, "parameters", [from_torch(n, t) for n, t in _tensors(r, 0).items()])
        for s in steps:
            w.write(s, "parameters", [from_torch(n, t) for n, t in _tensors(r, s).items()])
            w.write(s, "gradients", [from_torch(n, t) for n, t in _tensors(r, 10 + s).items()])
            w.write(s, "loss", [from_torch("loss", torch.tensor(0.5 + s))])
            w.complete_step(s)
        w.close()
    return open_store(path)


def _assert_same_bits(a, b):
    assert a.ranks == b.ranks
    for r in a.ranks:
        va, vb = a.rank(r), b.rank(r)
        assert va.kinds == vb.kinds and va.completed_steps == vb.completed_steps
        for kind in va.kinds:
            assert va.steps(kind) == vb.steps(kind)
            assert [(t.name, t.dtype, t.shape) for t in va.tensors(kind)] == [(t.name, t.dtype, t.shape) for t in vb.tensors(kind)]
            for step in va.steps(kind):
                for t in va.tensors(kind):
                    x, y = va.read_bits(kind, step, t.name), vb.read_bits(kind, step, t.name)
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), (r, kind, step, t.name)


def test_export_then_import_round_trips_bitwise_bfloat16_included(tmp_path):
    src = _make_store(tmp_path / "src")
    done = export_tree(str(tmp_path / "src"), str(tmp_path / "tree"))
    assert done["files"] == 2 * (3 + 2 + 2)  # per rank: parameters 0-2, gradients 1-2, loss 1-2
    assert os.path.isfile(tmp_path / "tree" / "rank_1" / "step_0" / "parameters.safetensors")
    summary = import_dumps(str(tmp_path / "tree"), str(tmp_path / "back"))
    assert summary["ranks"] == [0, 1] and summary["steps"] == [0, 1, 2]
    back = open_store(tmp_path / "back")
    _assert_same_bits(src, back)
    assert back.rank(1).coords["dp_rank"] == 1 and back.rank(1).attrs["run"]["mode"] == "ddp"
    assert back.meta["launcher"] == "tracekit import"
    bits = back.rank(0).read_bits("parameters", 1, "w_bf16")
    assert bits.dtype == np.uint16 and bits[0] == _tensors(0, 1)["w_bf16"].view(torch.int16).reshape(-1)[0].item() & 0xFFFF


def test_exported_file_holds_tensors_under_their_names_and_says_where_they_come_from(tmp_path):
    _make_store(tmp_path / "src")
    out = tmp_path / "one.safetensors"
    export_file(str(tmp_path / "src"), str(out), step=2, rank=1, kind="gradients")
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert {k: meta[k] for k in ("format", "rank", "step", "kind")} == {"format": "tracekit", "rank": "1", "step": "2", "kind": "gradients"}
    assert json.loads(meta["run"])["mode"] == "ddp"
    expected = _tensors(1, 12)
    assert set(tensors) == set(expected)
    for name, t in expected.items():
        assert tensors[name].dtype == t.dtype
        assert tensors[name].view(torch.uint8).equal(t.view(torch.uint8))  # bitwise, NaNs included


def test_export_errors_are_one_line(tmp_path):
    _make_store(tmp_path / "src")
    with pytest.raises(UsageError, match=r"has ranks \[0, 1\]; pick one with --rank"):
        export_file(str(tmp_path / "src"), str(tmp_path / "x.safetensors"), step=1)
    with pytest.raises(Exception, match="no gradients for step 7"):
        export_file(str(tmp_path / "src"), str(tmp_path / "x.safetensors"), step=7, rank=0, kind="gradients")


def test_torch_save_dumps_import_by_path_layout(tmp_path):
    src = tmp_path / "dumps"
    for r in (0, 1):
        for s in (1, 2):
            os.makedirs(src / f"rank{r}", exist_ok=True)
            state = {"module.0.weight": torch.full((2, 2), float(10 * r + s)), "module.0.bias": torch.zeros(2)}
            torch.save({"model": state, "epoch": 3}, src / f"rank{r}" / f"step{s}_params.pt")
            torch.save(torch.tensor(0.25 * s), src / f"rank{r}" / f"step{s}_loss.pt")
            torch.save({"0.weight": torch.ones(2, 2).to(torch.bfloat16)}, src / f"rank{r}" / f"iter_{s}-grads.pth")
    (src / "index.json").write_text("{}")  # non-tensor files are ignored
    rename = lambda n: n.replace("model.", "").replace("module.", "")  # noqa: E731
    summary = import_dumps(str(src), str(tmp_path / "s"), rename=rename)
    assert summary["kinds"] == ["gradients", "loss", "parameters"]
    assert sorted(summary["skipped"]) == [f"rank{r}/step{s}_params.pt:epoch" for r in (0, 1) for s in (1, 2)]
    view = open_store(tmp_path / "s").rank(1)
    assert view.completed_steps == [1, 2]
    assert np.array_equal(view.read("parameters", 2, "0.weight"), np.full((2, 2), 12.0, dtype=np.float32))
    assert view.read("loss", 2, "loss") == 0.5
    assert view.tensor("gradients", "0.weight").dtype == "bfloat16"


def test_a_pickle_holding_arbitrary_objects_is_refused_and_never_unpickled(tmp_path):
    src = tmp_path / "dumps"
    os.makedirs(src / "rank0")
    ran = tmp_path / "ran"
    torch.save({"w": torch.ones(2), "evil": _Trap(str(ran))}, src / "rank0" / "step1.pt")
    with open(src / "rank0" / "step2.pt", "wb") as f:
        pickle.dump({"evil": _Trap(str(ran))}, f)
    for name in ("step1.pt", "step2.pt"):
        with pytest.raises(DumpRefused, match=r"refused: it holds objects other than tensors.*(GLOBAL io.open|operand)") as err:
            import_dumps(str(src / "rank0" / name), str(tmp_path / "s"))
        assert "\n" not in str(err.value)
    assert not ran.exists()  # _Trap.__reduce__ would have created it on unpickling
    assert not os.path.exists(tmp_path / "s")


class _Trap:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("path, rank, step, kind", [
    ("rank_0/step_1/gradients.safetensors", 0, 1, "gradients"),
    ("step3/rank12/params.pt", 12, 3, "parameters"),
    ("rank0step3.pt", 0, 3, None),
    ("run/rank-2/iter_7_local_loss.pt", 2, 7, "local_loss"),
    ("weights.pt", 0, None, "parameters"),
    ("rank_1/step_4/optimizer_state.safetensors", 1, 4, "optimizer_state"),
])
def test_path_layout(path, rank, step, kind):
    key = parse_path(path)
    assert (key.rank, key.step, key.kind) == (rank, step, kind)


def test_import_input_errors(tmp_path):
    (tmp_path / "a").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "a" / "weights.pt")
    with pytest.raises(UsageError, match="cannot tell its step"):
        import_dumps(str(tmp_path / "a"), str(tmp_path / "s"))
    (tmp_path / "b").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "b" / "step0_grads.pt")
    with pytest.raises(UsageError, match="step 0 holds only the initial parameters"):
        import_dumps(str(tmp_path / "b"), str(tmp_path / "s"))
    summary = import_dumps(str(tmp_path / "b"), str(tmp_path / "s"), step_offset=1)
    assert summary["steps"] == [1]
    (tmp_path / "c").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "c" / "step1.pt")
    torch.save({"v": torch.ones(1)}, tmp_path / "c" / "step2.pt")
    with pytest.raises(UsageError, match=r"step 2 has other tensors than earlier steps \(missing \['w'\], extra \['v'\]\)"):
        import_dumps(str(tmp_path / "c"), str(tmp_path / "t"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "step1.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(Exception, match="not a readable safetensors file"):
        import_dumps(str(tmp_path / "d"), str(tmp_path / "u"))
    (tmp_path / "e").mkdir()
    with pytest.raises(UsageError, match="holds no tensor files"):
        import_dumps(str(tmp_path / "e"), str(tmp_path / "v"))
    with pytest.raises(UsageError, match="no such file or directory"):
        import_dumps(str(tmp_path / "missing"), str(tmp_path / "v"))


def test_export_of_an_unsupported_index_dtype_is_refused():
    from tracekit.errors import StoreError
    from tracekit.store.tensors import to_torch

    with pytest.raises(StoreError, match="dtype 'foo' is not one a tracekit store holds"):
        to_torch(np.zeros(2, np.float32), "foo", (2,))
    assert to_torch(np.arange(2, dtype=np.float32), "float32", (2,)).tolist() == [0.0, 1.0]


def test_export_to_an_unwritable_path_is_a_usage_error(tmp_path):
    _make_store(tmp_path / "src")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UsageError, match=r"a_file/x.safetensors: cannot write it"):
        export_file(str(tmp_path / "src"), str(tmp_path / "a_file" / "x.safetensors"), step=1, rank=0)
    with pytest.raises(UsageError, match=r"a_file/rank_0/step_\d/\w+.safetensors: cannot write it"):
        export_tree(str(tmp_path / "src"), str(tmp_path / "a_file"))
    if os.path.isdir("/proc/self"):  # safetensors' own error (SafetensorError), not an OSError
        with pytest.raises(UsageError, match=r"/proc/x.safetensors: cannot write it"):
            export_file(str(tmp_path / "src"), "/proc/x.safetensors", step=1, rank=0)


@pytest.mark.parametrize("value", ["x", 2.5, True, -1, [2]])
def test_import_refuses_non_integer_world_size_in_file_metadata(tmp_path, value):
    from safetensors.torch import save_file

    from tracekit.errors import StoreError

    (tmp_path / "d").mkdir()
    save_file({"w": torch.ones(2)}, str(tmp_path / "d" / "step_1.safetensors"),
              metadata={"coords": json.dumps({"world_size": value})})
    with pytest.raises(StoreError, match=re.escape(f"step_1.safetensors: metadata coords world_size={value!r} is not a non-negative integer")):
        import_dumps(str(tmp_path / "d"), str(tmp_path / "s"))
    assert not os.path.exists(tmp_path / "s")
