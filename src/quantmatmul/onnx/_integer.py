"""onnx/_integer.py: DynamicQuantizeLinear (C++: csrc/onnx_ops.cpp) and MatMulInteger (the int8 GEMM kernels) as ONNX Runtime computes them, and the integer operands the session's MatMulInteger and QGemm share."""

from __future__ import annotations

from math import prod
from typing import NamedTuple

import numpy as np

from .. import _core
from ..qlinear import batch_index


def dynamic_quantize_linear(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear (opset 11) as ONNX Runtime's CPU kernel computes it: ``(y, y_scale, y_zero_point)``.

    In float32: ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``, ``scale = (hi - lo) / 255`` (1 when
    ``hi == lo``, i.e. x all zero or empty, where the spec would divide by zero), ``zero_point =
    round_half_even(max(0, min(255, 0 - lo / scale)))`` (255 where that quotient is NaN: an infinite
    or zero scale), and ``y = QuantizeLinear(x, scale, zero_point)`` (``round_half_even(x / scale) +
    zero_point``, saturated to uint8; NaN to 0). NaN elements are left out of min(x) and max(x). In
    C++ (csrc/onnx_ops.cpp): one pass for the range, one to quantize, both over the thread pool."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:  # (the session's case: one call)
        return _core.dynamic_quantize_linear_arrays(x)
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"dynamic_quantize_linear: x must be float32, got {x.dtype}")
    y = np.empty(x.shape, np.uint8)
    scale, zero_point = _core.dynamic_quantize_linear(np.ascontiguousarray(x).reshape(-1), y.reshape(-1))
    return y, np.asarray(scale, np.float32), np.asarray(zero_point, np.uint8)


_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


class _IntegerOperand(NamedTuple):
    """A MatMulInteger operand: its values (int8 or uint8), its zero point as int32 shaped to broadcast
    against them (per tensor (), per row of a (..., M, 1), per column of b (..., 1, N) or (N,)), and for
    a constant b, b packed once for the int8 kernels (qmm's PackedB)."""

    x: np.ndarray
    zp: np.ndarray
    packed: object = None


def _integer_operand(which, x, zero_point, fn, *, pack=False):
    """The operand checked, its zero point per tensor, per row of a or per column of b (_IntegerOperand)."""
    x = np.asarray(x)
    if x.dtype not in _INT8:
        raise TypeError(f"{fn}: {which} must be int8 or uint8, got {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{fn}: {which} must have at least 1 dimension")
    zp = _zero_point_shaped(which, x, zero_point, fn)
    packed = None
    if pack and x.size:  # a constant b: packed once, as QLinearMatMul packs its weight
        b = x[:, None] if x.ndim == 1 else x
        packed = _core.pack_b(np.ascontiguousarray(b).reshape(-1, *b.shape[-2:]), x.dtype == np.int8)
    return _IntegerOperand(x, zp, packed)


def _zero_point_shaped(which, x, zero_point, fn):
    if zero_point is None:
        return np.zeros((), np.int32)
    zp = np.asarray(zero_point)
    if zp.dtype != x.dtype:
        raise TypeError(f"{fn}: {which}_zero_point dtype {zp.dtype} does not match {which} dtype {x.dtype}")
    z = zp.astype(np.int32)
    if z.size == 1:
        return z.reshape(())
    if which == "a":  # per row: [M] for a of rank >= 2, or a shape ending in (M, 1)
        if x.ndim >= 2 and z.shape == (x.shape[-2],):
            return z.reshape(-1, 1)
        if z.ndim >= 2 and z.shape[-1] == 1:
            return z
    else:  # per column: [N], or a shape ending in (1, N) or (..., N) for batched b
        if x.ndim >= 2 and z.shape == (x.shape[-1],):
            return z
        if x.ndim >= 3 and z.shape == x.shape[:-2] + (x.shape[-1],):
            return z[..., None, :]
        if z.ndim >= 2 and z.shape[-2] == 1:
            return z
    raise ValueError(
        f"{fn}: {which}_zero_point has shape {zp.shape}, which is neither per tensor nor per "
        f"{'row' if which == 'a' else 'column'} of {which} {x.shape}"
    )


def _matmul_integer(a: _IntegerOperand, b: _IntegerOperand) -> np.ndarray:
    """(a - a_zp) @ (b - b_zp) in int32 (wrapping), numpy.matmul's shapes, on the int8 GEMM kernels
    (QLinearMatMul's accumulation without its requantization: exact modulo 2^32)."""
    A = a.x[None, :] if a.x.ndim == 1 else a.x
    B = b.x[:, None] if b.x.ndim == 1 else b.x
    if A.shape[-1] != B.shape[-2]:
        raise ValueError(f"MatMulInteger: inner dimensions differ: a {a.x.shape}, b {b.x.shape}")
    if A.ndim >= 3 and b.x.ndim == 2 and a.zp.ndim == 0:  # a's leading dimensions fold into its rows (qlinear._run)
        rows = _IntegerOperand(A.reshape(prod(A.shape[:-1]), A.shape[-1]), a.zp)
        return _matmul_integer(rows, b).reshape(A.shape[:-1] + (B.shape[-1],))
    try:
        batch = tuple(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
        a_zp = np.broadcast_to(a.zp, A.shape[:-1] + (1,))
        b_zp = np.broadcast_to(b.zp, B.shape[:-2] + (1, B.shape[-1]))
    except ValueError:
        raise ValueError(
            f"MatMulInteger: a {a.x.shape}, b {b.x.shape} and their zero points do not broadcast"
        ) from None
    (M, K), N = A.shape[-2:], B.shape[-1]
    shape = batch + (() if a.x.ndim == 1 else (M,)) + (() if b.x.ndim == 1 else (N,))
    count = int(np.prod(batch, dtype=np.int64)) * M * N
    if count == 0 or K == 0:
        return np.zeros(shape, np.int32)

    a3 = np.ascontiguousarray(A).reshape(-1, M, K)
    b_operand = b.packed if b.packed is not None else np.ascontiguousarray(B).reshape(-1, K, N)
    y = _core.matmul_integer(
        a3,
        A.dtype == np.int8,
        batch_index(A.shape[:-2], batch),
        np.ascontiguousarray(a_zp.reshape(len(a3), M)),
        b_operand,
        B.dtype == np.int8,
        batch_index(B.shape[:-2], batch),
        np.ascontiguousarray(b_zp.reshape(-1, N)),
    )
    return y.reshape(shape)


def matmul_integer(A, B, a_zero_point=None, b_zero_point=None) -> np.ndarray:
    """ONNX MatMulInteger (opset 10): ``(A - a_zero_point) @ (B - b_zero_point)`` accumulated in int32, exact
    (wrapping only past int32, which needs K > 33025). Zero points per tensor, per row of A, per column of B."""
    fn = "matmul_integer"
    return _matmul_integer(_integer_operand("a", A, a_zero_point, fn), _integer_operand("b", B, b_zero_point, fn))
