"""How tensor dtypes are kept on disk.

zarr has no bfloat16 (nor float8), so those are stored losslessly as their raw bits in an unsigned
integer array of the same width, and the logical dtype is recorded in the tensor index. Readers
turn bfloat16 back into float32 for numpy (exact: every bfloat16 value is a float32 value).
"""

from __future__ import annotations

import numpy as np

# logical dtype name -> numpy dtype the bits are stored as
_BIT_STORED = {
    "bfloat16": np.uint16,
    "float8_e4m3fn": np.uint8,
    "float8_e5m2": np.uint8,
}

_NUMPY_NATIVE = {
    "float64", "float32", "float16",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
    "complex64", "complex128",
}


def storage_dtype(logical: str) -> np.dtype:
    """The numpy dtype an array of this logical dtype is written as."""
    try:
        return _STORAGE[logical]  # asked per tensor and more (sizes): looked up, not built each time
    except (KeyError, TypeError):
        pass
    if logical in _BIT_STORED:
        found = np.dtype(_BIT_STORED[logical])
    elif logical in _NUMPY_NATIVE:
        found = np.dtype(logical)
    else:
        raise ValueError(f"unsupported tensor dtype {logical!r}")
    _STORAGE[logical] = found
    return found


_STORAGE: dict[str, np.dtype] = {}


def is_bit_stored(logical: str) -> bool:
    return logical in _BIT_STORED


def to_numpy_values(bits: np.ndarray, logical: str) -> np.ndarray:
    """Stored data -> numpy values (bfloat16 widened to float32 exactly)."""
    if logical == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if logical in _BIT_STORED:
        return _float8_table(logical)[bits]
    return bits


def _float8_table(logical: str) -> np.ndarray:
    """float32 value of each of the 256 bit patterns of a float8 dtype (no torch: the writer
    process never imports it). e5m2 is the top byte of a float16; e4m3fn (bias 7) has no Inf,
    and S.1111.111 is its NaN."""
    table = _FLOAT8_TABLES.get(logical)
    if table is None:
        bits = np.arange(256, dtype=np.uint16)
        if logical == "float8_e5m2":
            table = (bits << 8).view(np.float16).astype(np.float32)
            nan, man_shift = (bits & 0x7F) > 0x7C, 21
        else:
            sign = np.where(bits & 0x80, -1.0, 1.0)
            exp, man = (bits >> 3) & 0xF, (bits & 0x7).astype(np.float64)
            mag = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp.astype(np.float64) - 7))
            table = (sign * mag).astype(np.float32)
            nan, man_shift = (bits & 0x7F) == 0x7F, 20
        # NaNs bit for bit as torch widens them: the sign and mantissa kept, the quiet bit set
        man_bits = (bits & (0x3 if logical == "float8_e5m2" else 0x7)).astype(np.uint32) << man_shift
        nan_bits = ((bits & 0x80).astype(np.uint32) << 24) | np.uint32(0x7FC00000) | man_bits
        table.view(np.uint32)[nan] = nan_bits[nan]
        _FLOAT8_TABLES[logical] = table
    return table


_FLOAT8_TABLES: dict[str, np.ndarray] = {}


# Exponent bits (all ones = Inf/NaN) of the bit-stored floats; float8_e4m3fn has no Inf and its
# NaN is S.1111.111, so the mask there is the whole magnitude.
_NONFINITE_MASK = {"bfloat16": 0x7F80, "float8_e4m3fn": 0x7F, "float8_e5m2": 0x7C}


_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def all_finite(data: np.ndarray, logical: str) -> bool:
    """True exactly when no element is NaN or Inf (data in storage dtype).

    Exact, because readers check a store's finiteness flags against the bytes: a tensor split into
    pieces must give the same answer piece by piece as whole. For native floats a reduction is
    tried first (no temporary): a finite sum of squares (BLAS, float32/float64; ~3x the speed of
    numpy's pairwise sum) or sum proves every element finite; only when it is not (a NaN, an Inf,
    or an overflowing sum of finite values) are the elements looked at."""
    if not data.size:
        return True
    if logical in _NONFINITE_MASK:
        mask = _NONFINITE_MASK[logical]
        return not bool(np.any((data & mask) == mask))
    if data.dtype.kind in "fc":
        with np.errstate(over="ignore", invalid="ignore"):
            if data.dtype in _BLAS_FLOATS:
                flat = data.reshape(-1)
                if np.isfinite(np.dot(flat, flat)):
                    return True
            elif np.isfinite(np.add.reduce(data, axis=None)):
                return True
        return bool(np.isfinite(data).all())
    return True
