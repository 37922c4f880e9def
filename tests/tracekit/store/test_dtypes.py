"""all_finite: exact for every dtype and position, whichever reduction proves finiteness first."""

import numpy as np
import pytest

from tracekit.store.dtypes import all_finite


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 4097, -1])
def test_one_nonfinite_element_anywhere_is_found(dtype, bad, where):
    x = np.random.default_rng(0).standard_normal(10000).astype(dtype)
    assert all_finite(x, np.dtype(dtype).name)
    x[where] = bad
    assert not all_finite(x, np.dtype(dtype).name)
    assert not all_finite(x.reshape(100, 100), np.dtype(dtype).name)  # any shape


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_values_whose_sums_overflow_are_finite(dtype):
    big = np.finfo(dtype).max
    x = np.full(1000, big, dtype=dtype)  # squares and sums overflow; every element finite
    x[::2] = -big
    assert all_finite(x, np.dtype(dtype).name)
    assert all_finite(x[::3], np.dtype(dtype).name)  # not contiguous


def test_bit_stored_floats_by_their_exponent_bits():
    bf16 = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0, 2.0
    assert all_finite(bf16, "bfloat16")
    assert not all_finite(np.append(bf16, np.uint16(0x7FC0)), "bfloat16")  # NaN
    assert not all_finite(np.append(bf16, np.uint16(0xFF80)), "bfloat16")  # -Inf


def test_empty_and_integers_are_finite():
    assert all_finite(np.empty(0, np.float32), "float32")
    assert all_finite(np.arange(10, dtype=np.int64), "int64")
