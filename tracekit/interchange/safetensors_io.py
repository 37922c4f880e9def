"""safetensors files <-> store entries without torch: the bits travel as they are stored.

safetensors' own numpy API cannot hold bfloat16 or float8, so files are written and read through
its format-level functions (serialize_file, deserialize), under the dtype names torch uses.
"""

from __future__ import annotations

import numpy as np

from tracekit.store.dtypes import storage_dtype
from tracekit.errors import StoreError
from tracekit.output_file import write_output
from tracekit.store import TensorData

# safetensors' dtype codes -> tracekit (torch) dtype names
_FROM_CODE = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool", "C64": "complex64",
}


class UnsupportedDtype(ValueError):
    """A tensor of a dtype a tracekit store cannot hold."""


def write(path: str, entries: list[tuple[str, str, tuple[int, ...], np.ndarray]], metadata: dict[str, str]) -> None:
    """entries: (name, dtype name, shape, data in storage dtype); raises SafetensorError/OSError."""
    from safetensors import TensorSpec, serialize  # TensorSpec: safetensors >= 0.8

    keep = []  # serialize_file reads the memory behind each pointer: keep the arrays alive until it returns
    specs = {}
    for name, dtype, shape, data in entries:
        arr = np.ascontiguousarray(np.asarray(data, dtype=storage_dtype(dtype)))
        if arr.dtype.byteorder == ">":
            arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))  # safetensors is little-endian
        keep.append(arr)
        specs[name] = TensorSpec(dtype=dtype, shape=list(shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    data = serialize(specs, metadata=metadata)
    # Python writes the file (not safetensors' serialize_file): open()'s permissions (0666 less the
    # umask) rather than 0600, and any path the OS takes, non-UTF-8 bytes included; whole or not at
    # all (an earlier export under the same name is kept when this one fails; output_file.py)
    write_output(path, data)


def read(path: str) -> tuple[dict[str, TensorData], dict[str, str]]:
    """(name -> TensorData in the file's order, metadata). StoreError for an unreadable file;
    UnsupportedDtype (naming the tensor) for a dtype a store cannot hold."""
    from safetensors import SafetensorError, deserialize, safe_open

    try:
        with safe_open(path, framework="numpy") as f:  # metadata only: numpy cannot read bfloat16 tensors
            meta = dict(f.metadata() or {})
        with open(path, "rb") as f:
            flat = deserialize(f.read())
    except (SafetensorError, OSError, ValueError) as e:
        raise StoreError(f"{path}: not a readable safetensors file ({e})") from None
    out = {}
    for name, view in flat:
        dtype = _FROM_CODE.get(view["dtype"])
        if dtype is None:
            raise UnsupportedDtype(f"tensor {name!r} has dtype {view['dtype']}, which a tracekit store cannot hold")
        shape = tuple(int(n) for n in view["shape"])
        data = np.frombuffer(view["data"], dtype=storage_dtype(dtype).newbyteorder("<")).astype(storage_dtype(dtype))
        out[name] = TensorData(name, dtype, shape, data.reshape(shape))
    return out, meta
