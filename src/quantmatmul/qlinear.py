"""qlinear.py: ONNX QLinearMatMul (opsets 10 and 21): validation, normalization and dispatch to the C++ core."""

from __future__ import annotations

import bisect
import math
import struct
from fractions import Fraction
from math import prod

import numpy as np

from . import _core
from ._dtypes import (
    FLOAT8_TYPES,
    QUANT_TYPES,
    SCALE_TYPES,
    float8_scale_exponent,
    float32_table,
    is_float8,
    names,
    to_float32,
)

__all__ = ["qlinear_matmul", "QLinearMatMul", "NUMERICS"]

NUMERICS = ("onnxruntime", "onnx-reference", "exact")
_FN = "qlinear_matmul"


def qlinear_matmul(
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, numerics: str = "onnxruntime"
) -> np.ndarray:
    """Quantized matrix product, ONNX QLinearMatMul (opsets 10 and 21).

    ``y = saturate(round(((a - a_zero_point) @ (b - b_zero_point)) * a_scale * b_scale / y_scale) + y_zero_point)``

    Parameters
    ----------
    a, b : array of int8, uint8 or an ml_dtypes float8 type (float8_e4m3fn, float8_e4m3fnuz,
        float8_e5m2, float8_e5m2fnuz); each independently. Shapes follow ``numpy.matmul``: 1-D
        operands are promoted and the added axis dropped, batch dimensions broadcast.
    a_scale, a_zero_point : per tensor (shape ``()`` or ``(1,)``) or per row of ``a`` (``(M,)`` for
        2-D ``a``, or a shape broadcasting to ``a.shape[:-1] + (1,)`` such as ``(..., M, 1)``).
    b_scale, b_zero_point : per tensor or per column of ``b`` (``(N,)``, ``(1, N)``, ``(..., 1, N)``).
    y_scale, y_zero_point : per tensor or, as an extension, any shape that broadcasts to the output.
        The output dtype is ``y_zero_point.dtype``.
        Scales are float32, float16 or bfloat16 (one dtype for all three; a Python float is taken as
        float32), finite and nonzero. A zero point has its scale's shape and its tensor's dtype.
    numerics : {"onnxruntime", "onnx-reference", "exact"}
        ``"onnxruntime"`` (default): bit-identical to ONNX Runtime's CPU kernel: wrapping int32
        accumulation, multiplier ``f32(f32(a_scale * b_scale) / y_scale)``, one float32 product,
        round half to even, saturate, add the zero point. ``"onnx-reference"``: bit-identical to
        ``onnx.reference.ReferenceEvaluator`` (multiplier in the scales' own dtype, float64 product,
        ``np.rint``). ``"exact"``: no intermediate rounding: 64-bit accumulation and round half to
        even of the exact real value. See docs/quantization.md.

    Float8 operands or a float8 output take the float path: ``q - zero_point`` of each operand in
    float32, their products summed by float32 fused multiply-adds in order of k (float8 products are
    exact in float32), times ``a_scale * b_scale`` (``"exact"``: the exact sum and a single final
    rounding), then ``x / y_scale + y_zero_point`` is converted to a float8 output with
    round-to-nearest-even and saturation (NaN stays NaN), or to an integer output by the integer
    rule. docs/quantization.md has the exact sequence of roundings.

    Examples
    --------
    >>> import numpy as np, quantmatmul
    >>> a = np.array([[208, 236, 0, 238], [3, 214, 255, 29]], np.uint8)
    >>> b = np.array([[152, 51, 244], [60, 26, 255], [0, 127, 246], [127, 254, 247]], np.uint8)
    >>> s = lambda v: np.array([v], np.float32)
    >>> z = lambda v: np.array([v], np.uint8)
    >>> quantmatmul.qlinear_matmul(a, s(0.0066), z(113), b, s(0.00705), z(114), s(0.0107), z(118))
    array([[168, 115, 255],
           [  1,  66, 151]], dtype=uint8)
    """
    _check_numerics(numerics, _FN)
    b = _quantized(b, "b")
    b_zero_point = _zero_point(b_zero_point, "b_zero_point", b.dtype, "b")
    return _run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, numerics, _FN, None)


class QLinearMatMul:
    """QLinearMatMul with a constant b, packed once: the way models run it (ONNX Runtime prepacks
    constant initializers the same way).

    ``w = QLinearMatMul(b, b_scale, b_zero_point)`` validates b and its parameters and, for 8-bit
    integer b, packs it into the kernels' layout with its column sums (the zero-point terms of
    docs/quantization.md). ``w(a, a_scale, a_zero_point, y_scale, y_zero_point, *, numerics=...)``
    returns exactly what ``qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point,
    y_scale, y_zero_point, numerics=...)`` returns. b is copied: later changes to the caller's
    array do not affect the packed weight.

    Examples
    --------
    >>> import numpy as np, quantmatmul
    >>> b = np.array([[152, 51, 244], [60, 26, 255], [0, 127, 246], [127, 254, 247]], np.uint8)
    >>> w = quantmatmul.QLinearMatMul(b, np.float32(0.00705), np.uint8(114))
    >>> a = np.array([[208, 236, 0, 238], [3, 214, 255, 29]], np.uint8)
    >>> w(a, np.float32(0.0066), np.uint8(113), np.float32(0.0107), np.uint8(118))
    array([[168, 115, 255],
           [  1,  66, 151]], dtype=uint8)
    """

    _FN = "QLinearMatMul"

    def __init__(self, b, b_scale, b_zero_point):
        b = _quantized(b, "b", self._FN)
        self.b_zero_point = np.array(_zero_point(b_zero_point, "b_zero_point", b.dtype, "b", self._FN))
        self.b_scale = np.array(_scale(b_scale, "b_scale", self._FN))
        self.b = np.array(b)  # a private copy: the packed form must stay in sync with it
        for x in (self.b, self.b_scale, self.b_zero_point):
            x.flags.writeable = False
        # float8 b: packed once as float32 for the float path's kernels (a nonzero float8 zero point,
        # which no DequantizeLinear allows, is subtracted per call instead).
        self._float8 = is_float8(b.dtype)
        self._packed = None if self._float8 and np.any(self.b_zero_point) else self._pack()

    def _pack(self):
        b2 = self.b[:, None] if self.b.ndim == 1 else self.b
        K, N = b2.shape[-2:]
        if self._float8:
            return _core.pack_f32(np.ascontiguousarray(to_float32(b2)).reshape(prod(b2.shape[:-2]), K, N))
        return _core.pack_b(np.ascontiguousarray(b2).reshape(prod(b2.shape[:-2]), K, N), self.b.dtype == np.int8)

    def _packed_for_kernels(self):
        """The packed weight, packed again from the kept b when the kernels in use read another
        layout than the one it was packed in (after set_isa, or on another CPU)."""
        if self._packed is not None and (
            self._packed.entry != _core.float8_entry() if self._float8 else self._packed.layout != _core.qgemm_layout()
        ):
            self._packed = self._pack()
        return self._packed

    @property
    def nbytes(self) -> int:
        """Bytes held by the packed weight (kernel layout and column sums, or float32 panels for float8 b)."""
        return self._packed.nbytes if self._packed is not None else self.b.nbytes

    def __call__(self, a, a_scale, a_zero_point, y_scale, y_zero_point, *, numerics: str = "onnxruntime") -> np.ndarray:
        _check_numerics(numerics, self._FN)
        b = (self.b, self.b_scale, self.b_zero_point)
        return _run(a, a_scale, a_zero_point, *b, y_scale, y_zero_point, numerics, self._FN, self._packed_for_kernels())

    def _with_add(self, a, a_scale, a_zero_point, y_scale, y_zero_point, add):
        """The product in numerics "onnxruntime" with a QLinearAdd of a row of codes applied to its output
        (_fast_2d's add), or None where the fast path does not take the call (the caller then runs the two)."""
        b = (self.b, self.b_scale, self.b_zero_point)
        return _fast_2d(a, a_scale, a_zero_point, *b, y_scale, y_zero_point, self._packed_for_kernels(), add)

    def _bind(self, a_scale, a_zero_point, y_scale, y_zero_point):
        """For parameters that stay the same from call to call (a model's initializers): a function of (a,
        add=()) giving what _with_add gives for them, with a's type, rank and K the only checks per call (a
        of a_zero_point's type), or None where _with_add never takes them. The function returns None for an
        a it does not take: the caller then runs the general call."""
        a_dtype = _zero_point_dtype(a_zero_point)
        if a_dtype is None or self.b.ndim != 2 or not _is_int8(self.b.dtype):
            return None
        b = (self.b, self.b_scale, self.b_zero_point)
        call = _fast_2d_call(a_dtype, a_scale, a_zero_point, *b, y_scale, y_zero_point)
        if call is None:
            return None
        K, N = self.b.shape

        def product(a, add=()):
            if type(a) is not np.ndarray or a.dtype is not a_dtype or a.ndim < 2 or a.shape[-1] != K:
                return None
            return _product_2d(a, self._packed_for_kernels(), N, call, add)

        return product

    def __repr__(self) -> str:
        return (
            f"QLinearMatMul(b: {self.b.dtype} {self.b.shape}, b_scale: {self.b_scale.dtype} {self.b_scale.shape}, "
            f"packed {self.nbytes} bytes)"
        )


def _check_numerics(numerics, fn):
    if numerics not in NUMERICS:
        raise ValueError(f"{fn}: numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")


def _run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, numerics, fn, packed_b):
    """The call after b and b_zero_point are validated: the fast path when it applies; else validate
    the rest, normalize (_Problem) and run the integer or the float path."""
    if numerics == "onnxruntime":
        y = _fast_2d(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, packed_b)
        if y is None and packed_b is None:
            y = _fast_batched(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
        if y is not None:
            return y
    if _foldable(a, b, (a_scale, a_zero_point, y_scale, y_zero_point)):
        # a [..., M, K] times a matrix b with a and y per tensor: one product of all a's rows, as
        # numpy.matmul's result is (each output is the same sum; the kernels then see every row at
        # once, not a batch of M-row products each streaming b: 8 x 12 x 384 by 384 x 384 2.5x faster)
        rows = a.reshape(prod(a.shape[:-1]), a.shape[-1])
        y = _run(rows, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, numerics, fn, packed_b)
        return y.reshape(a.shape[:-1] + (b.shape[1],))
    a, a_zero_point, y_zero_point = _operand_dtypes(a, a_zero_point, y_zero_point, fn)
    a_scale, b_scale, y_scale = _scales(a_scale, b_scale, y_scale, fn=fn)
    problem = _Problem(
        a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, fn=fn, packed_b=packed_b
    )
    y = _float_path(problem, numerics) if problem.float8 else _integer_path(problem, numerics)
    return y.reshape(problem.out_shape)


def _foldable(a, b, per_tensor) -> bool:
    """Whether a's leading dimensions fold into its rows: a is an array of rank 3 or more, b a matrix
    of a's K rows, and the a and y parameters one value each, of shape () or (1,) (which mean the same
    for any a; any other case keeps its batch)."""
    return (
        type(a) is np.ndarray
        and a.ndim >= 3
        and np.ndim(b) == 2
        and a.shape[-1] == np.shape(b)[0]
        and all(np.ndim(p) <= 1 and np.size(p) == 1 for p in per_tensor)
    )


# ---------------------------------------------------------------------------------------------------
# Validation


def _quantized(x, name: str, fn: str = _FN) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in QUANT_TYPES:
        raise TypeError(f"{fn}: {name} dtype {x.dtype} is not supported, expected {names(QUANT_TYPES)}")
    if x.ndim == 0:
        raise ValueError(f"{fn}: {name} must have at least 1 dimension, got a 0-d array")
    return x


def _operand_dtypes(a, a_zero_point, y_zero_point, fn: str):
    """a, its zero point and the output's zero point (which selects the output type), validated."""
    a = _quantized(a, "a", fn)
    a_zero_point = _zero_point(a_zero_point, "a_zero_point", a.dtype, "a", fn)
    y_zero_point = _zero_point(y_zero_point, "y_zero_point", None, None, fn)
    return a, a_zero_point, y_zero_point


def _zero_point(x, name: str, dtype, tensor: str | None, fn: str = _FN) -> np.ndarray:
    if not isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(
            f"{fn}: {name} must be a numpy array or scalar with a dtype ({names(QUANT_TYPES)}), got {type(x).__name__}"
        )
    x = np.asarray(x)
    if tensor is None:
        if x.dtype not in QUANT_TYPES:
            raise TypeError(
                f"{fn}: {name} dtype {x.dtype} is not supported, expected {names(QUANT_TYPES)} "
                f"(it selects the output type)"
            )
    elif x.dtype != dtype:
        raise TypeError(f"{fn}: {name} dtype {x.dtype} does not match {tensor} dtype {dtype}")
    return x


def _scale(s, name: str, fn: str) -> np.ndarray:
    """One scale: float32, float16 or bfloat16 (a Python float is float32), finite and nonzero."""
    if type(s) is float:
        s = np.float32(s)
    s = np.asarray(s)
    if s.dtype not in SCALE_TYPES:
        raise TypeError(f"{fn}: {name} dtype {s.dtype} is not supported, expected {names(SCALE_TYPES)}")
    values = s.astype(np.float32)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{fn}: {name} must be finite, got {s.ravel()[~np.isfinite(values.ravel())][0]}")
    if np.any(values == 0):
        raise ValueError(f"{fn}: {name} must be nonzero")
    return s


def _scales(a_scale, b_scale, y_scale, fn: str = _FN):
    labels = ("a_scale", "b_scale", "y_scale")
    arrays = [_scale(s, name, fn) for name, s in zip(labels, (a_scale, b_scale, y_scale))]
    if len({s.dtype for s in arrays}) > 1:
        raise TypeError(
            f"{fn}: the three scales must share one dtype (ONNX type TS), got "
            + ", ".join(f"{n} {s.dtype}" for n, s in zip(labels, arrays))
        )
    return arrays


def _check_pair(scale: np.ndarray, zero_point: np.ndarray, scale_name: str, zp_name: str, fn: str):
    if scale.shape != zero_point.shape:
        raise ValueError(
            f"{fn}: {zp_name} has shape {zero_point.shape}, expected its scale's shape {scale.shape} ({scale_name})"
        )


def _fits(shape, target) -> bool:
    """True if shape broadcasts to exactly target and has no more dimensions."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def batch_index(own_batch, batch) -> np.ndarray:
    """Batch broadcasting as an index map: output matrix i of `batch` takes matrix batch_index[i] of an
    operand whose own batch dimensions are own_batch (int64, contiguous)."""
    own = np.arange(prod(own_batch), dtype=np.int64).reshape(own_batch)
    return np.ascontiguousarray(np.broadcast_to(own, batch).reshape(-1))


class _Problem:
    """One validated call, normalized to the core's batched form [B, M, K] x [B, K, N] -> [B, M, N].

    Built in three steps, each a method below: the operands' shapes (1-D promotion, K, the batch),
    the scales and zero points (reshaped into the output's coordinates), and the batch index maps.
    The products themselves are the functions after the class (_integer_path, _float_path)."""

    def __init__(
        self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, fn: str = _FN, packed_b=None
    ):
        self.fn, self.packed_b = fn, packed_b
        self._shapes(a, b)
        self._parameters(a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point)
        # Batch broadcasting as index maps: output matrix i multiplies a[a_index[i]] by b[b_index[i]].
        self.a_index = self._batch_index(self.a.shape[:-2])
        self.b_index = self._batch_index(self.b.shape[:-2])

    @property
    def float8(self) -> bool:
        """True when an operand or the output is float8: the float path."""
        return any(is_float8(t) for t in (self.a.dtype, self.b.dtype, self.y_dtype))

    # ---------------------------------------------------------------------------------------------
    # Step 1: shapes. 1-D operands promoted as numpy.matmul does, K checked, batches broadcast.

    def _shapes(self, a, b):
        self.a_1d, self.b_1d = a.ndim == 1, b.ndim == 1
        self.a = a[None, :] if self.a_1d else a
        self.b = b[:, None] if self.b_1d else b
        self.M, self.K = self.a.shape[-2:]
        K_b, self.N = self.b.shape[-2:]
        if self.K != K_b:
            raise ValueError(
                f"{self.fn}: inner dimensions differ: a has shape {a.shape} (K={self.K}) "
                f"and b has shape {b.shape} (K={K_b})"
            )
        self.batch = self._broadcast_batch(a, b)
        self.B = prod(self.batch)
        self.out_shape = self.batch + (() if self.a_1d else (self.M,)) + (() if self.b_1d else (self.N,))
        self.internal = self.batch + (self.M, self.N)

    def _broadcast_batch(self, a, b) -> tuple:
        try:
            return tuple(np.broadcast_shapes(self.a.shape[:-2], self.b.shape[:-2]))
        except ValueError:
            raise ValueError(f"{self.fn}: batch dimensions of a {a.shape} and b {b.shape} do not broadcast") from None

    # ---------------------------------------------------------------------------------------------
    # Step 2: scales and zero points. Each pair shares a shape; each parameter is reshaped into the
    # internal coordinates (..., M, N) of the output, without broadcasting it: a per-row parameter
    # becomes (..., M, 1), a per-column one (..., 1, N).

    def _parameters(self, a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point):
        _check_pair(a_scale, a_zero_point, "a_scale", "a_zero_point", self.fn)
        _check_pair(b_scale, b_zero_point, "b_scale", "b_zero_point", self.fn)
        _check_pair(y_scale, y_zero_point, "y_scale", "y_zero_point", self.fn)
        self.a_params = [self._row_param(p) for p in (a_scale, a_zero_point)]
        self.b_params = [self._column_param(p) for p in (b_scale, b_zero_point)]
        self.y_params = [
            self._output_param(p, name) for p, name in ((y_scale, "y_scale"), (y_zero_point, "y_zero_point"))
        ]
        self.y_dtype = y_zero_point.dtype
        self.scale_dtype = a_scale.dtype

    def _row_param(self, p):
        target = self.a.shape[:-1] + (1,)
        if self.a.ndim == 2 and not self.a_1d and p.shape == (self.M,):
            p = p.reshape(self.M, 1)
        elif p.shape == (1,):
            p = p.reshape(())
        if not _fits(p.shape, target):
            raise ValueError(
                f"{self.fn}: a_scale/a_zero_point has shape {p.shape}, expected () or (1,) per tensor"
                + (f", ({self.M},) per row" if self.a.ndim == 2 and not self.a_1d else "")
                + f" or a shape broadcasting to {target} per row"
            )
        return p

    def _column_param(self, p):
        target = self.b.shape[:-2] + (1, self.N)
        if p.shape == (1,):
            p = p.reshape(())
        if not _fits(p.shape, target):
            raise ValueError(
                f"{self.fn}: b_scale/b_zero_point has shape {p.shape}, expected () or (1,) per tensor "
                f"or ({self.N},) or a shape broadcasting to {target} per column"
            )
        return p

    def _output_param(self, p, name):
        if p.shape == (1,):
            p = p.reshape(())
        if not _fits(p.shape, self.out_shape):
            raise ValueError(
                f"{self.fn}: {name} has shape {p.shape}, expected () or (1,) per tensor, or a shape "
                f"that broadcasts to the output shape {self.out_shape}"
            )
        p = p.reshape((1,) * (len(self.out_shape) - p.ndim) + p.shape)
        if self.b_1d:
            p = p[..., None]
        if self.a_1d:
            p = np.expand_dims(p, -2)
        return p

    # ---------------------------------------------------------------------------------------------
    # Step 3: the batch index maps, and views of parameters and operands in the kernels' form.

    def _batch_index(self, own_batch):
        return batch_index(own_batch, self.batch)

    def view3(self, p, dtype):
        """A parameter broadcast over the output as a [B, M, N] view (zero strides where broadcast)."""
        p = np.asarray(p, dtype=dtype)
        return np.broadcast_to(p, self.internal).reshape(self.B, self.M, self.N)

    def operand3(self, x, rows, cols):
        return np.ascontiguousarray(x).reshape(prod(x.shape[:-2]), rows, cols)


# ---------------------------------------------------------------------------------------------------
# Integer operands and output: the fused C++ kernels, one per numerics.


def _integer_path(p: _Problem, numerics):
    a_scale, _ = p.a_params
    b_scale, _ = p.b_params
    y_scale, y_zp = p.y_params
    y = np.empty((p.B, p.M, p.N), p.y_dtype)
    common = _integer_operands(p)
    y_zp3 = p.view3(y_zp, np.int32)
    if numerics == "onnxruntime":
        f32 = [s.astype(np.float32) for s in (a_scale, b_scale, y_scale)]
        multiplier = _multiplier(p.fn, f32, "float32")
        _core.qlinear_matmul_onnxruntime(*common, p.view3(multiplier, np.float32), y, y.dtype == np.int8, y_zp3)
    elif numerics == "onnx-reference":
        multiplier = _multiplier(p.fn, (a_scale, b_scale, y_scale), str(p.scale_dtype))
        _core.qlinear_matmul_onnx_reference(*common, p.view3(multiplier, np.float64), y, y.dtype == np.int8, y_zp3)
    else:
        scales = [p.view3(s, np.float32) for s in (a_scale, b_scale, y_scale)]
        _core.qlinear_matmul_exact(*common, *scales, y, y.dtype == np.int8, y_zp3)
    return y


def _integer_operands(p: _Problem) -> tuple:
    """The operands every integer kernel takes: a, b (packed or not) and their zero points, with the batch maps."""
    _, a_zp = p.a_params
    _, b_zp = p.b_params
    a3 = p.operand3(p.a, p.M, p.K)
    # a constant weight comes packed; otherwise the kernels pack b per call, block by block in cache
    packed = p.packed_b if p.packed_b is not None else p.operand3(p.b, p.K, p.N)
    b_count = len(packed) if p.packed_b is None else packed.count
    a_zp2 = np.broadcast_to(a_zp.astype(np.int32), p.a.shape[:-1] + (1,))
    a_zp2 = np.ascontiguousarray(a_zp2.reshape(len(a3), p.M))
    b_zp2 = np.broadcast_to(b_zp.astype(np.int32), p.b.shape[:-2] + (1, p.N))
    b_zp2 = np.ascontiguousarray(b_zp2.reshape(b_count, p.N))
    return a3, a3.dtype == np.int8, p.a_index, a_zp2, packed, p.b.dtype == np.int8, p.b_index, b_zp2


def _multiplier(fn, scales, precision):
    """a_scale * b_scale / y_scale in the scales' dtype; a ValueError if it overflows."""
    a_scale, b_scale, y_scale = scales
    with np.errstate(over="ignore", under="ignore"):
        multiplier = (a_scale * b_scale) / y_scale
    if not np.all(np.isfinite(multiplier.astype(np.float32))):
        raise ValueError(
            f"{fn}: a_scale * b_scale / y_scale overflows {precision}; use numerics='exact' for such scales"
        )
    return multiplier


# ---------------------------------------------------------------------------------------------------
# Float8 operands or output: dequantize, multiply, quantize.


def _float_path(p: _Problem, numerics):
    if numerics == "exact":
        return _float_path_exact(p)
    return _quantize_output(p, _dequantized_product(p))


def _dequantized_product(p: _Problem):
    """sum_k (a - a_zp)(b - b_zp) in float32, [B, M, N]: float32 FMAs in order of k (C++)."""
    _, a_zp = p.a_params
    _, b_zp = p.b_params
    f32 = np.float32
    a_table = None
    if is_float8(p.a.dtype) and not np.any(a_zp):  # the usual case: C++ looks the codes' values up
        ca, a_table = p.a.view(np.uint8), float32_table(p.a.dtype)
    else:
        ca = to_float32(p.a)
        if np.any(a_zp):  # integer zero points, or a float8 one no DequantizeLinear allows
            ca = ca - a_zp.astype(f32)
    if isinstance(p.packed_b, _core.PackedF32):  # a constant float8 b (QLinearMatMul), zero point 0
        cb = p.packed_b
    else:
        cb = to_float32(p.b)
        if np.any(b_zp):
            cb = cb - b_zp.astype(f32)
        cb = p.operand3(cb, p.K, p.N)
    d = np.empty((p.B, p.M, p.N), f32)
    _core.matmul_f32_sequential(p.operand3(ca, p.M, p.K), p.a_index, cb, p.b_index, d, a_table)
    return d


def _quantize_output(p: _Problem, d):
    """d times a_scale * b_scale, divided by y_scale, to the output type (float8 or integer)."""
    a_scale, _ = p.a_params
    b_scale, _ = p.b_params
    y_scale, y_zp = p.y_params
    f32 = np.float32
    if is_float8(p.y_dtype):
        # In C++ on the thread pool, the same float32 operations in the same order as below, then
        # saturating, nearest even: np.clip(v + y_zp, -max, max).astype(y_dtype).
        params = [p.view3(x, f32) for x in (a_scale, b_scale, y_scale, y_zp)]
        out = _core.float8_output(d, *params, FLOAT8_TYPES.index(p.y_dtype))
        return out.view(p.y_dtype).reshape(p.internal)
    with np.errstate(over="ignore", invalid="ignore"):
        # Scales are per row of a and per column of b: constant along k, so they factor out.
        x = d.reshape(p.internal) * (a_scale.astype(f32) * b_scale.astype(f32))
        v = x / y_scale.astype(f32)
        return _integer_rule(np.rint(v), np.broadcast_to(y_zp, p.internal), p.y_dtype)


def _float_path_exact(p: _Problem):
    """Exact sum and one rounding: scales are constant along k, so
    y = a_scale * b_scale * sum_k (a - a_zp)(b - b_zp) / y_scale + y_zp, where every difference
    is an integer times 2^-e for the float8 type's e; the sum is exact in 128 bits (C++)."""
    total, denominator = _exact_sum(p)
    return _round_exact(p, total, denominator)


def _exact_sum(p: _Problem):
    """sum_k (a - a_zp)(b - b_zp) exactly: Python integers [..., M, N] over a power-of-two denominator."""
    _, a_zp = p.a_params
    _, b_zp = p.b_params
    ea = float8_scale_exponent(p.a.dtype) if is_float8(p.a.dtype) else 0
    eb = float8_scale_exponent(p.b.dtype) if is_float8(p.b.dtype) else 0
    ia = _integerized(p.fn, p.a, a_zp, ea, "a")
    ib = _integerized(p.fn, p.b, b_zp, eb, "b")
    hi = np.empty((p.B, p.M, p.N), np.int64)
    lo = np.empty((p.B, p.M, p.N), np.uint64)
    _core.matmul_i64_exact128(p.operand3(ia, p.M, p.K), p.a_index, p.operand3(ib, p.K, p.N), p.b_index, hi, lo)
    total = hi.reshape(p.internal).astype(object) * (1 << 64) + lo.reshape(p.internal).astype(object)
    return total, 1 << (ea + eb)


def _round_exact(p: _Problem, total, denominator):
    """The exact real value of every output, scaled, rounded once to the output type."""
    a_scale, _ = p.a_params
    b_scale, _ = p.b_params
    y_scale, y_zp = p.y_params
    scale = np.broadcast_to(a_scale, p.internal).astype(np.float64).astype(object) * np.broadcast_to(
        b_scale, p.internal
    ).astype(np.float64).astype(object)
    ys = np.broadcast_to(y_scale, p.internal).astype(np.float64)
    zp = np.broadcast_to(y_zp, p.internal)
    out = np.empty(p.internal, p.y_dtype)
    rounder = _Float8Rounder(p.y_dtype) if is_float8(p.y_dtype) else None
    for idx in np.ndindex(*p.internal):
        value = (Fraction(int(total[idx]), denominator) * Fraction(scale[idx])) / Fraction(float(ys[idx]))
        if rounder is not None:
            out[idx] = rounder(value + Fraction(float(zp[idx])))
        else:
            q = round(value) + int(zp[idx])
            info = np.iinfo(p.y_dtype)
            out[idx] = min(max(q, info.min), info.max)
    return out


def _integerized(fn, q, zp, e, name):
    values = q.astype(np.float64) - zp.astype(np.float64)  # exact: float8 differences need <= 35 bits
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"{fn}: numerics='exact' needs finite operands; {name} or {name}_zero_point "
            "holds NaN or infinity (use the default numerics)"
        )
    return np.ldexp(values, e).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# The fast path of the most common call (2-D int8/uint8 a and b, per-tensor a and y, per-tensor or
# per-column b, numerics "onnxruntime"): the same checks and the same kernel as the general path,
# with a few microseconds of Python instead of a general normalization. Anything else, and every
# invalid input, goes to the general path, which also produces the error messages.

_F32 = np.dtype(np.float32)
_I8 = np.dtype(np.int8)
# The 8-bit integers' numpy scalar types and dtypes. Checks here compare dtypes by identity (a builtin
# dtype is one object; a byte-swapped or annotated equal one just takes the general path): a dtype's
# == is a tenth of a microsecond, and a call of 96 attention products takes 30.
_U8 = np.dtype(np.uint8)
_INT8_SCALARS = {np.int8: _I8, np.uint8: _U8}


_FLOAT32 = struct.Struct("f")


def _is_int8(dtype) -> bool:
    """Whether dtype is int8's or uint8's builtin dtype (then ``dtype is _I8`` tells which)."""
    return dtype is _I8 or dtype is _U8


def _per_tensor_f32(x):
    """A valid (finite, nonzero) per-tensor float32 scale as a Python float, else None."""
    t = type(x)
    if t is np.float32:
        x = float(x)
    elif t is np.ndarray and x.dtype is _F32 and x.size == 1 and x.ndim <= 1:
        x = x.item()
    else:
        return None
    return x if x != 0 and math.isfinite(x) else None


def _per_tensor_int(x, dtype, scale):
    """A per-tensor zero point of the given dtype and of its scale's shape as an int, else None.
    scale is an ndarray or a numpy scalar (_per_tensor_f32 accepted it): both have .shape."""
    t = type(x)
    if t is np.ndarray:
        if x.dtype is dtype and x.size == 1 and x.shape == scale.shape:
            return x.item()
    elif _INT8_SCALARS.get(t) is dtype and scale.shape == ():
        return int(x)
    return None


def _f32(x: float) -> float:
    """x (a double) rounded to float32, to nearest even; +-inf where that overflows. struct's "f"
    packing is the C conversion (it raises instead of giving an infinity), 2-3x faster than numpy's."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _fast_batched(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Batches of matrices of one batch shape, a and b per call (attention's products), every parameter per
    tensor: the integer kernel on [B, M, K] x [B, K, N] without the general path's normalization (its
    Python was most of a call of 96 16 x 32 x 16 products). None where the call is not that case."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray or not _is_int8(b.dtype):
        return None
    parameters = _batched_parameters(
        a.dtype, a_scale, a_zero_point, b.dtype, b_scale, b_zero_point, y_scale, y_zero_point
    )
    return None if parameters is None else _batched(a, b, parameters)


def _batched_parameters(a_dtype, a_scale, a_zero_point, b_dtype, b_scale, b_zero_point, y_scale, y_zero_point):
    """_fast_batched's kernel arguments but a and b, (a_signed, za, b_signed, zb, m, zy, y_signed), for a of
    a_dtype and b of b_dtype (int8 or uint8) with these parameters; None where they are not that case."""
    a_y, sb = _per_tensor_a_y(a_dtype, a_scale, a_zero_point, y_scale, y_zero_point), _per_tensor_f32(b_scale)
    if a_y is None or sb is None:
        return None
    sa, za, sy, zy = a_y
    zb, m = _per_tensor_int(b_zero_point, b_dtype, b_scale), _per_tensor_multiplier(sa, sb, sy)
    if zb is None or m is None:
        return None
    return a_dtype is _I8, za, b_dtype is _I8, zb, m, zy, _zero_point_dtype(y_zero_point) is _I8


def _bind_batched(a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point):
    """For parameters that stay the same from call to call (a model's initializers): a function of (a, b)
    giving what qlinear_matmul gives in numerics "onnxruntime" where _fast_batched takes the call (a and b of
    their zero points' types, ndarrays, b not a matrix), else None; or None where it never does."""
    a_dtype, b_dtype = _zero_point_dtype(a_zero_point), _zero_point_dtype(b_zero_point)
    if a_dtype is None or not _is_int8(b_dtype):
        return None
    parameters = _batched_parameters(
        a_dtype, a_scale, a_zero_point, b_dtype, b_scale, b_zero_point, y_scale, y_zero_point
    )
    if parameters is None:
        return None

    def product(a, b):
        if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype is not a_dtype or b.dtype is not b_dtype:
            return None
        return _batched(a, b, parameters)

    return product


def _batched(a, b, parameters):
    """_fast_batched's product of ndarrays a and b of the types parameters were formed for, or None where
    their shapes are not that case."""
    if a.ndim < 3 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return None
    (M, K), N, count = a.shape[-2:], b.shape[-1], prod(a.shape[:-2])
    if count == 0 or M == 0 or N == 0 or K == 0:
        return None
    a3, b3 = np.ascontiguousarray(a).reshape(count, M, K), np.ascontiguousarray(b).reshape(count, K, N)
    a_signed, za, b_signed, zb, m, zy, y_signed = parameters
    y = _core.qlinear_matmul_batched_per_tensor(a3, a_signed, za, b3, b_signed, zb, m, zy, y_signed)
    return y.reshape(a.shape[:-1] + (N,))


def _zero_point_dtype(zero_point):
    """The dtype of an int8 / uint8 zero point given as an array or a numpy scalar, else None."""
    t = type(zero_point)
    return zero_point.dtype if t is np.ndarray else _INT8_SCALARS.get(t)


def _per_tensor_a_y(a_dtype, a_scale, a_zero_point, y_scale, y_zero_point):
    """(a_scale, a_zero_point, y_scale, y_zero_point) as Python numbers where a (of a_dtype: int8 or uint8) and
    y have one valid scale and zero point each and y's zero point is int8 or uint8, else None."""
    y_dtype = _zero_point_dtype(y_zero_point)
    if not _is_int8(a_dtype) or not _is_int8(y_dtype):
        return None
    sa, sy = _per_tensor_f32(a_scale), _per_tensor_f32(y_scale)
    if sa is None or sy is None:
        return None
    za = _per_tensor_int(a_zero_point, a_dtype, a_scale)
    zy = _per_tensor_int(y_zero_point, y_dtype, y_scale)
    return None if za is None or zy is None else (sa, za, sy, zy)


def _per_tensor_multiplier(sa: float, sb: float, sy: float):
    """f32(f32(a_s * b_s) / y_s) with doubles (the product of two floats is exact in a double, and a double
    quotient rounded to float32 is the float32 quotient: 53 >= 2 * 24 + 2), or None where it overflows."""
    m = _f32(_f32(sa * sb) / sy)
    return m if math.isfinite(m) else None


def _fast_2d(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, packed_b, add=()):
    """a [..., K] times a matrix b, a and y per tensor: a's leading dimensions folded into its rows, as
    _foldable's product (one call, not a recursion through _run: 5 us of a transformer's [8, 16, 384]
    call); None where the call is not that case. add: () or (codes [N] of y's type, product first, (rx,
    ry, k)), a QLinearAdd of the product and a row of codes applied as its blocks are written, and
    optionally three more for a second one on that output with an [M, N] matrix of codes (a residual;
    onnx/_pairs.py)."""
    if type(a) is not np.ndarray or a.ndim < 2 or b.ndim != 2 or not _is_int8(b.dtype) or a.shape[-1] != b.shape[0]:
        return None
    call = _fast_2d_call(a.dtype, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
    if call is None:
        return None
    b_operand = packed_b if packed_b is not None else np.ascontiguousarray(b)  # packed per call, in cache
    return _product_2d(a, b_operand, b.shape[1], call, add)


def _fast_2d_call(a_dtype, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """(the kernel function, its arguments after a and b: a_signed, za, b_signed, zb, m, zy, y_signed) of
    _fast_2d's call for an a of a_dtype and these parameters (b an int8 or uint8 matrix), or None where
    they are not that case: zb and m numbers for a per-tensor b, else int32 and float32 arrays [N]."""
    a_y = _per_tensor_a_y(a_dtype, a_scale, a_zero_point, y_scale, y_zero_point)
    if a_y is None:
        return None
    sa, za, sy, zy = a_y
    N = b.shape[1]
    signs = a_dtype is _I8, b.dtype is _I8, _zero_point_dtype(y_zero_point) is _I8
    sb = _per_tensor_f32(b_scale)
    if sb is not None:
        zb, m = _per_tensor_int(b_zero_point, b.dtype, b_scale), _per_tensor_multiplier(sa, sb, sy)
        if zb is None or m is None:
            return None
        return _core.qlinear_matmul_2d_per_tensor, (signs[0], za, signs[1], zb, m, zy, signs[2])
    if not (
        type(b_scale) is np.ndarray
        and b_scale.dtype == _F32
        and b_scale.shape == (N,)
        and type(b_zero_point) is np.ndarray
        and b_zero_point.shape == (N,)
        and b_zero_point.dtype == b.dtype
        and np.isfinite(b_scale).all()
        and b_scale.all()
    ):
        return None
    with np.errstate(over="ignore", under="ignore"):
        multiplier = (np.float32(sa) * b_scale) / np.float32(sy)
    if not np.isfinite(multiplier).all():
        return None
    b_zp = b_zero_point.astype(np.int32)
    return _core.qlinear_matmul_2d_onnxruntime, (signs[0], za, signs[1], b_zp, multiplier, zy, signs[2])


def _product_2d(a, b_operand, N: int, call, add=()):
    """_fast_2d's product of an ndarray a [..., K] (of the type call was formed for, ndim >= 2) and b's
    operand (packed, or the contiguous matrix) with N columns."""
    function, (a_signed, za, b_signed, zb, m, zy, y_signed) = call
    a_operand = np.ascontiguousarray(a if a.ndim == 2 else a.reshape(prod(a.shape[:-1]), a.shape[-1]))
    y = function(a_operand, a_signed, za, b_operand, b_signed, zb, m, zy, y_signed, *add)
    return y if a.ndim == 2 else y.reshape(a.shape[:-1] + (N,))


def _integer_rule(rounded, zp, dtype):
    """Integer output of the float path: round half to even (already applied), + zero point, saturate; NaN -> zero point."""
    info = np.iinfo(dtype)
    rounded = np.where(np.isnan(rounded), 0.0, rounded)
    return np.clip(rounded + zp.astype(np.float64), info.min, info.max).astype(dtype)


class _Float8Rounder:
    """Rounds an exact Fraction to a float8 type: nearest, ties to even, saturating to the largest finite value."""

    def __init__(self, dtype):
        codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
        finite = np.isfinite(codes) & (codes >= 0) & ~np.signbit(codes)
        order = np.argsort(codes[finite], kind="stable")
        self.values = [Fraction(float(v)) for v in codes[finite][order]]
        self.codes = np.arange(256)[finite][order]
        self.dtype = dtype

    def __call__(self, value: Fraction):
        magnitude = abs(value)
        i = bisect.bisect_left(self.values, magnitude)
        if i >= len(self.values):
            chosen = len(self.values) - 1  # saturate
        elif self.values[i] == magnitude or i == 0:
            chosen = i
        else:
            below, above = self.values[i - 1], self.values[i]
            if magnitude - below < above - magnitude:
                chosen = i - 1
            elif magnitude - below > above - magnitude:
                chosen = i
            else:
                chosen = i - 1 if self.codes[i - 1] % 2 == 0 else i
        magnitude = float(self.values[chosen])
        return np.array(-magnitude if value < 0 else magnitude).astype(self.dtype)
