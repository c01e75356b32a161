"""onnx/_qlinear_unary.py: com.microsoft QLinearConcat, QLinearSigmoid and QLinearLeakyRelu (the nodes quantize_static's QOperator format writes for Concat, Sigmoid and LeakyRelu: 256-entry lookup tables) as ONNX Runtime 1.32's x86-64 CPU kernels compute them, bit for bit, in numpy.

Notation as in _qlinear_ops.py: ``f32(x)`` rounds to float32, ``fma32(a, b, c)`` is ``f32(a * b + c)``
rounded once, ``cvt`` is ``cvtps2dq`` (round half to even). Scales and zero points are per tensor.

All three map each 8-bit code through a table that ORT builds once per node (in the kernel's
constructor when the scales and zero points are constant initializers, else on every run: the same
values). ``QlinearBuildLookupTable`` (contrib_ops/cpu/quantization/qlinear_lookup_table.cc), for the
256 codes x of the type::

    x_f      = f32(x_scale * f32(x - x_zp))
    y_f      = F(x_f)                                     the operator's float function
    table[x] = cvt(min(max(f32(y_f / y_scale), f32(qmin - y_zp)), f32(qmax - y_zp))) + y_zp

The last line is MLAS's QuantizeLinear (``MlasQuantizeLinear{U8,S8}KernelAvx512F`` on AVX-512 CPUs
such as Zen 4, the SSE2 kernel elsewhere: the same divide, clamp and round); the max is
``max_ps(v, lo)``, so a NaN quotient (0 / 0 with y_scale 0) gives qmin. F is:

* QLinearLeakyRelu: ``x_f if x_f >= 0 else f32(alpha * x_f)``, alpha the float32 attribute
  (default 0.01).
* QLinearSigmoid: MLAS's ``MlasComputeLogistic``, on AVX2/FMA CPUs (Zen 3, Zen 4, Intel Xeon) the
  assembly kernel ``MlasLogisticKernelFma3`` (x86_64/LogisticKernelFma3.S), Eigen's rational
  polynomial, not 1 / (1 + exp(-x)). With the constants a_i, b_i of ``MlasLogisticConstants``
  (logistic.cpp; as float32, byte for byte those in the 1.32 wheel)::

      v  = min(18, max(-18, x_f))               x2 = f32(v * v)
      p  = fma32(x2, fma32(x2, fma32(x2, fma32(x2, a9, a7), a5), a3), a1)
      q  = fma32(x2, fma32(x2, fma32(x2, fma32(x2, fma32(x2, b10, b8), b6), b4), b2), b0)
      F  = max(0, f32(f32(f32(v * p) / q) + 0.5))

  (no upper clamp in this kernel; the SSE2 C kernel, used without FMA, multiplies and adds
  separately and clamps to [0, 1]: not reproduced here).
* QLinearConcat (qlinear_concat.cc): the identity, for each input whose scale or zero point differs
  from Y's (``x_scale == Y_scale`` as floats, so 0.0 and -0.0 are equal); an input with both equal
  is copied byte for byte, not looked up. Then a plain concatenation along ``axis``.

A QLinearSigmoid / QLinearLeakyRelu node may leave either zero point out with an empty input name
(0); ORT 1.32's kernel constructor reads input 4 unchecked, so such a node with Y_zero_point left off
the end of its inputs aborts the process (a failed bounds assertion).
"""

from __future__ import annotations

import functools

import numpy as np

from ._qlinear_ops import _fma32, _quantized, _scale, _zero_point

_F32 = np.float32

# MlasLogisticConstants (logistic.cpp), as float32
_LOGISTIC_RANGE = _F32(18.0)
_ALPHA = [_F32(v) for v in (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03)]
_ALPHA_1 = _F32(2.48287947061529e-01)
_BETA = [
    _F32(v)
    for v in (
        6.10247389755681e-13,
        5.76102136993427e-09,
        6.29106785017040e-06,
        1.70198817374094e-03,
        1.16817656904453e-01,
    )
]
_BETA_0 = _F32(9.93151921023180e-01)


# --------------------------------------------------------------------------------------------------
# the arithmetic


def _quantize_linear(v: np.ndarray, y_scale, y_zp: int, dtype: np.dtype) -> np.ndarray:
    """MLAS's QuantizeLinear of float32 v: divide, clamp (NaN to the low end), cvt, add the zero point."""
    info = np.iinfo(dtype)
    lo, hi = _F32(info.min - y_zp), _F32(info.max - y_zp)
    with np.errstate(all="ignore"):
        q = v / _F32(y_scale)
        q = np.minimum(np.where(np.isnan(q) | (q < lo), lo, q), hi)
    return (np.rint(q).astype(np.int32) + y_zp).astype(dtype)


def _logistic(x: np.ndarray) -> np.ndarray:
    """MlasLogisticKernelFma3 on float32 x."""
    with np.errstate(all="ignore"):
        v = np.minimum(_LOGISTIC_RANGE, np.maximum(-_LOGISTIC_RANGE, x))
        x2 = v * v
        p = _fma32(x2, _ALPHA[0], _ALPHA[1])
        for a in (*_ALPHA[2:], _ALPHA_1):
            p = _fma32(x2, p, a)
        q = _fma32(x2, _BETA[0], _BETA[1])
        for b in (*_BETA[2:], _BETA_0):
            q = _fma32(x2, q, b)
        return np.maximum(_F32(0), (v * p) / q + _F32(0.5))


def _bits(value) -> int:
    """A float32's bit pattern: the cache key (0.0 and -0.0 give different tables: 1 / +-0)."""
    return int(np.asarray(value, _F32).view(np.uint32))


@functools.lru_cache(maxsize=1024)
def _table(kind: str, dtype: str, x_scale: int, x_zp: int, y_scale: int, y_zp: int, alpha: int = 0) -> np.ndarray:
    """QlinearBuildLookupTable's 256 outputs by byte code (read-only); scales and alpha as float32 bits."""
    dtype = np.dtype(dtype)
    xs, ys, a = (np.uint32(b).view(_F32) for b in (x_scale, y_scale, alpha))
    with np.errstate(all="ignore"):
        x = xs * (np.arange(256, dtype=np.uint8).view(dtype).astype(np.int32) - x_zp).astype(_F32)
        if kind == "sigmoid":
            y = _logistic(x)
        elif kind == "leaky_relu":
            y = np.where(x >= _F32(0), x, a * x)
        else:
            y = x
    table = _quantize_linear(y, ys, y_zp, dtype)
    table.flags.writeable = False
    return table


def _lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.asarray(table.take(x.view(np.uint8)))


def _activation(fn, kind, X, X_scale, X_zero_point, Y_scale, Y_zero_point, alpha=0.0):
    X = _quantized(fn, "X", X)
    xs, ys = _scale(fn, "X_scale", X_scale), _scale(fn, "Y_scale", Y_scale)
    xz = _zero_point(fn, "X_zero_point", X_zero_point, X.dtype)
    yz = _zero_point(fn, "Y_zero_point", Y_zero_point, X.dtype)
    table = _table(kind, X.dtype.str, _bits(xs), xz, _bits(ys), yz, _bits(alpha))
    return _lookup(table, X)


# --------------------------------------------------------------------------------------------------
# the operators


def qlinear_sigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point) -> np.ndarray:
    """com.microsoft QLinearSigmoid as ONNX Runtime 1.32 computes it on x86-64 CPUs with AVX2 and FMA:
    each code through the table of MLAS's FMA3 logistic kernel (module docstring). Zero points may be
    None (0)."""
    return _activation("QLinearSigmoid", "sigmoid", X, X_scale, X_zero_point, Y_scale, Y_zero_point)


def qlinear_leaky_relu(X, X_scale, X_zero_point, Y_scale, Y_zero_point, *, alpha=0.01) -> np.ndarray:
    """com.microsoft QLinearLeakyRelu as ONNX Runtime 1.32 computes it on x86-64 CPUs: each code through
    the table of ``x_f if x_f >= 0 else f32(alpha * x_f)``, alpha rounded to float32 as the attribute
    is (module docstring). Zero points may be None (0)."""
    fn = "QLinearLeakyRelu"
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: alpha must be a float, got {type(alpha).__name__}")
    return _activation(fn, "leaky_relu", X, X_scale, X_zero_point, Y_scale, Y_zero_point, _F32(alpha))


def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis) -> np.ndarray:
    """com.microsoft QLinearConcat as ONNX Runtime 1.32 computes it.

    ``inputs`` are (tensor, scale, zero point) triples, flat, in the node's input order:
    ``qlinear_concat(Y_scale, Y_zero_point, X0, X0_scale, X0_zero_point, X1, ...)``. Every zero point
    is required and of Y_zero_point's type (int8 or uint8), as is every tensor; the tensors have one
    rank (at least 1) and equal sizes but on ``axis`` (negative counts from the end). Each input is
    requantized to Y's scale and zero point through its lookup table, or copied where both are Y's
    (module docstring).
    """
    fn = "QLinearConcat"
    ys = _scale(fn, "Y_scale", Y_scale)
    if Y_zero_point is None:
        raise TypeError(f"{fn}: Y_zero_point is required")
    dtype = _quantized(fn, "Y_zero_point", Y_zero_point).dtype
    yz = _zero_point(fn, "Y_zero_point", Y_zero_point, dtype)
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{fn}: axis must be an int, got {type(axis).__name__}")
    if len(inputs) == 0 or len(inputs) % 3:
        raise ValueError(
            f"{fn}: inputs must be one or more (tensor, scale, zero point) triples, got {len(inputs)} values"
        )
    tensors = []
    for i in range(0, len(inputs), 3):
        x, s, z = inputs[i : i + 3]
        j = i // 3
        x = _quantized(fn, f"input {j}", x)
        if x.dtype != dtype:
            raise TypeError(f"{fn}: input {j} must be {dtype} (Y_zero_point's type), got {x.dtype}")
        xs = _scale(fn, f"input {j}'s scale", s)
        if z is None:
            raise TypeError(f"{fn}: input {j}'s zero point is required")
        xz = _zero_point(fn, f"input {j}'s zero point", z, dtype)
        tensors.append((x, xs, xz))
    rank = tensors[0][0].ndim
    if rank == 0 or any(x.ndim != rank for x, _, _ in tensors):
        raise ValueError(
            f"{fn}: the inputs must have one rank, at least 1, got shapes {[x.shape for x, _, _ in tensors]}"
        )
    if not -rank <= axis < rank:
        raise ValueError(f"{fn}: axis {axis} is out of range for rank {rank}")
    axis = int(axis) % rank
    rest = {x.shape[:axis] + x.shape[axis + 1 :] for x, _, _ in tensors}
    if len(rest) > 1:
        raise ValueError(
            f"{fn}: the inputs' shapes must be equal but on axis {axis}, got {[x.shape for x, _, _ in tensors]}"
        )
    parts = []
    for x, xs, xz in tensors:
        if xs == ys and xz == yz:
            parts.append(x)
        else:
            parts.append(_lookup(_table("identity", dtype.str, _bits(xs), xz, _bits(ys), yz), x))
    return np.concatenate(parts, axis=axis)
