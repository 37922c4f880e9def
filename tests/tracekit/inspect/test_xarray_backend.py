"""xarray's engine="tracekit": the backend tracekit.open is built on; lazy, region-only reads;
the same values with and without dask; bfloat16 decoded as it opens."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import xarray as xr

import tracekit
from tracekit.inspect.backend import TracekitBackendEntrypoint
from tracekit.inspect.summary import summarize
from tracekit.store import planner
from tracekit.store.spans import TensorSteps
from tracekit.testing import write_store
from tests.paths import REPO

ROOT = REPO


def _data(world=2, steps=3, last=None):
    """w (2, 3) float32, h (4,) bfloat16, n () int64 parameters (step 0 too); loss; g gradients.
    last: {rank: its last step} (a rank that stopped early)."""
    out = {}
    for r in range(world):
        out[r] = {}
        for s in range(0, (last or {}).get(r, steps) + 1):
            out[r][s] = {"parameters": {
                "w": np.arange(6, dtype=np.float32).reshape(2, 3) * (s + 1) + 10 * r,
                "h": torch.tensor([1.0 + r, -2.5, 3.0e38, 0.0078125 * (s + 1)], dtype=torch.bfloat16),
                "n": np.array(100 * r + s, dtype=np.int64)}}
            if s:
                out[r][s]["loss"] = {"loss": np.array(1.0 / s, np.float32)}
                out[r][s]["gradients"] = {"g": np.full((3, 2), s + 0.25 * r, np.float32)}
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("xr")
    out = {v: write_store(base / f"v{v}", _data(), format_version=v) for v in (1, 3)}
    out["holes"] = write_store(base / "holes", _data(last={1: 2}))  # rank 1 stopped after step 2
    return out


def _values(tree) -> dict:
    return {f"{node.path}/{name}": var.values for node in tree.subtree for name, var in node.variables.items()}


@pytest.mark.parametrize("version", [1, 3, "holes"])
def test_engine_tracekit_is_tracekit_open(stores, version):
    path = stores[version]
    assert "tracekit" in xr.backends.list_engines()  # registered through the entry point
    via_engine = xr.open_datatree(path, engine="tracekit")
    via_open = tracekit.open(path)
    assert list(via_engine.children) == list(via_open.children) == ["loss", "gradients", "parameters"]
    a, b = _values(via_engine), _values(via_open)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert via_engine.attrs == via_open.attrs
    grads = xr.open_dataset(path, engine="tracekit", group="gradients")
    xr.testing.assert_identical(grads, via_open["gradients"].to_dataset())
    last = [3, 2] if version == "holes" else [3, 3]
    assert xr.open_dataset(path, engine="tracekit", group="/")["last_step"].values.tolist() == last  # the root
    assert list(xr.open_dataset(path, engine="tracekit", group="parameters", drop_variables=["w"]).data_vars) == ["h", "n"]
    if version == "holes":  # rank 1's step 3 reads NaN, and its integer n widens to float to say so
        assert np.isnan(a["/gradients/g"][1, 2]).all() and a["/parameters/n"].dtype == np.float64
    else:
        assert not np.isnan(a["/gradients/g"]).any() and a["/parameters/n"].dtype == np.int64


def test_guess_can_open_claims_stores_only(stores, tmp_path):
    entry = TracekitBackendEntrypoint()
    assert entry.guess_can_open(stores[1]) and entry.guess_can_open(stores[3])
    xr.Dataset({"x": ("i", [1, 2])}).to_zarr(tmp_path / "plain.zarr", consolidated=False)
    (tmp_path / "file.txt").write_text("x")
    for other in (tmp_path / "plain.zarr", tmp_path / "file.txt", tmp_path / "nope", tmp_path):
        assert not entry.guess_can_open(str(other))


def test_a_selection_reads_only_its_rank_steps_and_region(stores, monkeypatch):
    reads, plans = [], []
    real, real_plan = TensorSteps.read, planner.plan_read

    def spy(self, steps, region=None):
        reads.append((self.info.name, list(steps), region))
        return real(self, steps, region)

    def spy_plan(view, kind, step, name, region=None):
        plans.append((view.rank, step, name, region))
        return real_plan(view, kind, step, name, region)

    monkeypatch.setattr(TensorSteps, "read", spy)
    monkeypatch.setattr(planner, "plan_read", spy_plan)
    tree = tracekit.open(stores["holes"], chunks=None)
    assert reads == [] and plans == []  # opening reads metadata only: no plan is made
    w = tree["parameters"]["w"]
    assert w.isel(rank=1, step=2, w_dim0=1).values.tolist() == [19.0, 22.0, 25.0]  # step 2: row 1 is (3, 4, 5) x 3 + 10
    assert reads == [("w", [2], ((1, 0), (1, 3)))]  # one rank, one step, row 1 of (2, 3)
    assert plans == [(1, 2, "w", ((1, 0), (1, 3)))]  # executed as one read plan of that region
    reads.clear()
    assert float(w.sel(rank=0, step=3, w_dim0=0, w_dim1=2)) == 8.0
    assert reads == [("w", [3], ((0, 2), (1, 1)))]
    reads.clear()
    picked = w.sel(rank=0, step=[1, 3]).isel(w_dim1=[0, 2]).values.tolist()
    assert picked == [[[0, 4], [6, 10]], [[0, 8], [12, 20]]]  # columns 0 and 2: read as the box holding them
    assert reads == [("w", [1, 3], ((0, 0), (2, 3)))]


def test_open_without_dask_equals_open_with_dask(stores, tmp_path):
    """dask made unimportable: tracekit.open still opens, lazily, and every value is the dask path's."""
    out = tmp_path / "nodask.npz"
    code = ("import sys; sys.modules['dask'] = None\n"
            "import numpy as np, tracekit\n"
            f"tree = tracekit.open({stores['holes']!r})\n"
            "g = tree['gradients']['g']\n"
            "assert type(g.variable._data).__name__ != 'Array' and g.chunks is None, type(g.variable._data)\n"
            "vals = {f'{n.path}/{k}': v.values for n in tree.subtree for k, v in n.variables.items()}\n"
            f"np.savez({str(out)!r}, **{{k.replace('/', '|'): v for k, v in vals.items()}})\n"
            "print('dask' in sys.modules and sys.modules['dask'] is not None)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]
    with_dask = tracekit.open(stores["holes"])
    assert with_dask["gradients"]["g"].chunks is not None  # dask-backed where dask is installed
    expected = _values(with_dask)
    got = dict(np.load(out, allow_pickle=True))
    assert sorted(got) == sorted(k.replace("/", "|") for k in expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key.replace("/", "|")], value, err_msg=key)


@pytest.mark.parametrize("version", [1, 3])
def test_bfloat16_opens_as_float32_exactly_as_show_says(stores, version):
    path = stores[version]
    tree = tracekit.open(path, chunks=None)
    h = tree["parameters"]["h"]
    assert h.dtype == np.float32 and h.attrs["recorded_dtype"] == "bfloat16"
    assert h.sel(rank=1, step=3).values.tolist() == [2.0, -2.5, float(torch.tensor(3.0e38, dtype=torch.bfloat16)),
                                                      0.03125]
    # `tracekit show`'s "opens as" is what the tree holds, for every tensor with no missing steps
    opens = {(k["kind"], t["name"]): t["opens_as"] for k in summarize(path)["kinds"] for t in k["tensors"]}
    assert len(opens) == 5 and opens["parameters", "h"] == "float32"
    for (kind, name), dtype in opens.items():
        assert str(tree[kind][name].dtype) == dtype, (kind, name)
