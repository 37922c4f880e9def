"""Closing a store: the launcher's last word in the root metadata (tracekit/store/finalize.py)."""

import json
import os

import numpy as np

from tracekit import open_store
from tracekit.store.finalize import mark_writers_outlived
from tracekit.testing import write_store


def test_writers_outliving_the_launcher_are_noted_unindented_and_atomically(tmp_path):
    path = write_store(str(tmp_path / "s"), {0: {1: {"loss": {"loss": np.float32(0.5)}}}},
                       meta={"launcher": "tracekit record"})
    with open(os.path.join(path, "zarr.json"), "rb") as f:
        before = json.load(f)
    mark_writers_outlived(path, 3)
    with open(os.path.join(path, "zarr.json"), "rb") as f:
        raw = f.read()
    assert b"\n" not in raw  # as zarr writes the store's other documents (io.compact_metadata)
    after = json.loads(raw)
    noted = after["attributes"]["tracekit"].pop("writers_outlived_launcher")
    assert noted["command_exit_status"] == 3 and after == before  # nothing else changed
    assert open_store(path).job_state == "launcher died"
    assert not [n for n in os.listdir(path) if n.endswith((".tmp", ".partial"))]  # no temporary left
