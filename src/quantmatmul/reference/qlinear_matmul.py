"""reference/qlinear_matmul.py: plain numpy oracles of QLinearMatMul written straight from the spec (tests only, never the fast path).

Each oracle takes parameters already shaped to broadcast against the promoted matrices the way
numpy does (a per-row parameter as [..., M, 1], a per-column one as [..., 1, N], a y parameter
against the output) and follows one documented numerics, step by step, with numpy arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def _int_accumulator(a, a_zp, b, b_zp, dtype):
    A = a.astype(dtype) - np.asarray(a_zp).astype(dtype)
    B = b.astype(dtype) - np.asarray(b_zp).astype(dtype)
    if A.ndim == 1 or B.ndim == 1 or A.shape[-1] == 0:
        return np.matmul(A, B)
    # Sum over k in a plain loop so numpy's own int matmul choices cannot matter.
    acc = np.zeros(np.broadcast_shapes(A.shape[:-1] + (1,), B.shape[:-2] + (1, B.shape[-1])), dtype)
    for k in range(A.shape[-1]):
        acc = acc + A[..., :, k : k + 1] * B[..., k : k + 1, :]
    return acc


def onnxruntime(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """ONNX Runtime's MLAS path: int32 wrapping sum, f32 multiplier (a*b)/y, f32 product, clamp, rint, + zp."""
    with np.errstate(over="ignore"):
        acc = _int_accumulator(a, a_zp, b, b_zp, np.int64)
    acc32 = acc.astype(np.uint64).astype(np.uint32).astype(np.int32)  # wrap to int32
    f32 = np.float32
    multiplier = (np.asarray(a_scale).astype(f32) * np.asarray(b_scale).astype(f32)) / np.asarray(y_scale).astype(f32)
    info = np.iinfo(np.asarray(y_zp).dtype)
    zp = np.asarray(y_zp).astype(np.int32)
    v = acc32.astype(f32) * multiplier
    v = np.clip(v, (info.min - zp).astype(f32), (info.max - zp).astype(f32))
    return (np.rint(v).astype(np.int32) + zp).astype(info.dtype)


def onnx_reference(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """onnx.reference's QLinearMatMul: int32 matmul, multiplier in the scales' dtype, float64 product, rint, clip."""
    acc = np.matmul(a.astype(np.int32) - np.asarray(a_zp).astype(np.int32),
                    b.astype(np.int32) - np.asarray(b_zp).astype(np.int32))
    d = acc * (np.asarray(a_scale) * np.asarray(b_scale) / np.asarray(y_scale)).astype(np.float64)
    d = d + np.asarray(y_zp).astype(np.float64)
    info = np.iinfo(np.asarray(y_zp).dtype)
    return np.clip(np.rint(d), info.min, info.max).astype(info.dtype)


def exact(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """The spec's formula in exact rational arithmetic: Python integers and fractions, round half to even."""
    acc = _int_accumulator(a, a_zp, b, b_zp, object)
    a_scale, b_scale, y_scale = (np.asarray(s).astype(np.float64) for s in (a_scale, b_scale, y_scale))
    y_zp = np.asarray(y_zp)
    info = np.iinfo(y_zp.dtype)
    shape = np.broadcast_shapes(np.shape(acc), a_scale.shape, b_scale.shape, y_scale.shape, y_zp.shape)
    acc, a_scale, b_scale, y_scale, zp = (np.broadcast_to(x, shape) for x in (acc, a_scale, b_scale, y_scale, y_zp))
    out = np.empty(shape, info.dtype)
    for idx in np.ndindex(*shape):
        value = Fraction(int(acc[idx])) * Fraction(float(a_scale[idx])) * Fraction(float(b_scale[idx])) / Fraction(float(y_scale[idx]))
        out[idx] = min(max(round(value) + int(zp[idx]), info.min), info.max)
    return out


def _round_f32(v: Fraction) -> float:
    """The float32 nearest to an exact rational (ties to even; overflow to infinity), as a Python float."""
    if v == 0:
        return 0.0
    m = abs(v)
    e = m.numerator.bit_length() - m.denominator.bit_length()  # 2^e <= m < 2^(e+2)
    if m < Fraction(2) ** e:
        e -= 1
    elif m >= Fraction(2) ** (e + 1):
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 23)  # 24 significant bits; subnormals below 2^-126
    r = float(round(m / quantum) * quantum)  # round(): ties to even; exact in float64
    r = float(np.float32(r)) if r <= float(np.finfo(np.float32).max) else float("inf")
    return -r if v < 0 else r


def _fma_f32(x: float, y: float, acc: float) -> float:
    """float32 fma(x, y, acc): the exact x * y + acc rounded once (NaN and infinities as IEEE 754)."""
    if all(np.isfinite(t) for t in (x, y, acc)):
        return _round_f32(Fraction(x) * Fraction(y) + Fraction(acc))
    return float(np.float32(x * y + acc))  # no rounding question once an infinity or a NaN is involved


def pair_exact(x) -> np.ndarray:
    """Whether float32 values may enter a bfloat16 pair table (docs/quantization.md): +-0, or
    2^-48 <= |x| < 2^48 with the low 16 bits of the float32 zero (exact in bfloat16)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    exponent = magnitude >> np.uint32(23)
    in_range = (magnitude == 0) | ((exponent >= 127 - 48) & (exponent < 127 + 48))
    return ((bits & np.uint32(0xFFFF)) == 0) & in_range


def float8_sum(row, col, pair_order=None) -> float:
    """sum_k row[k] * col[k] in float32 from +0, exact products, each sum rounded (_fma_f32): in
    order of k (pair_order None), or by pairs of k (2j, 2j + 1) with the odd one first
    ("odd first", vdpbf16ps) or the even one first ("even first"), or by chunks of 32 k from k = 0
    ("tiles of 32 k", tdpbf16ps): per chunk, the even-k products summed from +0 in order, the
    odd-k ones likewise, and their sum added to the total."""
    K = len(row)
    if pair_order == "tiles of 32 k":
        acc = 0.0
        for k0 in range(0, K, 32):
            even = odd = 0.0
            for k in range(k0, min(k0 + 32, K)):
                if k % 2:
                    odd = _fma_f32(float(row[k]), float(col[k]), odd)
                else:
                    even = _fma_f32(float(row[k]), float(col[k]), even)
            acc = _fma_f32(1.0, _fma_f32(1.0, even, odd), acc)
        return acc
    if pair_order is None:
        order = range(K)
    elif pair_order in ("odd first", "even first"):
        first = 1 if pair_order == "odd first" else 0
        order = [k for j in range(0, K, 2) for k in (j + first, j + 1 - first) if k < K]
    else:
        raise ValueError(f"unknown pair order {pair_order!r}")
    acc = 0.0
    for k in order:
        acc = _fma_f32(float(row[k]), float(col[k]), acc)
    return acc


def float8_path(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, float8_max=None, pair_order=None):
    """The float path (docs/quantization.md): c = q - zp in float32 for each operand, d = sum_k fma in
    order of k from +0, x = d * (a_scale * b_scale), x / y_scale (+ zp), convert. Scalar and exact:
    for small shapes. a_scale broadcasts as rows (a scalar or (M, 1)), b_scale as columns.
    pair_order: the order of the float8 entry's pair table (``_core.float8_pair_order()``), which
    the driver runs instead when every c is pair_exact and 0 < K < 2^29; None: no pair table."""
    f32 = np.float32
    out_shape = np.matmul(np.zeros(a.shape, np.int8), np.zeros(b.shape, np.int8)).shape
    a = a.reshape(1, -1) if a.ndim == 1 else a
    b = b.reshape(-1, 1) if b.ndim == 1 else b
    ca = a.astype(f32) - np.asarray(a_zp).astype(f32)
    cb = b.astype(f32) - np.asarray(b_zp).astype(f32)
    shape = np.broadcast_shapes(ca.shape[:-1] + (1,), cb.shape[:-2] + (1, cb.shape[-1]))
    ca = np.broadcast_to(ca, shape[:-1] + (ca.shape[-1],))
    cb = np.broadcast_to(cb, shape[:-2] + cb.shape[-2:])
    K = ca.shape[-1]
    if pair_order is not None and not (0 < K < 2**29 and pair_exact(ca).all() and pair_exact(cb).all()):
        pair_order = None
    d = np.zeros(shape, f32)
    for idx in np.ndindex(*shape):
        d[idx] = float8_sum(ca[idx[:-1]], cb[idx[:-2] + (slice(None), idx[-1])], pair_order)
    with np.errstate(over="ignore", invalid="ignore"):
        x = d * (np.asarray(a_scale).astype(f32) * np.asarray(b_scale).astype(f32))
        v = x / np.asarray(y_scale).astype(f32)
        y_zp = np.asarray(y_zp)
        if float8_max is not None:
            v = v + y_zp.astype(f32)
            return np.clip(v, -f32(float8_max), f32(float8_max)).astype(y_zp.dtype).reshape(out_shape)
        info = np.iinfo(y_zp.dtype)
        r = np.rint(v)
        r = np.where(np.isnan(r), 0, r)
        return np.clip(r + y_zp.astype(np.float64), info.min, info.max).astype(y_zp.dtype).reshape(out_shape)
