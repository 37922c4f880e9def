"""Summaries always, bytes by choice (format 2, --full): every tensor's summary and hash are in
the store, only the tensors --full names keep their bytes, and the diff compares the others by
summaries and hashes and says so."""

import json
import math
import os
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli.diff import diff as diff_cli
from tracekit.compare import diff
from tracekit.compare.by_summary import compare_summaries
from tracekit.errors import StoreError, UsageError
from tracekit.store import open_store
from tracekit.testing import index_chunk, tensor_bytes
from tracekit.store.format import object_key
from tracekit.store.keep import keeps_bytes, parse_full
from tracekit.store.hashing import identity, tensor_hash
from tracekit.store.summaries import (BLOCK, LEGACY_FIELDS, NEG_INF, SUMMARY_FIELDS, DigestCache, blocks, combine,
                                     digest_and_summary, seal, summarize, unseal)
from tracekit.store.verify import verify_store
from tracekit.testing import write_store
from tests.paths import REPO

SCHEMA = json.loads((Path(REPO) / "schemas" / "diff-report.schema.json").read_text())
f32 = np.float32
FULL = ("parameters:*", "loss:*")  # gradients, deltas and outputs keep summaries and hashes only


def _run(steps=3, ranks=2, grad_fault=None, grad_noise=0.0, grad_nan=None):
    """A tiny run; grad_fault=(step, factor) scales gradient w, grad_noise adds a relative wobble
    to every gradient (within float32 tolerance), grad_nan=step plants a NaN in gradient w."""
    data = {}
    for r in range(ranks):
        data[r] = {0: {"parameters": {"w": np.linspace(-1, 1, 12, dtype=f32).reshape(3, 4)}}}
        for s in range(1, steps + 1):
            g = np.linspace(0.1, 0.3, 12, dtype=f32).reshape(3, 4) * f32(s)
            if grad_noise:
                g = g * (f32(1) + f32(grad_noise) * np.cos(np.arange(12, dtype=f32)).reshape(3, 4))
            if grad_fault and grad_fault[0] == s:
                g = g * f32(grad_fault[1])
            if grad_nan == s:
                g = g.copy()
                g[1, 2] = np.nan
            data[r][s] = {"outputs": {"y": np.full((2, 4), r + s, f32)}, "loss": {"loss": f32(2.0 / s)},
                          "gradients": {"w": g, "b": np.arange(4, dtype=f32) * f32(s)},
                          "parameters": {"w": np.full((3, 4), -0.1 * s, f32)}, "deltas": {"w": np.full((3, 4), -0.1, f32)}}
    return data


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("summaries")
    return {
        "ref": write_store(d / "ref", _run(), full=FULL),
        "same": write_store(d / "same", _run(), full=FULL),
        "noise": write_store(d / "noise", _run(grad_noise=1e-7), full=FULL),
        "fault": write_store(d / "fault", _run(grad_fault=(2, 1.01)), full=FULL),
        "nan": write_store(d / "nan", _run(grad_nan=3), full=FULL),
        "all": write_store(d / "all", _run()),  # every tensor's bytes (no --full)
        "partial": write_store(d / "partial", _run(), full=("gradients:w",)),  # w kept, b not
    }


def test_every_tensor_has_a_summary_and_only_full_tensors_keep_bytes(stores):
    path = stores["ref"]
    store = open_store(path)
    kept_digests, dropped, kept_places = set(), [], []
    for rank in store.ranks:
        view = store.rank(rank)
        data = _run()[rank]
        for kind in view.kinds:
            for step in view.steps(kind):
                sums, digests = view.summaries(kind, step), view.digests(kind, step)
                for t in view.tensors(kind):
                    values = np.asarray(data[step][kind][t.name], dtype=np.float64).reshape(-1)
                    expected = [values.min(), values.max(), values.mean(), np.linalg.norm(values), 0, 0, 0]
                    np.testing.assert_allclose(sums[t.name], expected, rtol=1e-12)
                    assert t.keeps_bytes == (kind in ("parameters", "loss"))
                    (kept_digests.add if t.keeps_bytes else lambda d: dropped.append((kind, t.name, d)))(digests[t.name])
                    if t.keeps_bytes:
                        kept_places.append(tensor_bytes(path, rank, kind, step, t.name))
        assert view.group.attrs["full"] == list(FULL)
    # a kept tensor's bytes are in its object or its pack (format 3)
    assert all(os.path.getsize(f) >= base + n for f, base, n in kept_places)
    objects = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "objects")) for f in fs if f != "zarr.json"]
    assert {f for f, _, _ in kept_places} == set(objects)  # and nothing else is stored
    # so a dropped tensor has no object of its own (nor a place in a pack: the files hold the kept bytes only)
    assert sum(os.path.getsize(f) for f in objects) <= sum(n for _, _, n in kept_places)
    assert sum(d not in kept_digests for _, _, d in dropped) >= 12  # gradients w, b and outputs y at 3 steps, 2 ranks


def test_summary_counts_nan_and_inf_and_skips_them_in_the_statistics():
    s = summarize(np.array([1.0, np.nan, -3.0, np.inf, np.nan, -np.inf, -np.inf], dtype=f32), "float32")
    assert list(s[4:]) == [2, 3, 2]  # NaN, Inf (either sign), -Inf
    assert (s[0], s[1], s[2], s[3]) == (-3.0, 1.0, -1.0, math.sqrt(10.0))
    assert math.isnan(summarize(np.array([np.nan], dtype=f32), "float32")[0])
    # pieces combine to the whole tensor's summary
    x = np.linspace(-2, 5, 10, dtype=np.float64)
    whole = summarize(x, "float64")
    np.testing.assert_allclose(combine([(summarize(x[:3], "float64"), 3), (summarize(x[3:], "float64"), 7)]), whole, rtol=1e-12)
    bits = (np.array([1.5, -2.0], dtype=f32).view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits
    assert list(summarize(bits, "bfloat16")[:2]) == [-2.0, 1.5]


def test_reading_the_bytes_of_a_summaries_only_tensor_is_one_line_naming_it(stores):
    view = open_store(stores["ref"]).rank(0)
    assert view.read("parameters", 2, "w").shape == (3, 4)  # kept
    with pytest.raises(StoreError) as e:
        view.read("gradients", 2, "w")
    assert "gradients step 2 tensor w" in str(e.value) and "not kept" in str(e.value) and "\n" not in str(e.value)
    ds = tracekit.open(stores["ref"])  # opening is lazy: it works, values of kept tensors read
    assert float(ds["loss"]["loss"].sel(rank=0, step=2)) == pytest.approx(1.0)
    with pytest.raises(StoreError, match="not kept"):
        ds["gradients"]["w"].sel(rank=0, step=2).values
    # a kept tensor reads even where a tensor beside it in its row kept no bytes
    part = tracekit.open(stores["partial"])
    np.testing.assert_array_equal(part["gradients"]["w"].sel(rank=1, step=3).values, _run()[1][3]["gradients"]["w"])
    with pytest.raises(StoreError, match="tensor b: its bytes were not kept"):
        part["gradients"]["b"].sel(rank=1, step=3).values


def test_verify_accepts_a_summaries_only_store(stores):
    result = verify_store(stores["ref"])
    assert result.ok, result


def test_two_clean_summaries_only_recordings_pass_and_say_by_summaries(stores):
    r = diff(stores["ref"], stores["noise"])
    assert r.status == "pass", r.summary_line
    assert r.compared_by_summaries > 0
    assert "by_summaries=" in r.summary_line
    from tracekit.compare.render import render

    assert "compared by summaries" in render(r)
    # identical bytes are decided by hash; the scalar loss (always read) keeps its bytes
    same = diff(stores["ref"], stores["same"], details="all")
    assert same.status == "pass"
    by = {(x.kind, x.tensor): x.compared_by for x in same.results}
    assert by[("gradients", "w")] == "hash" and by[("parameters", "w")] == "hash"
    assert by[("loss", "loss")] == "elements"


def test_a_planted_fault_in_a_summaries_only_tensor_fails(stores):
    r = diff(stores["ref"], stores["fault"])
    assert r.status == "fail"
    d = r.first_divergence
    assert (d.step, d.kind, d.tensor, d.compared_by) == (2, "gradients", "w", "summaries")
    assert {(v.step, v.kind, v.tensor) for v in r.violations} == {(2, "gradients", "w")}


def test_a_nan_in_a_summaries_only_tensor_fails(stores):
    r = diff(stores["ref"], stores["nan"])
    assert r.status == "fail"
    assert r.first_divergence.step == 3 and r.first_divergence.metrics.counts.cand_nan == 1


def test_bytes_on_one_side_only_compare_by_summaries(stores):
    ok = diff(stores["all"], stores["noise"])
    assert ok.status == "pass" and ok.compared_by_summaries > 0
    bad = diff(stores["all"], stores["fault"])
    assert bad.status == "fail" and bad.first_divergence.compared_by == "summaries"


def test_json_report_says_how_each_tensor_was_compared(stores):
    res = CliRunner().invoke(diff_cli, [stores["ref"], stores["fault"], "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["stats"]["compared_by_summaries"] > 0
    assert doc["first_divergence"]["compared_by"] == "summaries"
    assert all(r["compared_by"] == "summaries" for r in doc["results"] if r["kind"] == "gradients")
    human = CliRunner().invoke(diff_cli, [stores["ref"], stores["noise"]])
    assert human.exit_code == 0, human.output
    assert "Note: compared by summaries" in human.stdout
    assert human.stdout.strip().splitlines()[-1].startswith("PASS comparison ranks=2 steps=3 by_summaries=")


def test_summary_rule_never_fails_what_elementwise_passes():
    rng = np.random.default_rng(0)
    rtol, atol = 1.3e-6, 1e-5
    for _ in range(200):
        ref = rng.standard_normal(50) * 10 ** rng.uniform(-3, 3)
        err = (atol + rtol * np.abs(ref)) * rng.uniform(-1, 1, 50)  # every element within tolerance
        cand = ref + err
        m = compare_summaries(summarize(ref, "float64"), summarize(cand, "float64"), (50,), rtol, atol)
        assert m.passed, m
    m = compare_summaries(summarize(ref, "float64"), summarize(ref * 1.01, "float64"), (50,), rtol, atol)
    assert not m.passed


def test_full_patterns():
    assert parse_full(["loss:*,parameters:layers.0.*", " *.bias "]) == ("loss:*", "parameters:layers.0.*", "*.bias")
    assert keeps_bytes((), "gradients", "x")
    assert keeps_bytes(("loss:*",), "loss", "loss") and not keeps_bytes(("loss:*",), "gradients", "loss")
    assert keeps_bytes(("*.bias",), "gradients", "l.bias") and not keeps_bytes(("*.bias",), "gradients", "l.weight")
    with pytest.raises(UsageError, match="unknown kind 'gradient'"):
        parse_full(["gradient:*"])
    with pytest.raises(UsageError, match="give a glob"):
        parse_full(["loss:"])


def test_full_travels_through_the_environment():
    from tracekit.launch.config import RecordConfig

    cfg = RecordConfig(store="/tmp/x", full=("loss:*,parameters:*",))
    assert cfg.full == ("loss:*", "parameters:*")
    assert RecordConfig.from_env(cfg.to_env()).full == cfg.full
    assert RecordConfig.from_env({}).full == ()


def test_a_summaries_only_loss_still_shows_its_values_and_fails_when_it_differs(tmp_path):
    ref = write_store(tmp_path / "ref", _run(), full=("parameters:*",))
    data = _run()
    for r in data:
        data[r][2]["loss"]["loss"] = f32(1.0001)  # step 2's loss is 1.0
    cand = write_store(tmp_path / "cand", data, full=("parameters:*",))
    from tracekit.inspect.loss import run_losses

    assert run_losses(cand) == ("loss", {1: 2.0, 2: float(f32(1.0001)), 3: float(f32(2.0 / 3))})
    r = diff(ref, cand)
    assert r.status == "fail" and (r.first_divergence.step, r.first_divergence.kind) == (2, "loss")
    rows = {row.step: row for row in r.loss_table}
    assert (rows[2].ref, rows[2].cand) == (1.0, float(f32(1.0001)))
    assert rows[1].passed and not rows[2].passed


def test_format_1_refuses_full(tmp_path):
    with pytest.raises(StoreError, match="format 1"):
        write_store(tmp_path / "v1", _run(steps=1), full=("loss:*",), format_version=1)


def test_a_damaged_summary_is_a_damaged_store_not_a_verdict(stores, tmp_path):
    import shutil

    cand = tmp_path / "cand"
    shutil.copytree(stores["ref"], cand)
    chunk = Path(index_chunk(cand, 0, "gradients", "summary", 1))
    raw = bytearray(chunk.read_bytes())
    raw[8] ^= 0x01  # one bit of gradient w's max at step 2
    chunk.write_bytes(bytes(raw))
    res = CliRunner().invoke(diff_cli, [stores["ref"], str(cand)])
    assert res.exit_code == 2, res.output
    assert "damaged store" in res.output and "rank 0 gradients step 2" in res.output
    assert not verify_store(str(cand)).ok


def test_a_loss_of_minus_inf_and_one_of_plus_inf_differ_without_their_bytes(tmp_path):
    """The sign of an Inf survives in the summary (neg_inf), so a summaries-only -Inf loss never
    passes against a +Inf one, and the loss table shows both values."""
    def run(value):
        data = _run()
        for r in data:
            data[r][2]["loss"]["loss"] = f32(value)
        return data

    pos = write_store(tmp_path / "pos", run(np.inf), full=("parameters:*",))
    neg = write_store(tmp_path / "neg", run(-np.inf), full=("parameters:*",))
    pos2 = write_store(tmp_path / "pos2", run(np.inf), full=("parameters:*",))
    assert open_store(neg).rank(0).summaries("loss", 2)["loss"][NEG_INF] == 1
    r = diff(pos, neg)
    assert r.status == "fail" and (r.first_divergence.step, r.first_divergence.kind) == (2, "loss")
    rows = {row.step: row for row in r.loss_table}
    assert (rows[2].ref, rows[2].cand) == (math.inf, -math.inf) and not rows[2].passed
    from tracekit.inspect.loss import run_losses

    assert run_losses(neg)[1][2] == -math.inf
    same = diff(pos, pos2)  # equal bytes decide by hash; the summary rule alone passes them too
    assert same.status == "pass"
    s_pos = open_store(pos).rank(0).summaries("loss", 2)["loss"]
    assert compare_summaries(s_pos, s_pos, (), 1e-6, 1e-6).passed
    assert not compare_summaries(s_pos, open_store(neg).rank(0).summaries("loss", 2)["loss"], (), 1e-6, 1e-6).passed


def test_a_summary_row_of_an_older_store_reads_back_with_the_sign_of_its_infs_unknown():
    """Format-2 stores written before neg_inf hold six fields per tensor: they still read, their
    neg_inf is NaN, and the comparison then decides on the other fields alone."""
    whole = np.stack([summarize(np.array([1.0, -np.inf], dtype=f32), "float32"),
                      summarize(np.array([2.0, 3.0], dtype=f32), "float32")])
    legacy = unseal(seal(whole[:, :LEGACY_FIELDS]), LEGACY_FIELDS)
    assert legacy.shape == whole.shape and math.isnan(legacy[0, NEG_INF])
    np.testing.assert_array_equal(legacy[:, :LEGACY_FIELDS], whole[:, :LEGACY_FIELDS])
    assert compare_summaries(legacy[0], whole[0], (2,), 1e-6, 1e-6).passed  # unknown sign: not a violation
    flipped = summarize(np.array([1.0, np.inf], dtype=f32), "float32")
    assert not compare_summaries(whole[0], flipped, (2,), 1e-6, 1e-6).passed  # known signs differ
    assert unseal(seal(whole)) is not None and unseal(seal(whole)[::-1]) is None


def test_summaries_of_float8_need_no_torch_and_match_its_values():
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "from tracekit.store.summaries import summarize\n"
            "from tracekit.store.dtypes import to_numpy_values\n"
            "bits = np.arange(256, dtype=np.uint8)\n"
            "for d in ('float8_e4m3fn', 'float8_e5m2'):\n"
            "    summarize(bits, d)\n"
            "    sys.stdout.write(to_numpy_values(bits, d).view(np.uint32).tobytes().hex() + '\\n')\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    torch = pytest.importorskip("torch")
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for hexed, d in zip(out, ("float8_e4m3fn", "float8_e5m2")):
        expected = bits.view(getattr(torch, d)).float().numpy().view(np.uint32)
        assert hexed == expected.tobytes().hex(), d  # bit for bit, NaN payloads and signs too


# ---- hashing and summarizing in one pass (the writer, and ranks that send no bytes) ----------------

_DIGEST_CASES = [("float32", np.float32), ("float64", np.float64), ("int64", np.int64), ("bfloat16", np.uint16)]


@pytest.mark.parametrize("dtype, sdt", _DIGEST_CASES)
@pytest.mark.parametrize("n", [0, 1, BLOCK - 1, BLOCK, 2 * BLOCK + 5])
def test_one_pass_gives_the_hash_and_the_summary_of_two(dtype, sdt, n):
    rng = np.random.default_rng(n)
    if dtype == "bfloat16":
        data = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        data = (rng.standard_normal(n) * 100).astype(sdt)
    if n > 3 and dtype.startswith("float"):
        data[1], data[n - 2] = np.nan, -np.inf  # in the first and the last block
    ident = identity("w", dtype, (n,))
    digest, summary = digest_and_summary(ident, data, dtype)
    assert digest == tensor_hash("w", dtype, (n,), data)
    assert summary.tobytes() == summarize(data, dtype).tobytes()  # bit for bit, NaN included
    # fed as blocks (a delta computed block by block), the same
    digest2, summary2 = digest_and_summary(ident, iter(list(blocks(data))), dtype)
    assert digest2 == digest and summary2.tobytes() == summary.tobytes()


def test_a_frozen_tensor_is_hashed_first_and_a_change_after_it_is_summarized_again(monkeypatch):
    from tracekit.store import summaries

    one_pass = []  # hash-and-summary passes: none once the hash of a frozen tensor is known
    real = summaries.digest_and_summary
    monkeypatch.setattr(summaries, "digest_and_summary", lambda *a: one_pass.append(1) or real(*a))
    cache = DigestCache()
    ident = identity("w", "float32", (10,))
    data = np.arange(10, dtype=np.float32)
    calls = []

    def parts():
        calls.append(1)
        return blocks(data)

    first = cache.get("w", ident, parts, "float32")
    second = cache.get("w", ident, parts, "float32")  # unchanged: from now on hashed first
    assert len(calls) == 2 and first[0] == second[0]
    third = cache.get("w", ident, parts, "float32")
    assert len(calls) == 3 and third[1].tobytes() == first[1].tobytes()  # one hashing pass, summary reused
    data[3] = 1e6  # changed after being frozen: hashed, then summarized anew (not hashed twice)
    fourth = cache.get("w", ident, parts, "float32")
    assert len(calls) == 5 and len(one_pass) == 2
    assert fourth[0] == tensor_hash("w", "float32", (10,), data)
    assert fourth[1].tobytes() == summarize(data, "float32").tobytes()
    # an array instead of a callable works the same way
    assert cache.get("w", ident, data, "float32")[1].tobytes() == fourth[1].tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("special", [None, "nan", "inf", "-inf", "zeros"])
def test_narrow_floats_widened_in_the_block_buffer_give_the_bits_of_their_float64_values(dtype, special):
    """Narrow floats are widened into the thread's block buffer, whose dot-sized views are made
    once; float64 data is summed in place, sliced as it comes. Both give the same bits for the
    same values, whole blocks and the short last one, NaN, Inf and signed zeros included."""
    from tracekit.store import summaries
    from tracekit.store.dtypes import to_numpy_values

    rng = np.random.default_rng(7)
    values = (rng.standard_normal(3 * BLOCK + 7) * 3).astype(np.float32)
    if special == "zeros":  # signed zeros at the extremes of a block
        values[:] = 0.0
        values[BLOCK + 3] = -0.0
    elif special is not None:
        values[BLOCK + 11] = float(special)  # in a middle block
    if dtype == "bfloat16":
        data = (values.view(np.uint32) >> 16).astype(np.uint16)
    else:
        data = values.astype(dtype)
    narrow = summarize(data, dtype)
    wide = summarize(to_numpy_values(data, dtype).astype(np.float64), "float64")
    assert narrow.tobytes() == wide.tobytes()
    assert narrow[summaries.NAN] == (special == "nan") and narrow[summaries.INF] == (special in ("inf", "-inf"))


@pytest.mark.parametrize("n", [0, 5, 8191, 8192, 3 * 8192 + 5, BLOCK])
def test_the_sum_of_squares_is_the_dots_of_its_parts_added_in_order_with_or_without_vecdot(monkeypatch, n):
    """The batched dots (np.vecdot of a block's rows) give the bits of one np.dot per part, added
    in order: the summaries of stores written before it, and of numpy 1.x (no vecdot), stay the same."""
    from tracekit.store import summaries

    v = np.random.default_rng(n).standard_normal(n) * 5
    expected = 0.25
    for start in range(0, n, summaries._DOT):
        part = v[start : start + summaries._DOT]
        expected += float(np.dot(part, part))
    assert summaries._sum_of_squares(0.25, v) == expected
    monkeypatch.setattr(summaries, "_VECDOT", None)
    assert summaries._sum_of_squares(0.25, v) == expected
