"""What a comparison can be asked for, importable without the engine: the CLI builds --help from it."""

from tracekit.compare.precision import PRECISION_CHOICES
from tracekit.compare.tolerances import DEFAULT_ORACLE_FACTOR

# rank: by rank and step; coords: by mesh coordinates; global: layout-free, full tensors per step
ALIGN_MODES = ("rank", "coords", "global")

__all__ = ["ALIGN_MODES", "DEFAULT_ORACLE_FACTOR", "PRECISION_CHOICES"]
