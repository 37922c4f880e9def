"""Reading a small zarr array whose metadata may lie (a trace's events, a --trace-full tensor):
what it declares is checked against what is stored before anything is allocated, and no chunk
expands beyond its declared size.

zarr would allocate the declared shape first (a shape of 10**12: a MemoryError traceback) and let
the zstd frame's own header size its output (a 61 KB chunk that expands to 2 GB). Here:

- only the codecs tracekit's trace writer uses are accepted: `bytes` (little-endian or a one-byte
  type), optionally followed by `zstd`; a plain numeric dtype; a regular chunk grid;
- every chunk must exist; uncompressed, each is exactly a chunk's bytes; compressed, the array
  declares at most MAX_RATIO times the bytes stored, and each chunk's zstd frame must say, in its
  header, that it holds exactly one chunk's bytes (zarr's writer always puts the size there);
- each chunk is decompressed into a buffer of exactly that size, so the output can never grow
  beyond it, whatever the frame holds.

Anything else is a StoreError of one line, never a traceback.
"""

from __future__ import annotations

import math
import os
import stat
import struct

from typing import TYPE_CHECKING

import numpy as np

from tracekit.errors import StoreError
from tracekit.store.io import open_regular

if TYPE_CHECKING:  # an annotation only: zarr's submodules are imported where they are used
    import zarr

# The most bytes a compressed trace array may declare per byte stored. zstd compresses the trace
# writer's JSON events 5-40x (33x for 200 near-identical events); a run of zeros compresses
# ~30000x, which is what a decompression bomb uses.
MAX_RATIO = 1024
# Chunks one array may have: the trace writer makes one per 16 MiB of events.
MAX_CHUNKS = 1 << 16
_ZSTD_MAGIC = 0xFD2FB528


def read_bounded(arr: zarr.Array, where: str) -> np.ndarray:
    """The whole array, read under the checks above; StoreError naming `where` otherwise."""
    try:
        md = arr.metadata
        shape = tuple(int(d) for d in md.shape)
        chunks = tuple(int(c) for c in md.chunk_grid.chunk_shape)
        dtype = np.dtype(arr.dtype)
        codecs = list(md.codecs)
        encode = md.encode_chunk_key
    except Exception as e:  # a v2 array, another chunk grid, unparsable metadata
        raise StoreError(f"{where}: unreadable array metadata ({e.__class__.__name__})") from None
    compressed = _check_codecs(codecs, dtype, where)
    if dtype.kind not in "biufc" or len(chunks) != len(shape) or any(c < 1 for c in chunks) or any(d < 0 for d in shape):
        raise StoreError(f"{where}: an array of {dtype} shaped {list(shape)} in chunks {list(chunks)} is not a trace array")
    grid = [math.ceil(d / c) for d, c in zip(shape, chunks)]
    n_chunks = math.prod(grid)
    if n_chunks > MAX_CHUNKS:
        raise StoreError(f"{where}: declares {n_chunks} chunks, more than the {MAX_CHUNKS} a trace array may have")
    chunk_bytes = math.prod(chunks) * dtype.itemsize
    store, base = arr.store_path.store, arr.store_path.path
    keys = [f"{base}/{encode(c)}" if base else encode(c) for c in np.ndindex(*grid)]
    sizes = [_size(store, k) for k in keys]
    for k, size in zip(keys, sizes):
        if size is None:
            raise StoreError(f"{where}: its chunk {k[len(base):].lstrip('/')} is missing")
        if not compressed and size != chunk_bytes:
            raise StoreError(f"{where}: chunk {k[len(base):].lstrip('/')} has {size} bytes, a chunk holds {chunk_bytes}")
        if compressed and chunk_bytes > max(size, 64) * MAX_RATIO:
            raise StoreError(f"{where}: declares {chunk_bytes} bytes per chunk, more than its {size} stored bytes "
                             f"can hold (at most {MAX_RATIO}x)")
    out = np.empty(shape, dtype=dtype)
    for coords, k, size in zip(np.ndindex(*grid), keys, sizes):
        raw = _get(store, k, size, where)
        data = _decompress(raw, chunk_bytes, f"{where}: chunk {k[len(base):].lstrip('/')}") if compressed else raw
        block = np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(chunks)
        region = tuple(slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, chunks, shape))
        out[region] = block[tuple(slice(0, s.stop - s.start) for s in region)]
    return out


def _check_codecs(codecs: list, dtype: np.dtype, where: str) -> bool:
    """Whether the chunks are zstd-compressed; StoreError for any codec chain the writer does not make."""
    from zarr.codecs import BytesCodec, ZstdCodec

    names = [type(c).__name__ for c in codecs]
    ok = (len(codecs) in (1, 2) and isinstance(codecs[0], BytesCodec)
          and (len(codecs) == 1 or isinstance(codecs[1], ZstdCodec)))
    endian = getattr(codecs[0], "endian", None) if codecs else None
    if ok and dtype.itemsize > 1 and getattr(endian, "value", endian) not in ("little", None):
        ok = False
    if not ok:
        raise StoreError(f"{where}: codecs {names} are not those of a trace array (bytes, zstd)")
    return len(codecs) == 2


def _local(store, key: str) -> str | None:
    root = getattr(store, "root", None)
    return None if root is None else os.path.join(os.fspath(root), key)


def _size(store, key: str) -> int | None:
    """The chunk's stored size; None when it is missing. A local chunk must be a regular file (a
    FIFO would block the read forever, /dev/zero never end it)."""
    from zarr.core.sync import sync

    path = _local(store, key)
    try:
        if path is not None:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{key}: not a regular file")
            return st.st_size
        return int(sync(store.getsize(key)))
    except (FileNotFoundError, KeyError):
        return None
    except StoreError:
        raise
    except Exception as e:
        raise StoreError(f"{key}: cannot read its size ({e.__class__.__name__})") from None


def _get(store, key: str, size: int, where: str) -> bytes:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    path = _local(store, key)
    try:
        if path is not None:
            fd, _ = open_regular(path)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(size + 1)  # what was measured, no more
        else:
            buf = sync(store.get(key, prototype=default_buffer_prototype()))
            raw = None if buf is None else buf.to_bytes()
    except FileNotFoundError:
        raw = None
    except Exception as e:
        raise StoreError(f"{where}: cannot read chunk {key} ({e.__class__.__name__})") from None
    if raw is None:
        raise StoreError(f"{where}: chunk {key} is missing")
    if len(raw) != size:
        raise StoreError(f"{where}: chunk {key} changed size while read")
    return raw


def frame_content_size(raw: bytes) -> int | None:
    """The decompressed size a zstd frame's header declares; None when it declares none (or the
    bytes are not a zstd frame)."""
    if len(raw) < 6 or struct.unpack_from("<I", raw)[0] != _ZSTD_MAGIC:
        return None
    fhd = raw[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(raw) < pos + width:
        return None
    value = int.from_bytes(raw[pos:pos + width], "little")
    return value + 256 if width == 2 else value


def _decompress(raw: bytes, size: int, where: str) -> bytes:
    from numcodecs import zstd

    declared = frame_content_size(raw)
    if declared is None:
        raise StoreError(f"{where}: not a zstd frame that declares its size (damaged)")
    if declared != size:
        raise StoreError(f"{where}: its zstd frame declares {declared} bytes, a chunk holds {size}")
    dest = bytearray(size)  # the output can never grow beyond it
    try:
        zstd.decompress(raw, dest)
    except Exception as e:
        raise StoreError(f"{where}: does not decompress ({e.__class__.__name__}: {e})") from None
    return bytes(dest)
