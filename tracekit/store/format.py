"""Names and constants of store format v1 (documented in docs/FORMAT.md)."""

FORMAT_VERSION = 1
# Root group attribute under which all tracekit metadata lives; a zarr group without it is foreign.
ROOT_KEY = "tracekit"
RANK_PREFIX = "rank_"

# Kinds in compute order: the diff reports the first divergence in this order within a step.
KINDS = ("outputs", "loss", "local_loss", "gradients", "parameters", "deltas")
DEFAULT_KINDS = ("outputs", "loss", "gradients", "parameters", "deltas")
# Steps beyond this are damage or a hostile file, not a run (JSON's largest exact integer).
MAX_STEP = 2**53 - 1
# parameters hold step 0: the initial parameters, before the first optimizer step.
INITIAL_STEP = 0

# Rows of one packed array are split into chunks of at most this many bytes, so a huge model
# never needs one huge chunk in memory to read a single tensor.
MAX_CHUNK_BYTES = 64 * 1024 * 1024


def rank_group_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"


def kind_order(kind: str) -> int:
    """Position in compute order; kinds added later sort after the known ones."""
    return KINDS.index(kind) if kind in KINDS else len(KINDS)
