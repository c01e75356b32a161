"""onnx/_qlinear_pool.py: com.microsoft QLinearGlobalAveragePool and QLinearAveragePool (the nodes quantize_static's QOperator format writes for GlobalAveragePool and AveragePool) as ONNX Runtime 1.32's x86-64 CPU kernels compute them, bit for bit, in numpy.

Notation as in _qlinear_ops.py: ``f32(x)`` rounds to float32, ``cvt`` is ``cvtps2dq`` (round half to
even), ``trunc`` is ``cvttss2si`` (C's float -> int32 cast: NaN and values outside int32 give
INT32_MIN), ``sat`` clamps to the 8-bit type's range [qmin, qmax]. Scales and zero points are per
tensor. X is ``[N, C, D1, ...]``, or ``[N, D1, ..., C]`` with ``channels_last=1``.

QLinearGlobalAveragePool (contrib_ops/cpu/quantization/qlinear_global_average_pool.cc) runs MLAS's
integer kernels, ``MlasQLinearGlobalAveragePoolNchw`` / ``...Nhwc`` (qlgavgpool.cpp; SSE2 intrinsics on
every x86-64 CPU). With S = D1 * D2 * ... (the image size), per (n, c)::

    acc   = x_1 + ... + x_S - x_zp * S                                  int32, wrapping
    scale = f32(x_scale / f32(y_scale * f32(S)))
    Y     = cvt(min(max(f32(f32(acc) * scale), f32(qmin - y_zp)), f32(qmax - y_zp))) + y_zp

(``max`` is ``_mm_max_ps(v, lo)``: a NaN v gives lo). The NCHW and NHWC kernels add in different
orders, in integers: the same sum. It wraps modulo 2^32 like the kernels' int32 accumulators, which
happens for S above 2^31 / 255 (about 8.4 million) with values far from x_zp: ORT then returns the
wrapped average, and so does this. ORT refuses (``QLinearGlobalAveragePool parameter out of
computation range!``) when S >= 2^24 or the scale is outside [2^-32, 256) (y_scale zero or negative
included); the functions here compute the formula above for those too.

QLinearAveragePool (qlinear_pool.cc) has two paths:

* **global fallback**: when the spatial shape equals ``kernel_shape`` and every pad (after auto_pad)
  is 0, the kernel calls the global-average-pool code above with S = prod(kernel_shape) (strides,
  ceil_mode and count_include_pad do not matter; this also covers more than 3 spatial axes, which
  the float path refuses). ORT's range check applies there as well.
* **float path** (1 to 3 spatial axes), plain C++ without FMA contraction::

      x_f  = f32(x_scale * f32(x - x_zp))                           every element, dequantized
      sum  = ((0 + x_f[first]) + x_f[next]) + ...   float32, the window's in-bounds elements in row-major order
      mean = f32(sum / f32(count))
      Y    = sat(trunc(nearbyintf(f32(f32(mean / y_scale) + f32(y_zp)))))

  A window at output position p spans ``[p * stride - pad_begin, + kernel)`` on each axis, clipped to
  ``[0, D)`` (the end pads never add elements); ``count`` is ``prod(kernel_shape)`` with
  count_include_pad, else the product over axes of ``min(start + kernel, D) - max(start, 0)``. The
  zero point is added in float32 before rounding (``f32(q + y_zp)`` can round a near-tie into a
  tie), and a quotient beyond int32 (a tiny y_scale) or NaN truncates to INT32_MIN, so it saturates
  to qmin even when it is huge and positive. Here the elements are added tap by tap over the whole
  output (padding as +0.0, which leaves a float32 sum unchanged): the same sequence of roundings.

Output sizes (pool_attributes.h, as ORT 1.32 computes them; C integer division truncates towards 0)::

    NOTSET:     pads as given        VALID: no pads
    SAME_*:     need = (ceil(D / s) - 1) * s + k - D  (negative when k < s)
                SAME_UPPER: begin = trunc(need / 2),  SAME_LOWER: begin = trunc((need + 1) / 2),  end = need - begin
    floor mode: out = trunc((D + begin + end - k) / s) + 1
    ceil mode:  out = ceil((D + begin + end - k) / s) + 1, less 1 if (out - 1) * s >= D + begin

A negative ``out`` is refused (ORT: "Calculated output dimension is negative"); ``out`` can be 0 (an
empty output), where ORT's channels_last kernels divide by zero and kill the process (SIGFPE): the
function here returns the empty array. ORT also refuses pads that are negative or not smaller than
the kernel, non-positive kernel sizes and strides, and inputs with a zero-sized C or spatial axis.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import _core
from ._qlinear_ops import _cvt_saturate, _quantized, _scale, _zero_point

_F32 = np.float32
_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# --------------------------------------------------------------------------------------------------
# checks at the boundary


def _flag(fn: str, name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {name} must be 0 or 1 (an int), got {type(value).__name__}")
    if value not in (0, 1):
        raise ValueError(f"{fn}: {name} must be 0 or 1, got {value}")
    return int(value)


def _int_list(fn: str, name: str, values, length: int) -> list[int]:
    try:
        out = [v for v in values]
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a sequence of ints, got {type(values).__name__}") from None
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in out):
        raise TypeError(f"{fn}: {name} must be a sequence of ints, got {values!r}")
    if len(out) != length:
        raise ValueError(f"{fn}: {name} must have {length} values, got {len(out)}")
    return [int(v) for v in out]


def _operands(fn, X, x_scale, x_zero_point, y_scale, y_zero_point, *, zero_points_required: bool):
    X = _quantized(fn, "X", X)
    xs, ys = _scale(fn, "x_scale", x_scale), _scale(fn, "y_scale", y_scale)
    if zero_points_required:
        for name, z in (("x_zero_point", x_zero_point), ("y_zero_point", y_zero_point)):
            if z is None:
                raise TypeError(f"{fn}: {name} is required")
    xz = _zero_point(fn, "x_zero_point", x_zero_point, X.dtype)
    yz = _zero_point(fn, "y_zero_point", y_zero_point, X.dtype)
    return X, xs, xz, ys, yz


# --------------------------------------------------------------------------------------------------
# the arithmetic


def _global_mean(x: np.ndarray, x_scale, x_zp: int, y_scale, y_zp: int, axes: tuple[int, ...]) -> np.ndarray:
    """MLAS's QLinearGlobalAveragePool over ``axes`` of x (kept, as size 1)."""
    size = math.prod(x.shape[a] for a in axes)
    with np.errstate(all="ignore"):
        scale = _F32(x_scale / _F32(y_scale * _F32(size)))
        acc = x.sum(axis=axes, dtype=np.int64, keepdims=True) - np.int64(x_zp) * size
        acc = acc.astype(np.uint32).view(np.int32)  # the int32 accumulators wrap
        v = acc.astype(_F32) * scale
        info = np.iinfo(x.dtype)
        lo, hi = _F32(info.min - y_zp), _F32(info.max - y_zp)
        v = np.minimum(np.where(np.isnan(v) | (v < lo), lo, v), hi)
    return (np.rint(v).astype(np.int32) + y_zp).astype(x.dtype)


def _pool_geometry(fn, spatial, kernel, strides, pads, auto_pad, ceil_mode):
    """(begin pads, output sizes) per spatial axis, as ORT's PoolAttributes computes them; begin pads
    can be negative for SAME with kernel < stride (the window then starts after the stride point)."""
    nd = len(spatial)
    begins, ends, out = [], [], []
    for i, (D, k, s) in enumerate(zip(spatial, kernel, strides)):
        if auto_pad == "NOTSET":
            b, e = pads[i], pads[i + nd]
        elif auto_pad == "VALID":
            b, e = 0, 0
        else:
            need = (-(-D // s) - 1) * s + k - D
            half = need + 1 if auto_pad == "SAME_LOWER" else need
            b = int(math.copysign(abs(half) // 2, half))  # C division: towards 0
            e = need - b
        num = D + b + e - k
        if ceil_mode:
            o = -(-num // s) + 1
            if (o - 1) * s >= D + b:
                o -= 1
        else:
            o = int(math.copysign(abs(num) // s, num)) + 1
        if o < 0:
            raise ValueError(
                f"{fn}: output size {o} on spatial axis {i} is negative (input {D}, kernel {k}, stride {s}, "
                f"pads {b} + {e})"
            )
        begins.append(b)
        ends.append(e)
        out.append(o)
    return begins, ends, out


def _window_means(x: np.ndarray, x_scale, x_zp: int, kernel, strides, begins, out, count_include_pad) -> np.ndarray:
    """The float path's per-window means (before quantization) of x [N, C, D1, ...], float32."""
    nd = len(kernel)
    spatial = x.shape[2:]
    with np.errstate(all="ignore"):
        xf = _F32(x_scale) * (x.astype(np.int32) - x_zp).astype(_F32)
    # a negative begin pad skips that many elements; padding (begin, and past the end for every window)
    # adds +0.0, which no float32 sum notices
    xf = xf[(slice(None), slice(None), *(slice(max(-b, 0), None) for b in begins))]
    widths = []
    for i in range(nd):
        b = max(begins[i], 0)
        widths.append((b, max(0, (out[i] - 1) * strides[i] + kernel[i] - b - xf.shape[2 + i])))
    padded = np.pad(xf, [(0, 0), (0, 0), *widths])
    total = np.zeros((*x.shape[:2], *out), _F32)
    for tap in itertools.product(*(range(k) for k in kernel)):  # row-major: the kernel's order
        total += padded[
            (slice(None), slice(None), *(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(tap, out, strides)))
        ]
    if count_include_pad:
        count = np.asarray(math.prod(kernel), np.int64)
    else:
        count = np.ones((1,) * nd, np.int64)
        for i in range(nd):
            start = np.arange(out[i], dtype=np.int64) * strides[i] - begins[i]
            n = np.minimum(start + kernel[i], spatial[i]) - np.maximum(start, 0)
            count = count * n.reshape([-1 if j == i else 1 for j in range(nd)])
    with np.errstate(all="ignore"):
        return total / count.astype(_F32)


# --------------------------------------------------------------------------------------------------
# the operators


def qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0) -> np.ndarray:
    """com.microsoft QLinearGlobalAveragePool as ONNX Runtime 1.32 computes it on x86-64 CPUs.

    X ``[N, C, D1, ...]`` (``[N, D1, ..., C]`` with channels_last=1), at least 3-D; the output keeps
    the rank, every spatial axis 1. Zero points are required (the schema's), scales are per tensor.
    MLAS's integer sum and one float32 multiply (module docstring); where ORT refuses (image size
    >= 2^24, scale x_scale / (y_scale * S) outside [2^-32, 256)) this computes the same formula.
    """
    fn = "QLinearGlobalAveragePool"
    X, xs, xz, ys, yz = _operands(fn, X, x_scale, x_zero_point, y_scale, y_zero_point, zero_points_required=True)
    channels_last = _flag(fn, "channels_last", channels_last)
    if X.ndim < 3:
        raise ValueError(f"{fn}: X must have at least 3 dimensions, got shape {X.shape}")
    return _global_pool(X, xs, xz, ys, yz, channels_last)


def bind_global_average_pool(x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0):
    """For parameters that stay the same from call to call (a session node's initializers and attribute): a
    function of X giving qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point,
    channels_last=channels_last) for an ndarray X of the zero points' type with at least 3 dimensions, else
    None; or None where the parameters are refused (the function raises that at the call)."""
    fn = "QLinearGlobalAveragePool"
    dtype = np.asarray(x_zero_point).dtype if x_zero_point is not None else None
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return None
    try:
        xs, ys = _scale(fn, "x_scale", x_scale), _scale(fn, "y_scale", y_scale)
        xz, yz = (
            _zero_point(fn, "x_zero_point", x_zero_point, dtype),
            _zero_point(fn, "y_zero_point", y_zero_point, dtype),
        )
        last = _flag(fn, "channels_last", channels_last)
    except (TypeError, ValueError):
        return None

    def pool(X):
        if type(X) is not np.ndarray or X.dtype != dtype or X.ndim < 3:
            return None
        return _global_pool(X, xs, xz, ys, yz, last)

    return pool


def _global_pool(X: np.ndarray, xs, xz: int, ys, yz: int, channels_last: int) -> np.ndarray:
    """qlinear_global_average_pool's values for checked operands (X at least 3-D)."""
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    N, C = (X.shape[0], X.shape[-1]) if channels_last else X.shape[:2]
    S = math.prod(X.shape[a] for a in axes)
    # The same arithmetic in C++ on the codes as they lie: [N, S, C] memory (channels_last, or a
    # channels-last view from the session's convolutions) or [N, C, S]; other layouts copied first.
    if X.size == 0:
        return _global_mean(X, xs, xz, ys, yz, axes)
    last = X if channels_last else X.transpose(0, *range(2, X.ndim), 1)
    in_channels_last = bool(channels_last) or last.flags.c_contiguous
    codes = np.ascontiguousarray(last if in_channels_last else X)
    with np.errstate(all="ignore"):
        scale = _F32(xs / _F32(ys * _F32(S)))
    y = np.empty((N, C), X.dtype)
    _core.qlinear_global_average_pool_codes(
        codes, X.dtype == np.int8, N, S, C, in_channels_last, int(xz), float(scale), int(yz), y
    )
    kept = [1] * (X.ndim - 2)
    return y.reshape(N, *kept, C) if channels_last else y.reshape(N, C, *kept)


def qlinear_average_pool(
    X,
    x_scale,
    x_zero_point,
    y_scale,
    y_zero_point,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    channels_last=0,
    count_include_pad=0,
    kernel_shape,
    pads=None,
    strides=None,
) -> np.ndarray:
    """com.microsoft QLinearAveragePool as ONNX Runtime 1.32 computes it on x86-64 CPUs.

    X ``[N, C, D1, ...]`` (``[N, D1, ..., C]`` with channels_last=1) with 1 to 3 spatial axes (more
    only where the global fallback applies); ``kernel_shape`` one positive int per spatial axis;
    ``strides`` positive (default 1); ``pads`` begins then ends, each in [0, kernel) (default 0; used
    with auto_pad NOTSET only); ``auto_pad`` NOTSET, SAME_UPPER, SAME_LOWER or VALID; ``ceil_mode``,
    ``count_include_pad`` and ``channels_last`` 0 or 1. Zero points may be None (0; in a model, ORT's
    type inference refuses an empty name for either, but y_zero_point may be left off the end). The output
    sizes, the float path and the global fallback are the module docstring's.
    """
    fn = "QLinearAveragePool"
    X, xs, xz, ys, yz = _operands(fn, X, x_scale, x_zero_point, y_scale, y_zero_point, zero_points_required=False)
    ceil_mode = _flag(fn, "ceil_mode", ceil_mode)
    channels_last = _flag(fn, "channels_last", channels_last)
    count_include_pad = _flag(fn, "count_include_pad", count_include_pad)
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in _AUTO_PAD:
        raise ValueError(f"{fn}: auto_pad must be one of {', '.join(_AUTO_PAD)}, got {auto_pad!r}")
    if X.ndim < 3:
        raise ValueError(f"{fn}: X must have at least 3 dimensions, got shape {X.shape}")
    x = np.moveaxis(X, -1, 1) if channels_last else X  # a view, [N, C, D1, ...]
    spatial = x.shape[2:]
    nd = len(spatial)
    if kernel_shape is None:
        raise TypeError(f"{fn}: kernel_shape is required")
    kernel = _int_list(fn, "kernel_shape", kernel_shape, nd)
    strides = [1] * nd if strides is None else _int_list(fn, "strides", strides, nd)
    pads = [0] * (2 * nd) if pads is None else _int_list(fn, "pads", pads, 2 * nd)
    if any(k < 1 for k in kernel) or any(s < 1 for s in strides):
        raise ValueError(f"{fn}: kernel_shape and strides must be positive, got {kernel} and {strides}")
    if any(not 0 <= p < k for p, k in zip(pads, kernel + kernel)):
        raise ValueError(f"{fn}: pads must be non-negative and smaller than the kernel {kernel}, got {pads}")
    if x.shape[1] == 0 or 0 in spatial:
        raise ValueError(f"{fn}: only N can be zero, got shape {X.shape}")

    begins, ends, out = _pool_geometry(fn, spatial, kernel, strides, pads, auto_pad, ceil_mode)
    if list(spatial) == kernel and not any(begins) and not any(ends):  # ORT's global fallback
        y = _global_mean(x, xs, xz, ys, yz, tuple(range(2, x.ndim)))
    elif nd > 3:
        raise ValueError(f"{fn}: ONNX Runtime pools over 1 to 3 spatial axes, got {nd} (shape {X.shape})")
    elif math.prod(out) * x.shape[0] == 0:
        y = np.empty((*x.shape[:2], *out), X.dtype)
    else:
        mean = _window_means(x, xs, xz, kernel, strides, begins, out, count_include_pad)
        with np.errstate(all="ignore"):
            y = _cvt_saturate(mean / ys + _F32(yz), X.dtype)
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y
