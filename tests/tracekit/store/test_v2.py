"""Format v2: content-addressed objects, dedup across ranks and steps, hashes checked on read, verify."""

import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit import StoreError, open_store
from tracekit.cli.main import main
from tracekit.store.format import FINITE_ARRAY, HASH_ARRAY
from tracekit.store.verify import verify_store
from tracekit.testing import index_chunk, tensor_bytes, write_store


def _w(step, rank=0, drift=0.0):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    return base * step + drift * rank


def _run(path, ranks=2, steps=3, drift=0.0, version=None, frozen=True):
    data = {}
    for r in range(ranks):
        data[r] = {}
        for s in range(1, steps + 1):
            grads = {"w": _w(s, r, drift), "v": _w(s + 10, r, drift)}
            if frozen:
                grads["frozen"] = np.ones(7, np.float32)  # the same bytes at every step
            data[r][s] = {"gradients": grads, "loss": {"loss": np.float32(1.0 / s)}}
    return write_store(path, data, format_version=version)


def _objects(path):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "objects")) for f in fs if f != "zarr.json")


def _object_bytes(path):
    return sum(os.path.getsize(f) for f in _objects(path))


def _sharing(path, rank, kind, step, name, beyond=None):
    """The tensors of (rank, kind, step) whose bytes lie in the file `name`'s bytes lie in (all
    of its own object, or its pack's members), or only those past byte `beyond` of that file."""
    file = tensor_bytes(path, rank, kind, step, name)[0]
    out = set()
    for t in open_store(path).rank(rank).tensors(kind):
        f, base, n = tensor_bytes(path, rank, kind, step, t.name)
        if f == file and (beyond is None or base + n > beyond):
            out.add(t.name)
    return out


@pytest.mark.parametrize("version", [2, 3])
def test_identical_bytes_are_stored_once_across_ranks_and_steps(tmp_path, version):
    path = _run(str(tmp_path / "s"), ranks=4, steps=3, version=version)
    if version == 2:
        # per step: w, v, loss (equal on all ranks) -> 3 objects; frozen once for all steps
        assert len(_objects(path)) == 3 * 3 + 1
    else:
        # per step: one pack of the gradients w, v (equal on all ranks) and one of the loss; frozen
        # in step 1's pack, then, unchanged, its own object once for the later steps
        assert len(_objects(path)) == 3 * 2 + 1
    assert _object_bytes(path) == 3 * (48 + 48 + 4) + 28 * (1 if version == 2 else 2)
    store = open_store(path)
    for r in range(4):
        np.testing.assert_array_equal(store.rank(r).read("gradients", 2, "w"), _w(2))
        np.testing.assert_array_equal(store.rank(r).read("gradients", 3, "frozen"), np.ones(7, np.float32))


@pytest.mark.parametrize("version", [2, 3])
def test_a_drifted_replica_keeps_its_own_bytes(tmp_path, version):
    path = _run(str(tmp_path / "s"), ranks=2, steps=1, drift=1e-3, frozen=False, version=version)
    store = open_store(path)
    d0, d1 = store.rank(0).digests("gradients", 1), store.rank(1).digests("gradients", 1)
    # w, v per rank (v3: one pack per rank); one loss
    assert d0["w"] != d1["w"] and len(_objects(path)) == (2 + 2 + 1 if version == 2 else 2 + 1)
    assert _object_bytes(path) == 2 * 2 * 48 + 4
    np.testing.assert_array_equal(store.rank(1).read("gradients", 1, "w"), _w(1, 1, 1e-3))
    report = tracekit.diff(path, path, align="rank")
    assert report.passed and report.bytes_compared == 2 * 2 * 4  # against itself: only the scalar losses are read


def _flip_bit(path, rank=1, kind="gradients", step=2, name="w", byte=5):
    """Flip one bit of a tensor's bytes; the tensors it damages."""
    file, base, _ = tensor_bytes(path, rank, kind, step, name)
    with open(file, "r+b") as f:
        f.seek(base + byte)
        b = f.read(1)[0]
        f.seek(base + byte)
        f.write(bytes([b ^ 0x01]))
    return {name}


def _copy_from_other_step(path):
    (src, s0, n), (dst, d0, _) = tensor_bytes(path, 1, "gradients", 1, "w"), tensor_bytes(path, 1, "gradients", 2, "w")
    with open(src, "rb") as f:
        f.seek(s0)
        data = f.read(n)
    with open(dst, "r+b") as g:
        g.seek(d0)
        g.write(data)  # same size, valid bytes of another step: only the hash tells
    return {"w"}


def _swap_index_entries(path):
    """Swap the hash entries of w and v (same size) in rank 1's step-2 index row."""
    chunk = index_chunk(path, 1, "gradients", HASH_ARRAY, 1)
    raw = bytearray(open(chunk, "rb").read())
    raw[0:16], raw[16:32] = raw[16:32], raw[0:16]
    open(chunk, "wb").write(bytes(raw))
    return {"w", "v"}  # in a pack: its name follows from the (swapped) hashes, so it is not found at all


def _remove(path):
    """Remove the file of rank 1's step-2 w: its own object, or its pack with every member."""
    hit = _sharing(path, 1, "gradients", 2, "w")
    os.remove(tensor_bytes(path, 1, "gradients", 2, "w")[0])
    return hit


def _truncate(path):
    file, base, _ = tensor_bytes(path, 1, "gradients", 2, "w")
    hit = _sharing(path, 1, "gradients", 2, "w", beyond=base + 8)  # w and the members after it
    os.truncate(file, base + 8)
    return hit


# Damage to an index row that format 4's row seal finds before any tensor is looked at: it names
# the row (rank, kind, step), not a tensor. Formats 2 and 3 find it tensor by tensor.
ROW_DAMAGE = {"swapped_index_entries"}


def _named(damage: str, hit: set) -> set:
    """What verify names for `damage` done to a store of the current format."""
    if damage in ROW_DAMAGE:  # step 3's packs are found through step 2's row: named there too
        return {"rank 1 gradients step 2", "rank 1 gradients step 3"}
    return {f"rank 1 gradients step 2 tensor {t}" for t in hit}


DAMAGE = {
    "flipped_bit": _flip_bit,
    "copied_from_other_step": _copy_from_other_step,
    "swapped_index_entries": _swap_index_entries,
    "missing_object": _remove,
    "truncated_object": _truncate,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_reported_on_read_never_as_values(tmp_path, damage):
    path = _run(str(tmp_path / "s"), ranks=2, steps=3, drift=1e-3)
    DAMAGE[damage](path)
    named = r"rank 1 gradients step 2: its index row" if damage in ROW_DAMAGE else r"rank 1 gradients step 2 tensor (w|v): "
    with pytest.raises(StoreError, match=r"^damaged store: .*: " + named) as info:
        open_store(path).rank(1).read("gradients", 2, "w")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_diff_of_a_damaged_store_exits_2_naming_the_damage(tmp_path, damage):
    ref = _run(str(tmp_path / "ref"), ranks=2, steps=3)
    cand = _run(str(tmp_path / "cand"), ranks=2, steps=3, drift=1e-3)  # rank 1 differs: its bytes are read
    DAMAGE[damage](cand)
    result = CliRunner().invoke(main, ["diff", ref, cand])
    assert result.exit_code == 2, result.output
    assert "damaged store" in result.output and "rank 1 gradients step 2" + " tensor" * (damage not in ROW_DAMAGE) in result.output
    assert "PASS" not in result.output and "FAIL" not in result.output


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_names_each_problem_on_one_line(tmp_path, damage):
    path = _run(str(tmp_path / "s"), ranks=2, steps=3, drift=1e-3)
    clean = CliRunner().invoke(main, ["verify", path])
    assert clean.exit_code == 0 and clean.output.startswith("verify: OK"), clean.output
    hit = DAMAGE[damage](path)
    result = CliRunner().invoke(main, ["verify", path])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    problems = [line for line in lines if line.startswith("damaged: ")]
    assert {line.split(": ")[1] for line in problems} == _named(damage, hit), lines
    assert len(problems) == len(_named(damage, hit))
    assert lines[-1].startswith(f"verify: {len(problems)} problem")


@pytest.mark.parametrize("version", [2, 3])
def test_verify_reports_a_missing_index_chunk_and_v1_missing_chunks(tmp_path, version):
    path = _run(str(tmp_path / "s"), ranks=1, steps=2, version=version)
    os.remove(index_chunk(path, 0, "loss", HASH_ARRAY, 0))
    result = verify_store(path)
    # format 3: a packed row is found through the previous row's hashes too, so step 2 is reported as well
    assert [(p.rank, p.kind, p.step) for p in result.problems] == [(0, "loss", 1)] + ([(0, "loss", 2)] if version == 3 else [])
    assert all("index" in p.what for p in result.problems)

    v1 = _run(str(tmp_path / "v1"), ranks=1, steps=2, version=1)
    assert verify_store(v1).ok
    os.remove(index_chunk(v1, 0, "gradients", "float32", 1))
    (p,) = verify_store(v1).problems
    assert (p.rank, p.kind, p.step) == (0, "gradients", 2) and "missing" in p.what


def test_identical_stores_diff_by_hash_and_differences_are_read(tmp_path):
    ref = _run(str(tmp_path / "ref"), ranks=2, steps=3)
    same = _run(str(tmp_path / "same"), ranks=2, steps=3)
    report = tracekit.diff(ref, same, exact=True)
    assert report.passed and report.bytes_compared == 2 * 2 * 3 * 4  # only the scalar losses (2 sides, ranks, steps)
    assert report.identical_by_hash == 2 * 3 * 3  # w, v, frozen per rank and step

    cand = _run(str(tmp_path / "cand"), ranks=2, steps=3, drift=1e-3)
    report = tracekit.diff(ref, cand)
    assert not report.passed and {r.rank for r in report.violations} == {1}
    assert report.first_divergence.step == 1 and report.first_divergence.kind == "gradients"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_two_copies_of_a_damaged_store_do_not_pass_check_hashes(tmp_path, damage):
    """`diff --check-hashes lie lie`: every hash agrees, so nothing is compared; the objects behind
    the hashes are still read and checked, and the damage reported."""
    lie = _run(str(tmp_path / "lie"), ranks=2, steps=3, drift=1e-3)
    DAMAGE[damage](lie)
    twin = str(tmp_path / "twin")
    shutil.copytree(lie, twin)
    result = CliRunner().invoke(main, ["diff", lie, twin, "--exact", "--check-hashes"])
    assert result.exit_code == 2, result.output
    assert "damaged store" in result.output and "rank 1 gradients step 2" + " tensor" * (damage not in ROW_DAMAGE) in result.output
    assert "PASS" not in result.output
    with pytest.raises(StoreError, match="damaged store"):
        tracekit.diff(lie, twin, exact=True, trust_index=False)


def test_equal_hashes_are_decided_without_reading_by_default_and_the_report_says_so(tmp_path):
    """The default decides equal hashes from the two indexes (metadata speed): the objects behind
    them are not read, so a flipped bit there goes unseen by the diff (the report counts the
    comparisons decided so) and is found by `verify` and by `diff --check-hashes`."""
    lie = _run(str(tmp_path / "lie"), ranks=2, steps=3, drift=1e-3)
    _flip_bit(lie)
    twin = str(tmp_path / "twin")
    shutil.copytree(lie, twin)
    checked = CliRunner().invoke(main, ["diff", lie, twin, "--exact", "--check-hashes"])
    assert checked.exit_code == 2 and "damaged store" in checked.output
    for flags in ([], ["--trust-index"]):  # the default, and its explicit spelling
        trusted = CliRunner().invoke(main, ["diff", lie, twin, "--exact", *flags])
        assert trusted.exit_code == 0, trusted.output
        assert "decided by hash: 18 (step, rank, kind, tensor) comparisons had equal content hashes" in trusted.output
        assert trusted.output.strip().splitlines()[-1].startswith("PASS comparison ranks=2 steps=3")
    report = tracekit.diff(lie, twin, exact=True)
    assert report.options["trust_index"] and report.identical_by_hash == 2 * 3 * 3
    assert report.bytes_compared == 2 * 2 * 3 * 4  # only the scalar losses were read
    assert not tracekit.diff(lie, twin, exact=True, trust_index=False, kinds=["loss"]).options["trust_index"]
    assert CliRunner().invoke(main, ["verify", twin]).exit_code == 2
    # Different bytes are still read, compared and checked by default.
    cand = _run(str(tmp_path / "cand"), ranks=2, steps=3, drift=2e-3)
    clean = _run(str(tmp_path / "clean"), ranks=2, steps=3, drift=1e-3)
    assert CliRunner().invoke(main, ["diff", clean, cand]).exit_code == 1
    read_damage = CliRunner().invoke(main, ["diff", twin, cand])
    assert read_damage.exit_code == 2 and "damaged store" in read_damage.output


def test_a_damaged_index_of_one_kind_is_reported_once_under_that_kind(tmp_path):
    """A lying tensor index names its own kind, once per rank, and leaves the other kinds checked."""
    import json

    from tracekit.store.meta import edit_index

    path = _run(str(tmp_path / "s"), ranks=2, steps=2)
    meta = os.path.join(path, "rank_0", "gradients", "zarr.json")
    doc = json.load(open(meta))
    edit_index(doc["attributes"], lambda entries: entries[0].update(shape=[2**40], numel=2**40))
    json.dump(doc, open(meta, "w"))
    result = verify_store(path)
    assert [(p.rank, p.kind) for p in result.problems] == [(0, "gradients")]
    assert "malformed tensor index" in result.problems[0].what
    # still checked: rank 0's loss (2 steps x 1) and rank 1's gradients and loss (2 steps x 4)
    assert result.entries == 2 * 1 + 2 * 4
    out = CliRunner().invoke(main, ["verify", path]).output
    assert out.count("malformed tensor index") == 1 and "rank 0 gradients: malformed" in out


def _set_finite_flag(path, rank, kind, row, position, value):
    chunk = index_chunk(path, rank, kind, FINITE_ARRAY, row)
    raw = bytearray(open(chunk, "rb").read())
    raw[position] = value
    open(chunk, "wb").write(bytes(raw))


@pytest.mark.parametrize("value", [0, 1, 3])
def test_a_lying_finite_flag_is_damage(tmp_path, value):
    """The finiteness index decides whether equal hashes may skip a tensor (NaNs must be compared),
    so it is checked against the bytes like the hash: a flag claiming finite over NaNs, finite data
    flagged otherwise, or a flag other than 0/1 is a damaged store, in `diff --check-hashes` and
    verify alike."""
    x = np.array([1.0, np.nan, 3.0], np.float32) if value == 1 else np.arange(3, dtype=np.float32)
    data = {0: {1: {"outputs": {"x": x}}}}
    ref, cand = write_store(tmp_path / "a", data), write_store(tmp_path / "b", data)
    for path in (ref, cand):
        _set_finite_flag(path, 0, "outputs", 0, 0, value)
    with pytest.raises(StoreError, match=r"^damaged store: .*: rank 0 outputs step 1"):
        tracekit.diff(ref, cand, exact=True, trust_index=False)
    (problem,) = verify_store(cand).problems
    assert (problem.rank, problem.kind, problem.step) == (0, "outputs", 1) and "finite" in problem.what


def test_equal_hashes_read_each_distinct_object_once(tmp_path, monkeypatch):
    """Identical stores: hash-equal tensors are not compared; by default their objects are not read
    at all, and with --check-hashes each distinct object of each side is read (hashed) exactly once,
    however many ranks and steps name it."""
    from tracekit.store import objects

    ref = _run(str(tmp_path / "ref"), ranks=4, steps=3)
    same = _run(str(tmp_path / "same"), ranks=4, steps=3)
    scanned = []
    real = objects.scan_object
    monkeypatch.setattr(objects, "scan_object", lambda root, digest, *a, **k: scanned.append((root, digest)) or real(root, digest, *a, **k))
    report = tracekit.diff(ref, same, exact=True, jobs=2)
    assert report.passed and report.identical_by_hash == 4 * 3 * 3 and scanned == []
    report = tracekit.diff(ref, same, exact=True, jobs=2, trust_index=False)
    assert report.passed and report.identical_by_hash == 4 * 3 * 3
    # per store: w and v of each step (equal on all ranks) and frozen: in step 1's pack, then its
    # own object (format 3); scalars are read, not scanned. Each read once.
    assert len(scanned) == 2 * (3 * 2 + 2)


def test_nan_tensors_are_read_even_when_hashes_agree(tmp_path):
    x = np.array([1.0, np.nan, 3.0], np.float32)
    ref = write_store(tmp_path / "a", {0: {1: {"outputs": {"x": x}}}})
    cand = write_store(tmp_path / "b", {0: {1: {"outputs": {"x": x}}}})
    assert not tracekit.diff(ref, cand).passed  # NaN == NaN is a violation unless equal_nan
    assert tracekit.diff(ref, cand, equal_nan=True).passed


@pytest.mark.parametrize("ref_version, cand_version", [(1, 2), (2, 1)])
def test_v1_and_v2_stores_diff_against_each_other(tmp_path, ref_version, cand_version):
    ref = _run(str(tmp_path / "ref"), ranks=2, steps=2, version=ref_version)
    cand = _run(str(tmp_path / "cand"), ranks=2, steps=2, drift=1e-3, version=cand_version)
    assert tracekit.diff(ref, _run(str(tmp_path / "same"), ranks=2, steps=2, version=cand_version), exact=True).passed
    report = tracekit.diff(ref, cand)
    assert {r.rank for r in report.violations} == {1}


def test_open_reads_v2_like_v1(tmp_path):
    pytest.importorskip("dask")
    v1 = tracekit.open(_run(str(tmp_path / "v1"), ranks=2, steps=3, version=1))
    v2 = tracekit.open(_run(str(tmp_path / "v2"), ranks=2, steps=3))
    for kind in ("gradients", "loss"):
        a, b = v1[kind].to_dataset(), v2[kind].to_dataset()
        assert set(a.data_vars) == set(b.data_vars)
        for name in a.data_vars:
            np.testing.assert_array_equal(a[name].values, b[name].values)


@pytest.mark.parametrize("damage", ["flipped_bit", "missing_object"])
def test_open_reads_only_metadata_and_reports_damage_on_compute(tmp_path, damage):
    pytest.importorskip("dask")
    path = _run(str(tmp_path / "s"), ranks=2, steps=3, drift=1e-3)
    DAMAGE[damage](path)
    w = tracekit.open(path)["gradients"]["w"]  # nothing read yet: opening succeeds
    with pytest.raises(StoreError, match=r"^damaged store: .*: rank 1 gradients step 2 tensor w: "):
        w.sel(rank=1, step=2).values
    np.testing.assert_array_equal(w.sel(rank=1, step=1).values, _w(1, 1, 1e-3))  # the rest stays readable


def test_kind_metadata_roundtrips_and_matches_the_schema(tmp_path):
    import json

    import jsonschema

    from tracekit.schemas import load, part
    from tracekit.store.meta import KindMeta, decode_index

    schema, index = part(load("store-metadata"), "kind"), part(load("store-metadata"), "index")
    for version in (1, 2, 3, 5, 6):
        path = _run(str(tmp_path / f"v{version}"), ranks=1, steps=2, version=version)
        attrs = json.load(open(os.path.join(path, "rank_0", "gradients", "zarr.json")))["attributes"]
        jsonschema.validate(attrs, schema)
        text = version >= 5  # format 5 on: the index is one JSON text, its entries those of the formats before
        assert isinstance(attrs["tensors"], str) == text
        jsonschema.validate(decode_index(attrs["tensors"]) if text else attrs["tensors"], index)
        meta = KindMeta.from_attrs(attrs, text)
        assert meta.to_attrs(text) == attrs and meta.steps == [1, 2] and [t.name for t in meta.tensors] == ["w", "v", "frozen"]
        assert (meta.hash is None) == (version == 1)
        assert (meta.packs is not None) == (version >= 3)
    with pytest.raises(TypeError, match="JSON text"):
        KindMeta.from_attrs({**attrs, "tensors": decode_index(attrs["tensors"])}, True)  # a list where text belongs
    with pytest.raises(ValueError):
        KindMeta.from_attrs({**attrs, "tensors": attrs["tensors"][:-1]}, True)  # cut short
    with pytest.raises(ValueError, match="nested too deeply"):
        KindMeta.from_attrs({**attrs, "tensors": "[" * 100_000 + "]" * 100_000}, True)  # hostile
    attrs = json.load(open(os.path.join(tmp_path, "v3", "rank_0", "gradients", "zarr.json")))["attributes"]
    for bad in ({"below": 1}, {"below": -1, "max": 2}, {"below": True, "max": 2}, [1, 2]):
        with pytest.raises(ValueError, match="packs"):
            KindMeta.from_attrs({**attrs, "packs": bad})
    with pytest.raises(ValueError, match="offset/numel"):
        KindMeta.from_attrs({**attrs, "tensors": [{**attrs["tensors"][0], "numel": 5}]})
    with pytest.raises(TypeError):
        KindMeta.from_attrs({**attrs, "steps": "1"})


def test_format_3_still_names_swapped_index_entries_per_tensor(tmp_path):
    """Stores of format 3 (no row seal) keep being checked tensor by tensor."""
    path = _run(str(tmp_path / "s"), ranks=2, steps=3, drift=1e-3, version=3)
    hit = _swap_index_entries(path)
    result = CliRunner().invoke(main, ["verify", path])
    problems = [line for line in result.output.splitlines() if line.startswith("damaged: ")]
    assert result.exit_code == 2 and {line.split(": ")[1] for line in problems} == {
        f"rank 1 gradients step 2 tensor {t}" for t in hit}, result.output
