"""Names and constants of the store format (documented in docs/FORMAT.md).

Only tracekit/store uses these: everything else reads and writes through the store's API.
"""

# 6: format 5 with each index row's chunk files at flat keys, `c.<row>.<col>` (zarr's default
# chunk key encoding with the separator "."), not `c/<row>/<col>`: a folder per row was a third of
# the files and folders a step made (15 of ~42 a rank-step on TorchTitan's 5 kinds), each costing
# the disk as much as a file (formats/v6.py). A version of its own: a format-5 reader lists an
# object store's chunks under `c/` and would call every row missing.
# 5: format 4 with each kind's tensor index as one JSON text (meta.encode_index): zarr's
# consolidation deep-copied a list of entries element by element, so finalize grew with the tensor
# count (formats/v5.py). A version of its own: a format-4 reader would call the text damage.
# 4: format 3 with each index row sealed to its rank, kind and step (summaries.row_identity): the
# content hashes leave those out (equal tensors share one object), so before 4 a step list with two
# steps swapped, or a kind copied from another rank, read as data. A version of its own because a
# reader of format 3 would check the new seal as the old one and call every row damaged: with it,
# such a reader refuses the store in one line instead. 3: format 2 with each row's small tensors
# packed together (store/packs.py). 2: content-addressed objects + per-(rank, kind) index rows of
# hashes. 1: packed arrays.
# What each version reads and writes as is its module of tracekit/store/formats/ (formats.READERS).
FORMAT_VERSION = 6  # what new stores are written as
# Root group attribute under which all tracekit metadata lives; a zarr group without it is foreign.
ROOT_KEY = "tracekit"
RANK_PREFIX = "rank_"
TRACES_GROUP = "traces"  # a rank group's child holding its op traces (store/traces.py)

# Kinds live in their one registry (tracekit/store/kinds.py); re-exported here for old imports.
from tracekit.store.kinds import DEFAULT_KINDS, INITIAL_STEP, KINDS, kind_order  # noqa: F401

# Steps beyond this are damage or a hostile file, not a run (JSON's largest exact integer).
MAX_STEP = 2**53 - 1

# Rows of one packed array are split into chunks of at most this many bytes, so a huge model
# never needs one huge chunk in memory to read a single tensor.
MAX_CHUNK_BYTES = 64 * 1024 * 1024


# Format v2: tensor bytes live once per content at objects/<2 hex>/<30 hex>, shared by all ranks;
# each (rank, kind) group holds the index arrays below, one row per recorded step.
OBJECTS_DIR = "objects"
HASH_ARRAY = "hash"  # uint8 (row, 16 * tensors): each tensor's content hash, in index order
FINITE_ARRAY = "finite"  # uint8 (row, tensors): 1 when every element is finite (no NaN/Inf)
# float64 (row, 7 * tensors + 2): each tensor's min, max, mean, L2 and its NaN, +Inf and -Inf counts,
# then the row's seal (store/summaries.py: SUMMARY_FIELDS, row_width; 6 fields in stores written
# before -Inf was counted); absent in stores written before summaries existed
SUMMARY_ARRAY = "summary"


def object_key(digest: bytes) -> str:
    h = digest.hex()
    return f"{OBJECTS_DIR}/{h[:2]}/{h[2:]}"


def rank_group_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"
