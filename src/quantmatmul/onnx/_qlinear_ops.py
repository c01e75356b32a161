"""onnx/_qlinear_ops.py: com.microsoft QLinearAdd, QLinearMul and QLinearSoftmax (the nodes quantize_static's QOperator format writes for Add, Mul and Softmax) as ONNX Runtime 1.32's x86-64 CPU kernels compute them, bit for bit, in numpy.

Notation: ``f32(x)`` rounds to float32 (IEEE, nearest-even), ``fma32(a, b, c)`` is ``f32(a * b + c)``
rounded once, ``cvt(v)`` is x86 ``cvtps2dq`` (round half to even; NaN and values outside int32 give
INT32_MIN), ``sat`` clamps to the 8-bit type's range. Scales and zero points are per tensor (a scalar
or a one-element 1-D tensor, as ONNX Runtime requires); an absent (None) zero point is 0, as in ORT's
kernels (ORT's type inference refuses a model without QLinearAdd's / QLinearMul's A or B zero point;
C's may be left out).

Add and Mul broadcast numpy-style. ONNX Runtime's broadcaster walks the output in spans and calls one
of three functors for the whole operator (``_span_mode``): "A scalar per span", "B scalar per span"
or "both spans". For a scalar A the kernel gets its operands swapped, which changes Add's rounding,
so ``qlinear_add`` follows the same choice; Mul's products commute.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

from .. import _core
from ._common import without_leading_ones

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
_F32 = np.float32
_F64 = np.float64
_INT32_MIN = -(2**31)
_A_SCALAR, _B_SCALAR, _SPANS = 0, 1, 2
# QLinearAdd / QLinearMul / QLinearSoftmax outputs larger than this run the C++ loops (csrc/onnx_ops.h):
# all of them (numpy's code, the same arithmetic, took 50-130 us for a few hundred elements; the tests
# raise this to compare the two)
_NATIVE_FROM = 0


# --------------------------------------------------------------------------------------------------
# checks at the boundary


def _quantized(fn: str, name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in _INT8:
        raise TypeError(f"{fn}: {name} must be int8 or uint8, got {x.dtype}")
    return x


def _per_tensor(fn: str, name: str, x: np.ndarray) -> None:
    if not (x.ndim == 0 or (x.ndim == 1 and x.size == 1)):
        raise ValueError(f"{fn}: {name} must be a scalar or a 1-D tensor of one element, got shape {x.shape}")


def _scale(fn: str, name: str, s) -> np.float32:
    if s is None:
        raise TypeError(f"{fn}: {name} is required")
    s = np.asarray(s)
    if s.dtype != np.float32:
        raise TypeError(f"{fn}: {name} must be float32, got {s.dtype}")
    _per_tensor(fn, name, s)
    value = s.reshape(())[()]
    if not np.isfinite(value):
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    return value


def _zero_point(fn: str, name: str, z, dtype: np.dtype) -> int:
    if z is None:
        return 0
    z = np.asarray(z)
    if z.dtype != dtype:
        raise TypeError(f"{fn}: {name} must be {dtype} (the tensor's type), got {z.dtype}")
    _per_tensor(fn, name, z)
    return int(z.reshape(())[()])


def _binary_operands(fn, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, *, scalars=None):
    """A and B checked, their broadcast shape, and the scales and zero points (_binary_scalars; scalars: a
    BinaryScalars holding them, checked once for a session's node whose parameters are constants)."""
    A, B = _quantized(fn, "A", A), _quantized(fn, "B", B)
    if A.dtype != B.dtype:
        raise TypeError(f"{fn}: A and B must have one type, got {A.dtype} and {B.dtype}")
    try:
        shape = A.shape if A.shape == B.shape else np.broadcast_shapes(A.shape, B.shape)
    except ValueError:
        raise ValueError(f"{fn}: A {A.shape} and B {B.shape} do not broadcast") from None
    if scalars is not None:
        return A, B, shape, *scalars.checked(A.dtype)
    return (
        A,
        B,
        shape,
        *_binary_scalars(fn, A.dtype, A_scale, A_zero_point, B_scale, B_zero_point, C_scale, C_zero_point),
    )


def _binary_scalars(fn, dtype, A_scale, A_zero_point, B_scale, B_zero_point, C_scale, C_zero_point):
    """((A, B, C scales as float32), (their zero points as ints, each of the tensors' type dtype))."""
    scales = tuple(_scale(fn, n, s) for n, s in (("A_scale", A_scale), ("B_scale", B_scale), ("C_scale", C_scale)))
    zps = tuple(
        _zero_point(fn, n, z, dtype)
        for n, z in (("A_zero_point", A_zero_point), ("B_zero_point", B_zero_point), ("C_zero_point", C_zero_point))
    )
    return scales, zps


class BinaryScalars:
    """A QLinearAdd / QLinearMul node's scales and zero points when they are constants (the session's
    initializers): checked once per type of A and B, with the same errors, at the first call that has it."""

    def __init__(self, fn, A_scale, A_zero_point, B_scale, B_zero_point, C_scale, C_zero_point):
        self._fn, self._values = fn, (A_scale, A_zero_point, B_scale, B_zero_point, C_scale, C_zero_point)
        self._checked = {}

    def checked(self, dtype):
        found = self._checked.get(dtype)
        if found is None:
            found = self._checked[dtype] = _binary_scalars(self._fn, dtype, *self._values)
        return found


# --------------------------------------------------------------------------------------------------
# the x86 arithmetic


def _fma32(a, b, c) -> np.ndarray:
    """float32 fma(a, b, c) rounded once (vfmadd): a * b is exact in float64 (24 + 24 bits), the sum is
    rounded to odd there (TwoSum's error term nudges an inexact even result one ulp towards the exact
    sum), and rounding that to float32 is then correct (53 >= 24 + 2 bits). inf and NaN propagate as
    in IEEE."""
    with np.errstate(all="ignore"):
        p = np.asarray(a, _F64) * np.asarray(b, _F64)
        c = np.asarray(c, _F64)
        s = p + c
        t = s - p
        err = (p - (s - t)) + (c - t)
        inexact = (err != 0) & np.isfinite(s) & ((s.view(np.int64) & 1) == 0)
        if inexact.any():
            s = np.where(inexact, np.nextafter(s, np.copysign(np.inf, err)), s)
        return s.astype(_F32)


def _cvt_saturate(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """cvtps2dq, then the signed saturating packs to int16 and to the 8-bit type (packus for uint8)."""
    with np.errstate(invalid="ignore"):
        bad = ~((v >= _F32(-(2.0**31))) & (v < _F32(2.0**31)))  # NaN too
        r = np.where(bad, _INT32_MIN, np.rint(np.where(bad, _F32(0), v)).astype(np.int64))
    info = np.iinfo(dtype)
    return np.clip(r, info.min, info.max).astype(dtype)


def _span_mode(shape_a, shape_b) -> int:
    """Which functor ONNX Runtime's BroadcastLooper calls (element_wise_ops.h, Broadcaster): it walks the
    dimensions from the innermost, skipping those where both are 1 (but not the last common one); the
    first input whose dimension there is 1 (or 0) is "scalar" for every span, input 0 first. A rank-0
    input 0 is scalar; against a rank-0 input 1, input 0 is scalar iff its last dimension is <= 1."""
    if len(shape_a) == 0:
        return _A_SCALAR
    if len(shape_b) == 0:
        return _A_SCALAR if shape_a[-1] <= 1 else _B_SCALAR
    n = min(len(shape_a), len(shape_b))
    for i in range(n):
        da, db = shape_a[-1 - i], shape_b[-1 - i]
        dim = 0 if min(da, db) == 0 else max(da, db)
        if dim <= 1 and i + 1 < n:
            continue
        if da <= 1:
            return _A_SCALAR
        return _B_SCALAR if db <= 1 else _SPANS
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------------------------------
# the operators


def _operands(x: np.ndarray, y: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y and an output for them, each contiguous, as the C++ loops take them; the result as the caller
    returns it). x and y of the output's shape laid out alike in memory (both channels-last views of the
    session's convolutions, say) are read as they are and the result takes their layout; one of the
    output's shape in C order and the other C-contiguous and broadcast over the output's leading
    dimensions only (a bias of the last dimensions, a scalar) are read as they are, the C++ loops
    repeating the second; else they are broadcast and copied into C order."""
    shape = tuple(shape)
    for full, other in ((x, y), (y, x)):
        if full.shape == shape and full.flags.c_contiguous and other.flags.c_contiguous and other.size <= full.size:
            trailing = without_leading_ones(other.shape)
            if shape[len(shape) - len(trailing) :] == trailing:
                out = np.empty(shape, x.dtype)
                return x, y, out, out
    if x.shape == y.shape == shape and x.strides == y.strides:
        if x.flags.c_contiguous and y.flags.c_contiguous:  # (the common case, without the reordering below)
            out = np.empty(shape, x.dtype)
            return x, y, out, out
        order = np.argsort([-s for s in x.strides], kind="stable")  # axes from the outermost in memory
        xt, yt = x.transpose(order), y.transpose(order)
        if xt.flags.c_contiguous and yt.flags.c_contiguous:
            out = np.empty(xt.shape, x.dtype)
            return xt, yt, out, out.transpose(np.argsort(order))
    x, y = (np.ascontiguousarray(np.broadcast_to(v, shape)) for v in (x, y))
    out = np.empty(shape, x.dtype)
    return x, y, out, out


def qlinear_add(
    A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, *, scalars: BinaryScalars | None = None
) -> np.ndarray:
    """com.microsoft QLinearAdd as ONNX Runtime 1.32 computes it on x86-64 CPUs with AVX2 and FMA.

    The kernel is MLAS's ``MlasQLinearAdd{U8,S8}KernelAvx2`` (intrinsics/avx2/qladd_avx2.cpp), which
    ``MlasPlatform`` (platform.cpp) installs as ``QLinearAdd{U8,S8}Kernel`` whenever CPUID reports AVX,
    OSXSAVE, FMA and AVX2: AMD Zen 3 and Zen 4 and Intel Xeon (AVX-512 and AMX change nothing; there is
    no AVX-512 QLinearAdd kernel, and MLAS's fixed-point QLinearAdd path is ARM NEON only). ORT's
    QLinearAdd functors (contrib_ops/cpu/quantization/qlinear_binary_op.cc) call it as
    ``kernel(X, x_scale, x_zp, Y, y_scale, y_zp, C_scale, C_zp)`` with (X, Y) = (A, B), or (B, A) when
    A is the per-span scalar (``_span_mode``): the only thing broadcasting changes. In float32, with x,
    y the raw 8-bit values::

        rx = f32(x_scale / C_scale)                  ry = f32(y_scale / C_scale)
        k  = f32(f32(C_zp) - fma32(rx, x_zp, f32(ry * y_zp)))
        C  = sat(cvt(fma32(x, rx, fma32(y, ry, k))))

    (for a scalar Y the inner fma32 is the span's constant, ``_mm256_add_ps(k, _mm256_mul_ps(y, ry))``
    contracted, and per element for a span Y: the same value).
    The two fma32 in ``k`` and in the scalar's constant are GCC 14's contraction (-ffp-contract=fast,
    -mavx2 -mfma) of source written as separate multiplies and adds; which product is fused was found
    by comparison with onnxruntime 1.32.0's wheel. The span loop is the one _mm256_fmadd_ps chain, so
    results do not depend on the tail handling or on the thread split. On an x86-64 CPU without AVX2
    or FMA, ORT would run the SSE2 kernel of qladd.cpp (separate multiplies and adds in another order):
    not reproduced here.
    """
    fn = "QLinearAdd"
    A, B, shape, (a_s, b_s, c_s), (zpa, zpb, zpc) = _binary_operands(
        fn, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, scalars=scalars
    )
    if math.prod(shape) == 0:
        return np.empty(shape, A.dtype)
    swap, (is_signed, rx, ry, k) = _add_arguments(A, B, (a_s, b_s, c_s), (zpa, zpb, zpc))
    x, y = (B, A) if swap else (A, B)
    if math.prod(shape) > _NATIVE_FROM:  # the same arithmetic in C++ (one pass; AVX2 where the CPU has it)
        x, y, out, result = _operands(x, y, shape)
        _core.qlinear_add_codes(x, y, is_signed, rx, ry, k, out)
        return result
    with np.errstate(all="ignore"):
        inner = _fma32(y.astype(_F32), _F32(ry), _F32(k))  # the scalar's span constant, or the per-element inner fma
        v = _fma32(x.astype(_F32), _F32(rx), inner)
    return np.broadcast_to(_cvt_saturate(v, A.dtype), shape).copy()


def _add_arguments(A, B, scales, zero_points) -> tuple[bool, tuple]:
    """(whether B is ORT's X, the kernel's arguments (signed, rx, ry, k)) for QLinearAdd's checked A and B:
    A is X (x_scale, x_zp) unless it is the per-span scalar (_span_mode)."""
    (a_s, b_s, c_s), (zpa, zpb, zpc) = scales, zero_points
    swap = _span_mode(A.shape, B.shape) == _A_SCALAR
    xs, xz, ys, yz = (b_s, zpb, a_s, zpa) if swap else (a_s, zpa, b_s, zpb)
    return swap, (A.dtype == np.int8, *_add_parameters(float(xs), xz, float(ys), yz, float(c_s), zpc))


def _mul_arguments(A, scales, zero_points) -> tuple:
    """QLinearMul's kernel arguments (signed, zpa, zpb, r, zc) for checked operands of A's type."""
    (a_s, b_s, c_s), (zpa, zpb, zpc) = scales, zero_points
    with np.errstate(all="ignore"):
        r = _F32(_F32(a_s * b_s) / c_s)
    return A.dtype == np.int8, int(zpa), int(zpb), float(r), float(_F32(zpc))


def bind_binary(fn: str, scalars: BinaryScalars):
    """For a session node's fixed scales and zero points (fn "QLinearAdd" or "QLinearMul"; scalars: the
    node's BinaryScalars of them): a function of (A, B) giving qlinear_add / qlinear_mul's result where the
    C++ loop reads both as they are (C-contiguous, one of the broadcast shape, the other of it or repeated
    over its leading dimensions: _operands), else None. What a pair of shapes needs (the checks, the
    operand roles, the kernel's arguments) is formed once per type and shapes."""
    kernel = _core.qlinear_add_codes if fn == "QLinearAdd" else _core.qlinear_mul_codes
    plans = {}

    def plan(A, B):
        try:
            A, B, shape, scales, zero_points = _binary_operands(
                fn, A, None, None, B, None, None, None, None, scalars=scalars
            )
        except (TypeError, ValueError):  # the general call raises it
            return False
        if math.prod(shape) <= max(0, _NATIVE_FROM):  # (empty: the general call's)
            return False
        if fn == "QLinearAdd":
            swap, arguments = _add_arguments(A, B, scales, zero_points)
        else:
            swap, arguments = False, _mul_arguments(A, scales, zero_points)
        x, y = (B, A) if swap else (A, B)
        x2, y2, out, result = _operands(x, y, shape)
        return (swap, shape, arguments) if x2 is x and y2 is y and result is out else False

    def call(A, B):
        if type(A) is not np.ndarray or type(B) is not np.ndarray:
            return None
        key = (A.dtype, B.dtype, A.shape, B.shape, A.flags.c_contiguous, B.flags.c_contiguous)
        found = plans.get(key)
        if found is None:
            if len(plans) >= 64:
                plans.clear()
            found = plans[key] = plan(A, B)
        if found is False:
            return None
        swap, shape, arguments = found
        out = np.empty(shape, A.dtype)
        kernel(*((B, A) if swap else (A, B)), *arguments, out)
        return out

    return call


@functools.lru_cache(maxsize=4096)
def _add_parameters(xs: float, xz: int, ys: float, yz: int, c_s: float, zpc: int) -> tuple[float, float, float]:
    """QLinearAdd's float32 constants (rx, ry, k) for X, Y and C's scales and zero points (float32 values as
    Python floats): a model's node has the same ones on every run, so they are formed once."""
    with np.errstate(all="ignore"):
        rx, ry = _F32(_F32(xs) / _F32(c_s)), _F32(_F32(ys) / _F32(c_s))
        k = _F32(zpc) - _fma32(rx, _F32(xz), _F32(ry * _F32(yz)))
    return float(rx), float(ry), float(k)


def qlinear_mul(
    A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, *, scalars: BinaryScalars | None = None
) -> np.ndarray:
    """com.microsoft QLinearMul as ONNX Runtime 1.32 computes it on every x86-64 CPU.

    The kernel is MLAS's SSE2 ``MlasQLinearMulKernel`` (qlmul.cpp; no AVX2/AVX-512 variant exists, so
    Zen 3, Zen 4 and Intel Xeon run the same code, compiled without FMA). With the zero points
    subtracted in int16 and the product widened exactly to int32 (mullo/mulhi)::

        r = f32(f32(A_scale * B_scale) / C_scale)
        C = sat(cvt(f32(f32(f32((A - A_zp) * (B - B_zp)) * r) + f32(C_zp))))

    (a separate multiply and add, round half to even, saturated through int16 to the 8-bit type).
    Swapping the operands for a per-span scalar (qlinear_binary_op.cc) changes nothing here: both
    products are commutative. Broadcasting is numpy's.
    """
    fn = "QLinearMul"
    A, B, shape, (a_s, b_s, c_s), (zpa, zpb, zpc) = _binary_operands(
        fn, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, scalars=scalars
    )
    if math.prod(shape) == 0:
        return np.empty(shape, A.dtype)
    with np.errstate(all="ignore"):
        r = _F32(_F32(a_s * b_s) / c_s)
        if math.prod(shape) > _NATIVE_FROM:  # the same arithmetic in C++ (one pass; AVX2 where the CPU has it)
            a, b, out, result = _operands(A, B, shape)
            _core.qlinear_mul_codes(a, b, *_mul_arguments(A, (a_s, b_s, c_s), (zpa, zpb, zpc)), out)
            return result
        product = (A.astype(np.int32) - zpa) * (B.astype(np.int32) - zpb)  # |product| <= 255 * 255: exact
        v = product.astype(_F32) * r + _F32(zpc)
    return np.broadcast_to(_cvt_saturate(v, A.dtype), shape).copy()


def _load_logf():
    """glibc's logf, the function ONNX Runtime's table calls; numpy's float32 log is its own SIMD code."""
    name = ctypes.util.find_library("m")
    try:
        logf = ctypes.CDLL(name).logf
    except (OSError, AttributeError, TypeError):  # pragma: no cover - no C math library found
        return lambda x: float(np.log(_F32(x)))
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return logf


_logf = _load_logf()


@functools.lru_cache(maxsize=256)
def _softmax_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """QlinearBuildLookupTableUint32: exp's 256 values, indexed by 255 - (max(x) - x)."""
    shift = float(_logf(float(_F32(np.finfo(_F32).max) / _F32(reduce_len))))  # float / size_t: in float
    shift = max(0.0, shift - 5.0) / x_scale
    table = [math.exp((float(i) - 255.0 + shift) * x_scale) for i in range(256)]  # libm's exp, as ORT's
    return np.array(table, _F64).astype(_F32)


def qlinear_softmax(X, X_scale, x_zero_point, Y_scale, y_zero_point, *, axis: int = -1, opset: int) -> np.ndarray:
    """com.microsoft QLinearSoftmax as ONNX Runtime 1.32 computes it (CPU; plain C++, no MLAS).

    Attributes: ``axis`` (default -1: ORT fills the schema's default in, whatever ``opset``) and
    ``opset``, the opset of the Softmax it replaces (required): below 13, X is flattened to
    ``[prod(shape[:axis]), prod(shape[axis:])]`` and each row is one softmax; from 13, each softmax
    runs along ``axis`` alone. x_zero_point is checked but unused (softmax is shift invariant).
    With D the softmax length (contrib_ops/cpu/quantization/qlinear_softmax.cc)::

        shift    = max(0, double(logf(f32(FLT_MAX / f32(D)))) - 5) / double(X_scale)        (double)
        table[i] = f32(exp((double(i) - 255 + shift) * double(X_scale)))      i = 0..255, glibc exp
        e_j      = table[255 - (max_k x_k - x_j)]
        sum      = e_0 + e_1 + ... + e_{D-1}                      float32, one element after another
        Yd       = double(floor(f32(1.0f / y_scale)))       (floor(1.0 / double(y_scale)) if not finite)
        Y_j      = sat(nearbyint(double(e_j) * Yd / double(sum)) + y_zp)                      (double)

    ``nearbyint`` rounds half to even; the clamp is done in double (to [0, 255] / [-128, 127]; NaN
    gives 0). This is the 1.32 build's code, read from its machine code: the quotient in double and the
    int8 clamp to 127 postdate the public source's float quotient and its int8 "> 255" check
    (onnxruntime#29727). logf and exp are the process's C library's (as ONNX Runtime's calls are), so
    the table matches on any CPU. X_scale must be positive: else ORT's table holds inf or NaN, and a
    row whose float32 sum is 0 makes ORT's kernel return, leaving that row and the rest of its thread's
    rows unwritten (with X_scale > 0 the largest entry, exp(shift * X_scale), is at least 1).
    """
    fn = "QLinearSoftmax"
    X = _quantized(fn, "X", X)
    if X.ndim == 0:
        raise ValueError(f"{fn}: X must have at least 1 dimension")
    parameters = _softmax_parameters(X.dtype, X_scale, x_zero_point, Y_scale, y_zero_point, axis, opset)
    if not -X.ndim <= axis < X.ndim:
        raise ValueError(f"{fn}: axis {axis} is out of range for {X.ndim}-D X")
    return _softmax(X, int(axis) % X.ndim, opset, *parameters)


def _softmax_parameters(dtype, X_scale, x_zero_point, Y_scale, y_zero_point, axis, opset) -> tuple[float, float, int]:
    """qlinear_softmax's parameters, checked for an X of dtype: (X_scale, Yd, y_zero_point) as numbers."""
    fn = "QLinearSoftmax"
    x_s = _scale(fn, "X_scale", X_scale)
    if not x_s > 0:
        raise ValueError(f"{fn}: X_scale must be positive, got {x_s}")
    y_s = _scale(fn, "Y_scale", Y_scale)
    _zero_point(fn, "x_zero_point", x_zero_point, dtype)
    y_zp = _zero_point(fn, "y_zero_point", y_zero_point, dtype)
    for name, value in (("axis", axis), ("opset", opset)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__}")
    if opset < 1:
        raise ValueError(f"{fn}: opset must be at least 1, got {opset}")
    with np.errstate(all="ignore"):
        y_float = np.floor(_F32(1.0) / y_s)
        y_double = float(y_float) if np.isfinite(y_float) else float(np.floor(_F64(1.0) / _F64(y_s)))
    return float(x_s), y_double, y_zp


def bind_softmax(X_scale, x_zero_point, Y_scale, y_zero_point, *, axis: int = -1, opset: int):
    """For parameters that stay the same from call to call (a session node's initializers and attributes):
    a function of X giving qlinear_softmax(X, X_scale, x_zero_point, Y_scale, y_zero_point, axis=axis,
    opset=opset) for an ndarray X of the zero points' type (uint8 without them) and a rank axis fits, else
    None; or None where the parameters are refused (qlinear_softmax raises that at the call)."""
    given = [np.asarray(z).dtype for z in (x_zero_point, y_zero_point) if z is not None]
    dtype = given[0] if given else np.dtype(np.uint8)
    if dtype not in _INT8:
        return None
    try:
        parameters = _softmax_parameters(dtype, X_scale, x_zero_point, Y_scale, y_zero_point, axis, opset)
    except (TypeError, ValueError):
        return None

    def softmax(X):
        if type(X) is not np.ndarray or X.dtype != dtype or not -X.ndim <= axis < X.ndim:
            return None
        return _softmax(X, int(axis) % X.ndim, opset, *parameters)

    return softmax


def _softmax(X: np.ndarray, axis: int, opset: int, x_s: float, y_double: float, y_zp: int) -> np.ndarray:
    """qlinear_softmax's values for a checked X (0 <= axis < X.ndim) and parameters."""
    if X.size == 0:
        return np.empty(X.shape, X.dtype)
    if opset < 13:
        rows = X.reshape(math.prod(X.shape[:axis]), -1)
    else:
        rows = X if axis == X.ndim - 1 else np.moveaxis(X, axis, -1)
    table = _softmax_table(x_s, rows.shape[-1])
    if X.size > _NATIVE_FROM:  # the same arithmetic in C++, row by row
        x2 = np.ascontiguousarray(rows).reshape(-1, rows.shape[-1])
        y = np.empty(x2.shape, X.dtype)
        _core.qlinear_softmax_rows(x2, X.dtype == np.int8, table, y_double, y_zp, y)
        return _softmax_layout(y.reshape(rows.shape), X.shape, axis, opset)
    x = rows.astype(np.int32)
    e = table[255 - (x.max(axis=-1, keepdims=True) - x)]
    total = np.cumsum(e, axis=-1, dtype=_F32)[..., -1:]  # accumulate is sequential, in float32
    with np.errstate(all="ignore"):
        v = np.rint(e.astype(_F64) * y_double / total.astype(_F64)) + y_zp
        info = np.iinfo(X.dtype)
        y = np.where(np.isnan(v), 0, np.clip(v, info.min, info.max)).astype(X.dtype)
    return _softmax_layout(y, X.shape, axis, opset)


def _softmax_layout(y: np.ndarray, shape: tuple, axis: int, opset: int) -> np.ndarray:
    """The softmax rows y (contiguous) in X's shape and layout."""
    if opset < 13:
        return y.reshape(shape)
    return y if axis == len(shape) - 1 else np.ascontiguousarray(np.moveaxis(y, -1, axis))
