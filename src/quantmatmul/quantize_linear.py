"""quantize_linear.py: ONNX QuantizeLinear and DequantizeLinear (opset 21), matching onnxruntime bit for bit: float32 and 8/16-bit integers per tensor or per axis in C++, the rest in numpy + ml_dtypes.

``quantize_linear`` and ``dequantize_linear`` make and read the operands of
QLinearMatMul (and of any other QDQ graph): per-tensor, per-axis and blocked
quantization into int8, uint8, int16, uint16, int4, uint4 and the four float8
types of ONNX.

Results are bit-identical to onnxruntime's CPU execution provider and to the
onnx reference implementation (``onnx.reference.ReferenceEvaluator``) except
as listed below. Where the two peers differ these functions follow
onnxruntime, except where onnxruntime itself depends on undefined behaviour:

* float16 inputs: ``x / y_scale`` is computed in float32, as onnxruntime does;
  the reference divides in float16 and so rounds the quotient twice.
  bfloat16 inputs, which onnxruntime's CPU provider does not implement, are
  treated the same way (the reference divides in bfloat16).
* Integer outputs: quotients ``x / y_scale`` of magnitude 2**31 or more,
  and +-Inf, saturate to the type's bounds as the spec formula says. That is
  what onnxruntime's per-tensor float32 kernel (MLAS) does; its float16,
  blocked and int4 per-axis kernels, and the reference, convert to int32
  before clamping (undefined in C++, INT32_MIN on x86), so there +Inf and
  huge positive quotients come out as the type's minimum. NaN becomes the
  type's minimum, as in MLAS; the int32 paths give the minimum too unless
  the zero point is negative, where they wrap around to the maximum.
* float8 NaN: quantizing NaN to float8_e5m2 gives 0x7F / 0xFF (onnxruntime);
  the reference gives 0x7E / 0xFE. Both decode to NaN.
* float8 with ``saturate=False``, two quirks of onnxruntime's converters are
  reproduced: float8_e4m3fn maps magnitudes in [480, 496) to +-448 (correct
  rounding gives NaN), and float8_e5m2 maps magnitudes in [61440, 65536) to
  NaN (correct rounding gives +-Inf). Everything else rounds to nearest even.
* float8 zero points must be +0 (bit pattern 0x00). onnxruntime rejects any
  other float8 zero point in DequantizeLinear (-0 included) and ignores it in
  QuantizeLinear, as does the reference; both functions here reject it.
* With ``block_size > 0`` the scale must have the blocked shape; the
  reference also takes a scalar as per-tensor there, onnxruntime rejects it.
  A 1-D ``x`` of length <= block_size has the blocked scale shape (1,),
  which onnxruntime rejects as "per-tensor with block_size"; it is accepted
  here, like the reference does.
"""

from __future__ import annotations

import math
import operator

import ml_dtypes
import numpy as np

from . import _core
from ._dtypes import FLOAT8_TYPES as _FLOAT8_TYPES
from ._dtypes import SCALE_TYPES as _SCALE_TYPES

__all__ = ["quantize_linear", "dequantize_linear"]

# Quantized integer types and their saturation ranges.
_INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
}

_E4M3FN, _E4M3FNUZ, _E5M2, _E5M2FNUZ = _FLOAT8_TYPES

_QUANT_TYPES = tuple(_INT_RANGES) + _FLOAT8_TYPES
# The integer types the C++ loops take (csrc/quantize_linear.h, IntType), float32 on the other side.
_CORE_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int16): 2, np.dtype(np.uint16): 3}
_F32 = np.dtype(np.float32)
_QUANTIZE_INPUT_TYPES = _SCALE_TYPES + (np.dtype(np.float64),)


def _names(dtypes) -> str:
    return ", ".join(d.name for d in dtypes)


def _check_dtype(prefix: str, what: str, dtype: np.dtype, allowed) -> None:
    if dtype not in allowed:
        raise TypeError(f"{prefix}{what} must have dtype {_names(allowed)}; got {dtype}")


def _check_int_attr(prefix: str, name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{prefix}{name} must be an integer; got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{prefix}{name} must be an integer; got {value!r}") from None


def _check_scale_values(prefix: str, scale: np.ndarray) -> None:
    values = scale.astype(np.float32)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{prefix}scale must be finite; got a NaN or infinite value")
    if np.any(values == 0):
        raise ValueError(f"{prefix}scale must be nonzero; got a zero value")


def _is_per_tensor(shape: tuple[int, ...]) -> bool:
    return len(shape) == 0 or shape == (1,)


def _check_zero_point_shape(prefix: str, zero_point: np.ndarray, scale: np.ndarray) -> None:
    same = zero_point.shape == scale.shape
    both_single = _is_per_tensor(zero_point.shape) and _is_per_tensor(scale.shape)
    if not (same or both_single):
        raise ValueError(
            f"{prefix}zero point must have the scale's shape {scale.shape}; got {zero_point.shape}"
        )


def _layout(prefix: str, x_shape, scale_shape, axis: int, block_size: int):
    """Classify the scale as per-tensor, per-axis or blocked; return (kind, normalized axis)."""
    rank = len(x_shape)

    def normalized_axis() -> int:
        if not -rank <= axis < rank:
            raise ValueError(
                f"{prefix}axis must be in [{-rank}, {rank - 1}] for an input of rank {rank}; got {axis}"
            )
        return axis % rank

    if block_size < 0:
        raise ValueError(f"{prefix}block_size must be >= 0; got {block_size}")
    if rank == 0 and not (block_size == 0 and _is_per_tensor(scale_shape)):
        raise ValueError(
            f"{prefix}x is a scalar, so the scale must be a scalar or have shape (1,) and "
            f"block_size must be 0; got scale shape {tuple(scale_shape)}, block_size={block_size}"
        )
    if block_size == 0:
        if _is_per_tensor(scale_shape):
            return "tensor", None
        if len(scale_shape) == 1:
            ax = normalized_axis()
            if scale_shape[0] != x_shape[ax]:
                raise ValueError(
                    f"{prefix}a per-axis scale must have length x.shape[{ax}] = {x_shape[ax]}; "
                    f"got shape {scale_shape}"
                )
            return "axis", ax
        raise ValueError(
            f"{prefix}scale must be a scalar, have shape (1,), or be 1-D of length x.shape[axis] "
            f"(or pass block_size > 0 for blocked quantization); got shape {scale_shape}"
        )
    ax = normalized_axis()
    expected = list(x_shape)
    expected[ax] = -(-x_shape[ax] // block_size)
    if tuple(scale_shape) != tuple(expected):
        raise ValueError(
            f"{prefix}a blocked scale for x of shape {tuple(x_shape)} with axis={ax} and "
            f"block_size={block_size} must have shape {tuple(expected)}; got {tuple(scale_shape)}"
        )
    return "blocked", ax


def _expand(param: np.ndarray, x_shape, kind: str, axis, block_size: int) -> np.ndarray:
    """Return ``param`` reshaped or repeated so that it broadcasts against ``x``."""
    if kind == "tensor":
        return param.reshape(())
    if kind == "axis":
        shape = [1] * len(x_shape)
        shape[axis] = param.shape[0]
        return param.reshape(shape)
    repeated = np.repeat(param, block_size, axis=axis)
    return repeated[(slice(None),) * axis + (slice(0, x_shape[axis]),)]


def _float8_from(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """Round ``v`` (float32 or float64) to ``dtype`` the way onnxruntime's Float8 constructors do.

    That is ml_dtypes' round-to-nearest-even cast (after clipping to +-max when
    saturating), with NaN encoded as 0x7F | sign (0x80 for the FNUZ types) and
    the two non-saturating quirks described in the module docstring.
    """
    finfo = ml_dtypes.finfo(dtype)
    if saturate:
        y = np.asarray(np.clip(v, -float(finfo.max), float(finfo.max))).astype(dtype)
    else:
        y = v.astype(dtype)
    bits = y.view(np.uint8)
    nan = np.isnan(v)
    sign = np.where(np.signbit(v), np.uint8(0x80), np.uint8(0))
    if dtype in (_E4M3FNUZ, _E5M2FNUZ):
        bits[nan] = 0x80
    else:
        bits[nan] = 0x7F | sign[nan]
    if not saturate:
        magnitude = np.abs(v)
        if dtype == _E4M3FN:
            quirk = (magnitude >= 480) & (magnitude < 496)
            bits[quirk] = 0x7E | sign[quirk]
        elif dtype == _E5M2:
            quirk = (magnitude >= 61440) & (magnitude < 65536)
            bits[quirk] = 0x7F | sign[quirk]
    return y


def _channels(x_shape, scale, zero_point, kind, ax):
    """For the C++ loops: one float32 scale and int32 zero point per channel, and the elements of
    each run of one channel (per tensor: one channel, runs of everything)."""
    scale = np.ascontiguousarray(scale.reshape(-1), _F32)  # float16 / bfloat16 scales widen exactly
    count = scale.size
    zero_point = np.zeros(count, np.int32) if zero_point is None else np.ascontiguousarray(zero_point.reshape(-1),
                                                                                           np.int32)
    inner = max(1, int(np.prod(x_shape[ax + 1:], dtype=np.int64))) if kind == "axis" else max(1, int(np.prod(x_shape)))
    return scale, zero_point, inner


def _single(value, dtypes):
    """value as a Python number where it is one value of one of dtypes (a numpy scalar, or an
    array of shape () or (1,)), else None."""
    if isinstance(value, np.ndarray):
        if value.dtype not in dtypes or value.shape not in ((), (1,)):
            return None
        return value.reshape(()).item()
    return value.item() if isinstance(value, np.generic) and value.dtype in dtypes else None


def _per_tensor_call(scale, zero_point, zero_point_dtypes, axis, block_size, flag):
    """The most frequent call (an ndarray, per-tensor float32 scale, 8/16-bit integer or no zero point,
    default-typed attributes) checked with as little Python as gives the full path's verdict: the
    scale and zero point as numbers, or None (then the full path checks and runs it)."""
    if type(axis) is not int or type(block_size) is not int or block_size != 0 or type(flag) is not bool:
        return None
    s = _single(scale, (_F32,))
    if s is None or not math.isfinite(s) or s == 0:
        return None
    if zero_point is None:
        return s, 0
    z = _single(zero_point, zero_point_dtypes)
    same_shape = np.shape(zero_point) == np.shape(scale) or {np.shape(zero_point), np.shape(scale)} <= {(), (1,)}
    return (s, z) if z is not None and same_shape else None


def _bind_quantize(y_scale, y_zero_point, *, axis, block_size, saturate):
    """quantize_linear's per-tensor call in C++ for these parameters: a function of x (a float32 ndarray)
    giving quantize_linear(x, y_scale, y_zero_point, axis=axis, block_size=block_size, saturate=saturate),
    or None where they are not that call (the full path checks and runs it). For parameters that stay the
    same from call to call (a model's initializers), once."""
    single = _per_tensor_call(y_scale, y_zero_point, _CORE_TYPES, axis, block_size, saturate)
    if single is None:
        return None
    out_dtype = np.dtype(np.uint8) if y_zero_point is None else np.asarray(y_zero_point).dtype
    scale, zero_point, kind = np.array([single[0]], _F32), np.array([single[1]], np.int32), _CORE_TYPES[out_dtype]

    def quantize(x):
        y = np.empty(x.shape, out_dtype)
        _core.quantize_linear_f32(np.ascontiguousarray(x), scale, zero_point, max(1, x.size), kind, y)
        return y

    quantize.per_tensor = (single[0], single[1], out_dtype)  # (the session's fused LayerNormalization reads them)
    return quantize


def _bind_dequantize(x_scale, x_zero_point, *, axis, block_size, x_dtype=None):
    """dequantize_linear's per-tensor call in C++ for these parameters: a function of x (an ndarray) giving
    dequantize_linear(x, x_scale, x_zero_point, axis=axis, block_size=block_size) where x has x_dtype (where
    not given: x_zero_point's type, or with no zero point any 8- or 16-bit integer type), else None; or None
    where the parameters are not that call. For parameters that stay the same from call to call, once."""
    if x_dtype is not None:
        dtypes = (x_dtype,)
    elif x_zero_point is None:
        dtypes = tuple(_CORE_TYPES)
    else:
        dtypes = (x_zero_point.dtype,) if isinstance(x_zero_point, (np.ndarray, np.generic)) else ()
    single = _per_tensor_call(x_scale, x_zero_point, dtypes, axis, block_size, True)
    if single is None or not set(dtypes) <= set(_CORE_TYPES):
        return None
    scale, zero_point = np.array([single[0]], _F32), np.array([single[1]], np.int32)

    def dequantize(x):
        if type(x) is not np.ndarray or x.dtype not in dtypes:
            return None
        y = np.empty(x.shape, _F32)
        _core.dequantize_linear_f32(np.ascontiguousarray(x), _CORE_TYPES[x.dtype], scale, zero_point, max(1, x.size), y)
        return y

    dequantize.per_tensor = (single[0], single[1], dtypes)  # (the session's fused LayerNormalization reads them)
    return dequantize


def _quantize(x, y_scale, y_zero_point, out_dtype, kind, ax, block_size, compute, saturate):
    """The arithmetic of quantize_linear, on validated inputs."""
    if x.dtype == _F32 and out_dtype in _CORE_TYPES and kind in ("tensor", "axis"):  # the common case, in C++
        scale, zero_point, inner = _channels(x.shape, y_scale, y_zero_point, kind, ax)
        y = np.empty(x.shape, out_dtype)
        _core.quantize_linear_f32(np.ascontiguousarray(x), scale, zero_point, inner, _CORE_TYPES[out_dtype], y)
        return y
    scale = _expand(y_scale, x.shape, kind, ax, block_size).astype(compute)
    v = np.asarray(x.astype(compute) / scale)
    if out_dtype in _FLOAT8_TYPES:
        return _float8_from(v, out_dtype, saturate)
    low, high = _INT_RANGES[out_dtype]
    q = np.rint(v)
    if y_zero_point is not None:
        q = q + _expand(y_zero_point, x.shape, kind, ax, block_size).astype(compute)
    q = np.where(np.isnan(q), low, np.clip(q, low, high))
    return np.asarray(q.astype(np.int32).astype(out_dtype))


def quantize_linear(
    x,
    y_scale,
    y_zero_point=None,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: bool = True,
) -> np.ndarray:
    """ONNX QuantizeLinear (opset 21): ``saturate(round(x / y_scale) + y_zero_point)``.

    Results are bit-identical to onnxruntime's CPU kernel; the module docstring
    lists the exceptions and where the onnx reference implementation differs.

    Parameters
    ----------
    x : array_like
        float32, float16, bfloat16 (``ml_dtypes.bfloat16``) or float64.
    y_scale : array_like
        float32, float16 or bfloat16, finite and nonzero; a Python number
        becomes a scalar of ``x``'s dtype (float32 for float64 ``x``).
        Scalar or shape ``(1,)``: per-tensor. 1-D of length ``x.shape[axis]``:
        per-axis. With ``block_size > 0``: ``x``'s shape except
        ``ceil(x.shape[axis] / block_size)`` along ``axis`` (blocked).
        ONNX wants ``y_scale`` to have ``x``'s dtype; other combinations are
        accepted too (see Notes).
    y_zero_point : array_like, optional
        Same shape as ``y_scale``; its dtype is the output dtype: int8, uint8,
        int16, uint16, ``ml_dtypes.int4``, ``ml_dtypes.uint4`` or one of the
        ``ml_dtypes`` float8 types (then it must be +0). None means uint8 zero.
    axis : int, default 1
        Quantization axis for per-axis and blocked scales (negative counts
        from the end). Ignored for a per-tensor scale, as in onnxruntime.
    block_size : int, default 0
        0 for per-tensor or per-axis; > 0 for blocked quantization.
    saturate : bool, default True
        float8 outputs only: clip to the largest finite value (±Inf included)
        instead of producing NaN / ±Inf on overflow. NaN stays NaN.

    Returns
    -------
    numpy.ndarray
        Shape of ``x``, dtype of ``y_zero_point`` (uint8 when it is None).

    Notes
    -----
    ``x / y_scale`` is computed in float64 when ``x`` is float64 and in
    float32 otherwise: onnxruntime's choice for float16, and numpy's type
    promotion (so the reference's) for float64 and for mixed dtypes. Integer
    outputs round half to even, add the zero point and saturate; NaN becomes
    the type's minimum. float8 outputs round to nearest even (with
    onnxruntime's NaN encoding and its two ``saturate=False`` quirks).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[-1.0, 0.26, 2.0]], dtype=np.float32)
    >>> quantize_linear(x, np.float32(0.02), np.int8(-3))
    array([[-53,  10,  97]], dtype=int8)
    >>> quantize_linear(x, np.float32(0.02), np.uint8(0))
    array([[  0,  13, 100]], dtype=uint8)
    """
    if type(x) is np.ndarray and x.dtype == _F32:
        quantize = _bind_quantize(y_scale, y_zero_point, axis=axis, block_size=block_size, saturate=saturate)
        if quantize is not None:
            return quantize(x)
    prefix = "quantize_linear: "
    x = np.asarray(x)
    _check_dtype(prefix, "x", x.dtype, _QUANTIZE_INPUT_TYPES)
    if isinstance(y_scale, (int, float)) and not isinstance(y_scale, (bool, np.generic)):
        y_scale = np.asarray(y_scale, dtype=x.dtype if x.dtype in _SCALE_TYPES else np.float32)
    y_scale = np.asarray(y_scale)
    _check_dtype(prefix, "y_scale", y_scale.dtype, _SCALE_TYPES)
    if y_zero_point is None:
        out_dtype = np.dtype(np.uint8)
    else:
        y_zero_point = np.asarray(y_zero_point)
        out_dtype = y_zero_point.dtype
        _check_dtype(prefix, "y_zero_point", out_dtype, _QUANT_TYPES)
        _check_zero_point_shape(prefix, y_zero_point, y_scale)
        if out_dtype in _FLOAT8_TYPES and np.any(y_zero_point.view(np.uint8) != 0):
            raise ValueError(f"{prefix}a float8 zero point must be +0 (bits 0x00); got a nonzero or -0 value")
    axis = _check_int_attr(prefix, "axis", axis)
    block_size = _check_int_attr(prefix, "block_size", block_size)
    if not isinstance(saturate, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"{prefix}saturate must be a bool; got {saturate!r}")
    kind, ax = _layout(prefix, x.shape, y_scale.shape, axis, block_size)
    _check_scale_values(prefix, y_scale)

    compute = np.float64 if x.dtype == np.float64 else np.float32
    with np.errstate(all="ignore"):  # overflow to Inf and NaN inputs are expected
        return _quantize(x, y_scale, y_zero_point, out_dtype, kind, ax, block_size, compute, bool(saturate))


def dequantize_linear(
    x,
    x_scale,
    x_zero_point=None,
    *,
    axis: int = 1,
    block_size: int = 0,
) -> np.ndarray:
    """ONNX DequantizeLinear (opset 21): ``(x - x_zero_point) * x_scale``.

    Computed in float32 and rounded once to the scale's dtype, bit-identical
    to onnxruntime's CPU kernel and to the onnx reference implementation.

    Parameters
    ----------
    x : array_like
        int8, uint8, int16, uint16, ``ml_dtypes.int4``, ``ml_dtypes.uint4`` or
        one of the four ``ml_dtypes`` float8 types.
    x_scale : array_like
        float32, float16 or bfloat16, finite and nonzero (a Python number
        becomes float32). Shapes as in :func:`quantize_linear`.
    x_zero_point : array_like, optional
        Same dtype as ``x`` and same shape as ``x_scale``; for float8 ``x``
        it must be +0 (bits 0x00). None means zero.
    axis : int, default 1
        Quantization axis for per-axis and blocked scales.
    block_size : int, default 0
        0 for per-tensor or per-axis; > 0 for blocked quantization.

    Returns
    -------
    numpy.ndarray
        Shape of ``x``, dtype of ``x_scale``.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.array([[-53, 10, 97]], dtype=np.int8)
    >>> dequantize_linear(q, np.float32(0.02), np.int8(-3))
    array([[-1.  ,  0.26,  2.  ]], dtype=float32)
    """
    if type(x) is np.ndarray and x.dtype in _CORE_TYPES:
        dequantize = _bind_dequantize(x_scale, x_zero_point, axis=axis, block_size=block_size, x_dtype=x.dtype)
        if dequantize is not None:
            return dequantize(x)
    prefix = "dequantize_linear: "
    x = np.asarray(x)
    _check_dtype(prefix, "x", x.dtype, _QUANT_TYPES)
    if isinstance(x_scale, (int, float)) and not isinstance(x_scale, (bool, np.generic)):
        x_scale = np.asarray(x_scale, dtype=np.float32)
    x_scale = np.asarray(x_scale)
    _check_dtype(prefix, "x_scale", x_scale.dtype, _SCALE_TYPES)
    if x_zero_point is not None:
        x_zero_point = np.asarray(x_zero_point)
        if x_zero_point.dtype != x.dtype:
            raise TypeError(
                f"{prefix}x_zero_point must have x's dtype {x.dtype}; got {x_zero_point.dtype}"
            )
        _check_zero_point_shape(prefix, x_zero_point, x_scale)
        if x.dtype in _FLOAT8_TYPES and np.any(x_zero_point.view(np.uint8) != 0):
            raise ValueError(f"{prefix}a float8 zero point must be +0 (bits 0x00); got a nonzero or -0 value")
    axis = _check_int_attr(prefix, "axis", axis)
    block_size = _check_int_attr(prefix, "block_size", block_size)
    kind, ax = _layout(prefix, x.shape, x_scale.shape, axis, block_size)
    _check_scale_values(prefix, x_scale)

    if x.dtype in _CORE_TYPES and kind in ("tensor", "axis"):  # the common case, in C++
        scale, zero_point, inner = _channels(x.shape, x_scale, x_zero_point, kind, ax)
        y = np.empty(x.shape, _F32)
        _core.dequantize_linear_f32(np.ascontiguousarray(x), _CORE_TYPES[x.dtype], scale, zero_point, inner, y)
        with np.errstate(all="ignore"):  # float16 / bfloat16 scales: the float32 result rounded to them
            return y if x_scale.dtype == _F32 else np.asarray(y.astype(x_scale.dtype))
    with np.errstate(all="ignore"):  # NaN / Inf float8 inputs and overflow are expected
        d = x.astype(np.float32)
        if x_zero_point is not None and x.dtype not in _FLOAT8_TYPES:
            d = d - _expand(x_zero_point, x.shape, kind, ax, block_size).astype(np.float32)
        y = d * _expand(x_scale, x.shape, kind, ax, block_size).astype(np.float32)
        return np.asarray(y.astype(x_scale.dtype))
