"""_dtypes.py: the element types quantmatmul speaks (8-bit integers, ml_dtypes float8, scale floats) and their properties."""

from __future__ import annotations

import ml_dtypes
import numpy as np

INT8_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))
FLOAT8_TYPES = (
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
)
QUANT_TYPES = INT8_TYPES + FLOAT8_TYPES
SCALE_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def is_float8(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in FLOAT8_TYPES


# Every value of each 8-bit type in float32, indexed by its byte: a lookup converts (exactly) several
# times faster than ml_dtypes' astype.
_TO_FLOAT32 = {t: np.arange(256, dtype=np.uint8).view(t).astype(np.float32) for t in QUANT_TYPES}


def float32_table(dtype) -> np.ndarray:
    """The 256 values of an 8-bit type as float32, indexed by code."""
    return _TO_FLOAT32[np.dtype(dtype)]


def to_float32(q: np.ndarray) -> np.ndarray:
    """An int8, uint8 or float8 array as float32 (exact), by table lookup: in C++ on the thread pool
    from 64 K elements (numpy's fancy indexing is one thread), else in numpy."""
    if q.size >= 1 << 16:
        from . import _core

        flat = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
        return _core.lookup_float32(flat, _TO_FLOAT32[q.dtype]).reshape(q.shape)
    return _TO_FLOAT32[q.dtype][q.view(np.uint8)]


def names(dtypes) -> str:
    """'int8, uint8 or float8_e4m3fn' for error messages."""
    listed = [str(d) for d in dtypes]
    return ", ".join(listed[:-1]) + " or " + listed[-1]


def float8_max(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).max)


def float8_scale_exponent(dtype: np.dtype) -> int:
    """The e such that every finite value of this type (and every difference of two) is an integer times 2^-e."""
    return -int(np.log2(float(ml_dtypes.finfo(dtype).smallest_subnormal)))
