"""A store's bytes by role (tracekit/store/footprint.py), and what its metadata costs per rank and step."""

import json
import os

import numpy as np
import pytest

from tracekit.store import footprint as fpm
from tracekit.store.finalize import finalize_store
from tracekit.store.summaries import N_FIELDS, SEAL_SLOTS
from tracekit.testing import write_store

HASH_BYTES = 16


def _data(ranks, steps):
    """Per step: loss (1 tensor, equal on all ranks), gradients (2), parameters (2, also step 0)."""
    out = {}
    for r in range(ranks):
        out[r] = {0: {"parameters": {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}}}
        for s in range(1, steps + 1):
            w = np.arange(12, dtype=np.float32).reshape(3, 4) * s + r
            out[r][s] = {"loss": {"loss": np.float32(1.0 / s)},
                         "gradients": {"w": w, "b": w[0] - 1},
                         "parameters": {"w": w * 2, "b": w[1]}}
    return out


TENSORS = {"loss": 1, "gradients": 2, "parameters": 2}


def _rows(steps):
    return {"loss": steps, "gradients": steps, "parameters": steps + 1}


def _files(path):
    return {os.path.relpath(os.path.join(d, f), path): os.stat(os.path.join(d, f)).st_size
            for d, _, fs in os.walk(path) for f in fs}


def test_every_file_is_counted_once_under_its_role(tmp_path):
    ranks, steps = 3, 4
    path = write_store(str(tmp_path / "s"), _data(ranks, steps))
    before = fpm.footprint(path)
    assert before.bytes[fpm.DOC_CONSOLIDATED] == 0  # consolidated only at finalization
    finalize_store(path, 0)
    # a temporary a crash left beside an object
    with open(os.path.join(path, "objects", ".tmp-0123456789abcdef-0"), "wb") as f:
        f.write(b"x" * 10)
    fp = fpm.footprint(path)
    files = _files(path)
    assert fp.total == sum(files.values()) and fp.ranks == ranks
    assert fp.bytes[fpm.TEMPORARY] == 10
    objects = [n for k, n in files.items() if k.startswith("objects" + os.sep) and not k.endswith("zarr.json")
               and ".tmp-" not in k]
    assert fp.bytes[fpm.OBJECTS] == sum(objects) and fp.files[fpm.OBJECTS] == len(objects)
    # index rows: exactly the hash, the finite flag and the sealed summary of each tensor per row
    rows = _rows(steps)
    assert fp.bytes["rows/hash"] == ranks * sum(rows[k] * HASH_BYTES * n for k, n in TENSORS.items())
    assert fp.bytes["rows/finite"] == ranks * sum(rows[k] * n for k, n in TENSORS.items())
    assert fp.bytes["rows/summary"] == ranks * sum(rows[k] * 8 * (N_FIELDS * n + SEAL_SLOTS) for k, n in TENSORS.items())
    # the root document splits into the run's metadata and the consolidated copy of every other document
    root = files["zarr.json"]
    assert fp.bytes[fpm.DOC_ROOT] + fp.bytes[fpm.DOC_CONSOLIDATED] == root
    with open(os.path.join(path, "zarr.json")) as f:
        doc = json.load(f)
    assert "consolidated_metadata" in doc and fp.bytes[fpm.DOC_CONSOLIDATED] > 0
    assert fp.bytes[fpm.DOC_ROOT] == len(json.dumps({k: v for k, v in doc.items() if k != "consolidated_metadata"}))
    assert fp.files[fpm.DOC_RANKS] == ranks and fp.files[fpm.DOC_KINDS] == ranks * len(TENSORS)
    assert fp.files[fpm.DOC_ARRAYS] == ranks * len(TENSORS) * 3 + 1  # hash, finite, summary; objects/
    assert fp.bytes[fpm.OTHER] == 0  # the writers' lock group counts as claims
    assert "\n".join(fpm.describe(fp, unique=fp.bytes[fpm.OBJECTS], rows=sum(rows.values())))


def test_a_format_1_store_is_accounted_too(tmp_path):
    path = write_store(str(tmp_path / "s"), _data(2, 2), format_version=1)
    finalize_store(path, 0)
    fp = fpm.footprint(path)
    assert fp.total == sum(_files(path).values()) and fp.bytes[fpm.OBJECTS] == 0
    assert fp.bytes["rows/float32"] > 0 and fp.bytes[fpm.OTHER] == 0


@pytest.mark.parametrize("indent", [None, 2])
def test_the_consolidated_share_of_a_root_document_indented_or_not(indent):
    doc = {"attributes": {"tracekit": {"format_version": 2}}, "zarr_format": 3,
           "consolidated_metadata": {"kind": "inline", "metadata": {"rank_0": {"node_type": "group"}}},
           "node_type": "group"}
    raw = json.dumps(doc, indent=indent).encode()
    rest = json.dumps({k: v for k, v in doc.items() if k != "consolidated_metadata"}, indent=indent).encode()
    assert fpm._consolidated_bytes(raw) == len(raw) - len(rest) > 0
    assert fpm._consolidated_bytes(rest) == 0 and fpm._consolidated_bytes(b"not json") == 0


def test_metadata_grows_per_rank_and_step_only_by_its_index_rows_and_step_numbers(tmp_path):
    """What a recorded step adds to a rank's metadata: its index rows (hash, finite flag and sealed
    summary per tensor) and the step's number in the step lists (each kind's, the rank's completed
    steps, the root's per-rank summary; kinds and rank again in the consolidated copy). A new
    per-step attribute, or a wider index row, fails here: it grows every store with ranks x steps."""
    ranks, short, long = 3, 3, 6
    fps = {}
    for steps in (short, long):
        path = write_store(str(tmp_path / f"s{steps}"), _data(ranks, steps))
        finalize_store(path, 0)
        fps[steps] = fpm.footprint(path)
    added = long - short
    row_bytes = sum(n * (HASH_BYTES + 1 + 8 * N_FIELDS) + 8 * SEAL_SLOTS for n in TENSORS.values())
    index = {r: fps[long].bytes[r] - fps[short].bytes[r] for r in fps[long].bytes if r.startswith("rows/")}
    assert sum(index.values()) == ranks * added * row_bytes
    docs = fps[long].metadata - fps[short].metadata - sum(index.values())
    # steps 4..6 are one digit: ", 4" is 3 bytes in each list that holds the step
    lists = 2 * len(TENSORS) + 3
    assert docs <= ranks * added * lists * 3, (docs, ranks * added * lists * 3)


@pytest.mark.parametrize("path, role", [
    ("objects/ab/0123456789abcdef0123456789abcd", fpm.OBJECTS),
    ("objects/zarr.json", fpm.DOC_ARRAYS),
    ("objects/ab/.tmp-0123456789abcdef-3", fpm.TEMPORARY),
    ("zarr.json.4242.tmp", fpm.TEMPORARY),
    ("rank_2/zarr.json", fpm.DOC_RANKS),
    ("rank_2/zarr.0123abcd.partial", fpm.TEMPORARY),
    ("rank_2/gradients/zarr.json", fpm.DOC_KINDS),
    ("rank_2/gradients/summary/zarr.json", fpm.DOC_ARRAYS),
    ("rank_2/gradients/summary/c/7/0", "rows/summary"),
    ("rank_2/gradients/summary/c.7.0", "rows/summary"),  # format 6's flat keys
    ("rank_2/gradients/float32/c/7/3", "rows/float32"),  # format 1's packed rows
    ("rank_2/traces/ops/zarr.json", fpm.TRACES),
    ("rank_2/traces/ops/step_3/events/c/0", fpm.TRACES),
    (".tracekit_job/zarr.json", fpm.CLAIMS),
    ("notes.txt", fpm.OTHER),
])
def test_role_of_a_file_by_its_place_in_the_layout(path, role):
    assert fpm.role_of(path.split("/")) == role
