"""tracekit.open_diff and the ds.tracekit accessor agree with `tracekit diff` and with plain zarr."""

import json
import os

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import tracekit
from tracekit.cli.diff import diff as diff_command
from tracekit.errors import StoreError, TracekitError
from tracekit.store import RankWriter, TensorData, create_store


@pytest.fixture(scope="module")
def diffds(divergence_runs):
    return tracekit.open_diff(*divergence_runs)


@pytest.fixture(scope="module")
def cli_doc(divergence_runs):
    """The CLI's JSON report of the divergence runs at the default tolerances (two tests read it)."""
    return _cli_json(*divergence_runs)


def _cli_json(*args):
    out = CliRunner().invoke(diff_command, [*map(str, args), "--json", "--all-tensors", "-q"])
    assert out.exit_code in (0, 1), out.output
    text = out.output[out.output.index("{"):out.output.rindex("}") + 1]
    return json.loads(text)


def _num(x):
    return float(x) if not isinstance(x, str) else float(x)  # 'inf'/'nan' strings in the JSON


def test_metrics_equal_the_cli_report(cli_doc, diffds):
    doc = cli_doc
    ds = diffds
    assert ds.tracekit.verdict == doc["status"].upper() == "FAIL"
    assert ds.attrs["summary_line"] == doc["summary_line"]
    assert int(ds["compared"].sum()) == len(doc["results"])
    for r in doc["results"]:
        at = ds.sel(rank=r["rank"], step=r["step"], tensor=f"{r['kind']}/{r['tensor']}")
        for m in ("max_abs_err", "max_rel_err", "rel_l2_err", "cosine", "violations", "violation_fraction", "numel"):
            assert float(at[m]) == _num(r[m]), (r["step"], r["rank"], r["tensor"], m)
        if r["worst"] is None:  # decided by equal content hashes: nothing read, no error anywhere
            assert r["max_abs_err"] == 0 and np.isnan(float(at["worst_abs_err"]))
            continue
        assert float(at["worst_abs_err"]) == _num(r["worst"]["abs_err"])
        assert int(at["worst_flat_index"]) == int(np.ravel_multi_index(r["worst"]["index"], r["shape"]))
    # the report's `violations` counts violating comparisons; the Dataset's, violating elements
    # 15 comparisons with violating elements, and 3 more outside the norm rule only (gradients of
    # rank 2 after its parameters took the planted fault)
    assert int(ds.tracekit.failing().sum()) == doc["violations"] == 18
    assert int(ds["violations"].sum()) == sum(r["violations"] for r in doc["results"])


def test_first_divergence_is_the_cli_one_and_the_planted_fault(divergence_runs, cli_doc, diffds):
    fd_cli = cli_doc["first_divergence"]
    fd = diffds.tracekit.first_divergence()
    assert (fd["step"], fd["rank"], fd["kind"], fd["name"]) == (fd_cli["step"], fd_cli["rank"], fd_cli["kind"], fd_cli["tensor"])
    assert list(fd["index"]) == fd_cli["worst"]["index"] == [5, 1]
    assert (fd["step"], fd["rank"], fd["tensor"]) == (3, 2, "gradients/0.weight")
    assert fd["cand"] == pytest.approx(fd["ref"] * 0.5)
    # the same element, found by hand with xarray: argmax of the lazy error array
    err = diffds["abs_err/gradients/0.weight"].sel(step=3, rank=2)
    assert {d: int(i) for d, i in err.argmax(...).items()} == {"gradients/0.weight_dim0": 5, "gradients/0.weight_dim1": 1}
    assert diffds.tracekit.locate("gradients/0.weight", step=3, rank=2)["index"] == (5, 1)
    assert tracekit.open_diff(divergence_runs[0], divergence_runs[0]).tracekit.first_divergence() is None


def test_abs_err_matches_plain_files(divergence_runs, diffds):
    ref, cand = divergence_runs

    def plain(path, rank, kind, name, step):
        """The tensor read by hand, as docs/FORMAT.md says (no tracekit code): its hash from the index
        array (plain zarr), its bytes from its object or, format 3, from its range of a pack."""
        import xxhash

        g = zarr.open_group(os.path.join(path, f"rank_{rank}", kind), mode="r")
        entries = g.attrs["tensors"]
        entries = json.loads(entries) if isinstance(entries, str) else entries  # format 5: one JSON text
        i, e = next((i, e) for i, e in enumerate(entries) if e["name"] == name)
        row = list(g.attrs["steps"]).index(step)
        hashes = lambda r: [bytes(g["hash"][r, 16 * j:16 * (j + 1)]) for j in range(len(entries))]  # noqa: E731
        h, file, base = hashes(row)[i], None, 0
        packs = g.attrs.get("packs")
        if packs:  # members: kept, smaller than `below`, changed since the previous row
            before = hashes(row - 1) if row else [None] * len(entries)
            size = lambda x: int(np.prod(x.get("shard", {}).get("shape", x["shape"]))) * np.dtype(x["dtype"]).itemsize  # noqa: E731
            for sharded in (False, True):
                group, used = [], 0
                members = [j for j, x in enumerate(entries) if x.get("bytes", True) and ("shard" in x) == sharded
                           and size(x) < packs["below"] and hashes(row)[j] != before[j]]
                for j in members + [None]:
                    if j is None or (group and used + size(entries[j]) > packs["max"]):
                        if i in group:
                            key = xxhash.xxh3_128_digest(b"tracekit pack\0" + b"".join(hashes(row)[k] for k in group)).hex()
                            file = os.path.join(path, "objects", key[:2], key[2:])
                            base = sum(size(entries[k]) for k in group[:group.index(i)])
                        group, used = [], 0
                    if j is not None:
                        group.append(j)
                        used += size(entries[j])
        if file is None:
            file = os.path.join(path, "objects", h.hex()[:2], h.hex()[2:])
        count = int(np.prod(e["shape"]))
        return np.fromfile(file, dtype=e["dtype"], count=count, offset=base).reshape(e["shape"])

    for kind, name in (("gradients", "0.weight"), ("outputs", "output"), ("parameters", "2.bias"), ("loss", "loss")):
        var = diffds[f"abs_err/{kind}/{name}"]
        for rank in (0, 2):
            for step in (3, 5):
                want = np.abs(plain(cand, rank, kind, name, step) - plain(ref, rank, kind, name, step))
                np.testing.assert_array_equal(var.sel(rank=rank, step=step).values, want)
    # step 0 exists only for parameters: NaN elsewhere, and not compared
    assert np.isnan(diffds["abs_err/gradients/0.weight"].sel(step=0).values).all()
    assert not diffds["compared"].sel(step=0, tensor="gradients/0.weight").any()


def _bf16(values):
    f = np.asarray(values, np.float32).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


def _tricky_pair(tmp_path):
    """Values on both sides of the tolerance edge, NaN, inf, zeros, bfloat16, float64, int64."""
    rng = np.random.default_rng(3)
    paths = []
    for side in ("ref", "cand"):
        path = str(tmp_path / side)
        create_store(path, {})
        for rank in range(2):
            w = RankWriter(path, rank, {"coords": {"rank": rank, "world_size": 2}})
            for step in (1, 2):
                g = np.random.default_rng(10 * step + rank).standard_normal(200).astype(np.float32)
                g[:5] = [np.nan, np.inf, -np.inf, 0.0, 0.0]
                h = np.random.default_rng(20 * step + rank).standard_normal(64)
                n = np.arange(6, dtype=np.int64)
                if side == "cand":
                    noise = rng.standard_normal(200).astype(np.float32)
                    with np.errstate(invalid="ignore"):  # inf - inf in the planted non-finite slots
                        g = g + (np.abs(g) * 1.3e-6 + 1e-5) * noise * np.float32(1.2)  # around the float32 bound
                    g[:5] = [np.nan, np.inf, np.inf, 0.0, 2e-5]
                    h = h * (1 + 1e-7 * rng.standard_normal(64))
                    n[rank + step] += 1
                w.write(step, "gradients", [
                    TensorData("g", "float32", (10, 20), g.reshape(10, 20)),
                    TensorData("b", "bfloat16", (64,), _bf16(h * (1 + (side == "cand") * 0.01 * rng.standard_normal(64)))),
                    TensorData("h", "float64", (8, 8), h.reshape(8, 8)),
                    TensorData("n", "int64", (2, 3), n.reshape(2, 3)),
                ])
                w.complete_step(step)
            w.close()
        paths.append(path)
    return paths


@pytest.mark.parametrize("options", [{}, {"rtol": 1e-3, "atol": 1e-4}, {"equal_nan": True}])
def test_lazy_violation_masks_count_what_the_diff_counts(tmp_path, options):
    ref, cand = _tricky_pair(tmp_path)
    ds = tracekit.open_diff(ref, cand, **options)
    total = 0
    for key in ds["tensor"].values:
        mask = ds.tracekit.violated(str(key)).compute()
        counted = mask.sum([d for d in mask.dims if d not in ("rank", "step")])
        np.testing.assert_array_equal(counted.values, ds["violations"].sel(tensor=key).values.astype(int), err_msg=str(key))
        total += int(counted.sum())
    assert total == int(ds["violations"].sum()) > 0
    # and the per-element errors peak where the diff says the worst element is, when it is a finite violation
    v = ds.tracekit.values("gradients/h")
    assert float(v["abs_err"].max()) == float(ds["max_abs_err"].sel(tensor="gradients/h").max())


def test_violations_with_other_tolerances_rerun_the_diff(divergence_runs, diffds):
    loose = diffds.tracekit.violations(rtol=1e-2, atol=1e-3)
    doc = _cli_json(*divergence_runs, "--rtol", "1e-2", "--atol", "1e-3")
    assert int((loose > 0).sum()) == doc["violations"]
    assert int(loose.sum()) == sum(r["violations"] for r in doc["results"])
    by_key = {(r["rank"], r["step"], f"{r['kind']}/{r['tensor']}"): r["violations"] for r in doc["results"]}
    for (rank, step, key), n in by_key.items():
        assert int(loose.sel(rank=rank, step=step, tensor=key)) == n
    assert int((diffds.tracekit.violations() > 0).sum()) == 15  # without arguments: this diff's own counts
    worst = diffds.tracekit.worst(3)
    assert worst[0]["violations"] > 0 and {w["rank"] for w in worst} == {2}


def test_missing_steps_need_allow_missing_and_read_as_nan(tmp_path):
    paths = []
    for side, last in (("ref", 3), ("cand", 2)):
        path = str(tmp_path / side)
        create_store(path, {})
        for rank in range(2):
            w = RankWriter(path, rank, {"coords": {"rank": rank}})
            for step in (1, 2, 3):
                w.write(step, "gradients", [TensorData("g", "float32", (3,), np.full(3, step, np.float32))])
                if rank == 0 or step <= last:  # cand rank 1 died after step 2
                    w.complete_step(step)
            w.close()
        paths.append(path)
    with pytest.raises(StoreError, match="differ in structure: cand rank 1 lacks step 3"):
        tracekit.open_diff(*paths)
    ds = tracekit.open_diff(*paths, allow_missing=True)
    assert ds.tracekit.verdict == "PASS"
    assert ds["compared"].sel(tensor="gradients/g").values.tolist() == [[True, True, True], [True, True, False]]
    assert np.isnan(float(ds["max_abs_err"].sel(rank=1, step=3, tensor="gradients/g")))
    assert np.isnan(ds["abs_err/gradients/g"].sel(rank=1, step=3).values).all()
    assert not ds.tracekit.violated("g").sel(rank=1, step=3).any()


def test_accessor_on_foreign_dataset_and_unknown_tensor(diffds):
    import xarray as xr

    with pytest.raises(TracekitError, match="does not come from tracekit.open_diff"):
        xr.Dataset().tracekit.first_divergence()
    with pytest.raises(TracekitError, match="no tensor 'nope'"):
        diffds.tracekit.error("nope")
    with pytest.raises(TracekitError, match="ambiguous"):
        diffds.tracekit.error("0.weight")  # gradients, parameters and deltas all have one


def test_tensor_with_per_rank_shapes_has_metrics_but_no_elementwise_view(tmp_path):
    paths = []
    for side in ("ref", "cand"):
        path = str(tmp_path / side)
        create_store(path, {})
        for rank in range(2):
            w = RankWriter(path, rank, {"coords": {"rank": rank}})
            shard = np.full((rank + 1, 2), 1.0 + (side == "cand") * (rank == 1), np.float32)  # local shards
            w.write(1, "shards", [TensorData("s", "float32", shard.shape, shard)])
            w.complete_step(1)
            w.close()
        paths.append(path)
    ds = tracekit.open_diff(*paths)
    assert ds["violations"].sel(tensor="shards/s").values.tolist() == [[0.0], [4.0]]
    assert "abs_err/shards/s" not in ds
    with pytest.raises(TracekitError, match="different shape on different ranks"):
        ds.tracekit.values("shards/s")


def test_chunk_deleted_under_an_open_diff_is_a_store_error(tmp_path):
    from tracekit.testing import write_store

    data = {0: {s: {"gradients": {"g": np.full(3, s, np.float32)}} for s in (1, 2)}}
    ref, cand = write_store(tmp_path / "ref", data, format_version=1), write_store(tmp_path / "cand", data, format_version=1)
    ds = tracekit.open_diff(ref, cand)
    os.remove(os.path.join(cand, "rank_0", "gradients", "float32", "c", "1", "0"))  # step 2, after the diff
    with pytest.raises(StoreError, match=r"cand: rank 0 gradients step 2: unreadable data \(FileNotFoundError: chunk c/1/0 of float32 is missing\)"):
        ds["abs_err/gradients/g"].sel(step=2).values
    assert ds["abs_err/gradients/g"].sel(step=1).values.tolist() == [[0.0, 0.0, 0.0]]
