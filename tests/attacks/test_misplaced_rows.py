"""Issue 39, read side: rows read under another rank or step are damage, never divergence.

The content hashes leave rank and step out (equal tensors share one object), so before format 4 a
kind's step list with two steps swapped, or rank 1's kind copied over rank 0's, read as data and
the diff called the difference a divergence (exit 1). Format 4 seals each index row (hashes,
finiteness flags, summaries) to its rank, kind and step; every format refuses a step list out of
order. `verify` names the row and where it was sealed; `diff` exits 2 with one line.
"""

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.cli.main import main
from tracekit.errors import StoreError
from tracekit.store import open_store
from tracekit.testing import write_store

STEPS = 5


def _data():
    """Two DDP-like ranks whose outputs and gradients differ (each rank its own batch)."""
    return {r: {s: {"outputs": {"out": np.linspace(0, 1, 8, dtype=np.float32) * (s + 1) * (r + 2)},
                    "gradients": {"w": np.full(4, s + 10 * r, np.float32)},
                    "loss": {"loss": np.float32(1.0 / (s + 1))}} for s in range(1, STEPS + 1)} for r in range(2)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    return {v: write_store(d / f"ref{v}", _data(), format_version=v) for v in (3, 4)}


def _copy(clean, tmp_path, version=4):
    return shutil.copytree(clean[version], tmp_path / "cand")


def _edit_steps(store, rank, kind, edit):
    doc_path = os.path.join(store, f"rank_{rank}", kind, "zarr.json")
    doc = json.load(open(doc_path))
    doc["attributes"]["steps"] = edit(doc["attributes"]["steps"])
    json.dump(doc, open(doc_path, "w"))


def _swap_steps_3_and_4(store):
    def swap(steps):
        i, j = steps.index(3), steps.index(4)
        steps[i], steps[j] = steps[j], steps[i]
        return steps
    _edit_steps(store, 0, "outputs", swap)


def _copy_rank_1_outputs_over_rank_0(store):
    dst = os.path.join(store, "rank_0", "outputs")
    shutil.rmtree(dst)
    shutil.copytree(os.path.join(store, "rank_1", "outputs"), dst)


def _copy_index_rows_from_next_step(arrays):
    def damage(store):
        for name in arrays:  # row 1 holds step 2, row 2 step 3
            folder = os.path.join(store, "rank_0", "outputs", name, "c")
            shutil.copyfile(os.path.join(folder, "2", "0"), os.path.join(folder, "1", "0"))
    return damage


DAMAGE = {
    "swapped_steps": (_swap_steps_3_and_4, "rank 0 outputs", "out of order"),
    "rank_1_kind_over_rank_0": (_copy_rank_1_outputs_over_rank_0, "rank 0 outputs step 1", "sealed as rank 1 outputs step 1's"),
    "hash_row_from_next_step": (_copy_index_rows_from_next_step(["hash"]), "rank 0 outputs step 2", "does not match its seal"),
    "all_index_rows_from_next_step": (_copy_index_rows_from_next_step(["hash", "finite", "summary"]),
                                      "rank 0 outputs step 2", "sealed as rank 0 outputs step 3's"),
}


def _cli(*args):
    return CliRunner().invoke(main, [os.fspath(a) for a in args])


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_clean_pair_passes_and_the_damaged_one_is_exit_2_not_a_divergence(clean, tmp_path, damage):
    do, where, what = DAMAGE[damage]
    cand = _copy(clean, tmp_path)
    assert _cli("diff", clean[4], cand).exit_code == 0
    do(cand)
    for extra in ([], ["--check-hashes"]):
        result = _cli("diff", *extra, clean[4], cand)
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: damaged store") and where in lines[0], result.output
        assert "FAIL" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_names_the_misplaced_row(clean, tmp_path, damage):
    do, where, what = DAMAGE[damage]
    cand = _copy(clean, tmp_path)
    assert _cli("verify", cand).exit_code == 0
    do(cand)
    result = _cli("verify", cand)
    assert result.exit_code == 2, result.output
    problems = [ln for ln in result.output.splitlines() if ln.startswith("damaged: ")]
    first = next(p for p in problems if p.startswith(f"damaged: {where}:"))
    assert what in first, result.output


def test_format_3_stores_refuse_a_step_list_out_of_order_too(clean, tmp_path):
    cand = _copy(clean, tmp_path, version=3)
    _swap_steps_3_and_4(cand)
    with pytest.raises(StoreError, match="out of order"):
        open_store(cand).rank(0).steps("outputs")
    assert _cli("diff", clean[3], cand).exit_code == 2
    assert _cli("verify", cand).exit_code == 2


def test_a_step_listed_twice_is_out_of_order(clean, tmp_path):
    cand = _copy(clean, tmp_path)
    _edit_steps(cand, 1, "gradients", lambda steps: [1, 2, 2, 4, 5])
    result = _cli("diff", clean[4], cand)
    assert result.exit_code == 2 and "rank 1 gradients" in result.output and "out of order" in result.output


def test_the_writer_never_writes_a_step_list_out_of_order(tmp_path):
    from tracekit.store import RankWriter, TensorData, create_store

    create_store(str(tmp_path / "s"), {})
    w = RankWriter(str(tmp_path / "s"), 0, {"coords": {"rank": 0}})
    t = [TensorData("x", "float32", (2,), np.zeros(2, np.float32))]
    w.write(2, "outputs", t)
    with pytest.raises(StoreError, match="increasing order"):
        w.write(1, "outputs", t)
    with pytest.raises(StoreError, match="increasing order"):
        w.write(2, "outputs", t)
    w.close()
