"""What a store format's reader does, whatever the format: the protocol behind store/formats/v*.py.

RankView (store/reader.py) is the logical API: ranks, kinds, steps, tensors, their bytes. How a
format lays those bytes out is answered here, one class per format version, chosen once when a
store opens (formats.reader_for). Like PyTorch DCP's StorageReader behind its LoadPlanner: the
planner (store/planner.py) turns a logical request into ReadItems, the format reader says where
each saved piece's bytes lie and reads them, checked.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class FormatReader(Protocol):
    version: int
    # Tensors are content-addressed objects: each index row holds their hashes and finiteness
    # flags (and summaries, where written), and a tensor is read as one or more hashed pieces.
    hashed: bool
    # Index rows are sealed to their rank, kind and step (summaries.row_identity).
    sealed_rows: bool
    # The kind's tensor index attribute is one JSON text (meta.encode_index), not a list of entries.
    index_text: bool
    # What separates the parts of an index row's chunk key: "/" (`c/<row>/<col>`, a folder per row)
    # or "." (`c.<row>.<col>`, format 6). Readers follow each array's own metadata; writers use this.
    chunk_separator: str

    def check_addresses(self, infos) -> object | None:
        """The first index entry whose address the format does not allow, else None."""

    def storage_array(self, view, kind: str, key: str):
        """The kind's storage array `key` shaped (row, element): what element-range readers use."""

    def check_index_arrays(self, view, kind: str) -> None:
        """StoreError (damage) unless the kind's index (or storage) arrays hold its listed rows."""

    def read_range(self, view, kind: str, step: int, key: str, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of storage array `key` at a step, checked (StoreError: damage)."""

    def whole_piece(self, view, kind: str, step: int, info):
        """An unsharded tensor's saved bytes as one piece (store.planner.Piece), or None where the
        format saves it only inside a storage array row (read through read_range)."""

    def kind_writer(self, group, kind: str, io_root, full, rank: int):
        """The writer of a new kind group of this format (store/writer.py)."""

    def read_span(self, view, kind: str, step: int, info, start: int, stop: int) -> np.ndarray:
        """Flat elements [start, stop) of tensor `info` at a step where the format saves it only as
        a range of a storage row (whole_piece None), checked (StoreError: damage)."""

    def fetch(self, view, kind: str, step: int, item, span: tuple[int, int] | None = None) -> np.ndarray:
        """One ReadItem's bytes, flat in storage dtype (only its flat elements [start, stop) with
        `span`), checked against the index (hash, finiteness): a part only once the whole piece
        was, once per open store."""
