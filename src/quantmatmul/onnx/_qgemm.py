"""onnx/_qgemm.py: com.microsoft QGemm, the operator ONNX Runtime's quantize_static writes for a Gemm (and its optimizer fuses a QDQ Gemm into), as ONNX Runtime's CPU kernel computes it.

``QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None;
alpha=1.0, transA=0, transB=0)``: with ``A'`` = A or its transpose ``[M, K]``, ``B'`` = B or its
transpose ``[K, N]``,

    acc[m, n] = C[m, n] + sum_k (A'[m, k] - a_zero_point) * (B'[k, n] - b_zero_point[n])   (int32, wrapping)
    scale[n]  = f32(f32(alpha * a_scale) * b_scale[n])              then f32(scale[n] / y_scale) if y given
    y[m, n]   = f32(f32(acc[m, n]) * scale[n])                                   (float32 output), or
    y[m, n]   = round_half_even(clamp(f32(f32(acc) * scale[n]), qmin - zp, qmax - zp)) + zp   (8-bit)

(ORT's QGemm kernel: MLAS's integer GEMM accumulating into the broadcast C, then its scale-bias or
requantize output processor, the scales multiplied in that order in float32). C (int32) is
unidirectionally broadcast to ``[M, N]``: its scale is ``alpha * a_scale * b_scale`` with zero point 0
by the operator's definition. a's scale and zero point per tensor; b's per tensor or per column
(``[N]``); y's per tensor, both given (8-bit output, y_zero_point's type) or neither (float32).
uint8 or int8 A and B in any combination (ONNX Runtime registers uint8 A with uint8 / int8 B, and
int8 with int8). The sums are the int8 GEMM kernels' (a constant B packed once by the session); an 8-bit
output with C per column or per tensor (or none) is requantized in their own epilogue, C added to the
sums there (the same float32 operations, one C++ call instead of a dozen numpy passes).
"""

from __future__ import annotations

import numpy as np

from .. import _core
from .._dtypes import names
from ..qlinear import _fits
from ._integer import _integer_operand, _IntegerOperand, _matmul_integer

_FN = "QGemm"
_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
_F32 = np.dtype(np.float32)


def qgemm_weight(B, b_zero_point, trans_b: bool) -> _IntegerOperand:
    """B' (B transposed where trans_b) with its zero point, checked and packed once: a constant B."""
    B = _matrix(B, "B")
    return _integer_operand("b", np.ascontiguousarray(B.T) if trans_b else B, b_zero_point, _FN, pack=True)


def qgemm(
    A,
    a_scale,
    a_zero_point,
    B,
    b_scale,
    b_zero_point,
    C=None,
    y_scale=None,
    y_zero_point=None,
    *,
    alpha: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
    weight: _IntegerOperand | None = None,
) -> np.ndarray:
    """com.microsoft QGemm as ONNX Runtime computes it (the module's docstring). weight: B' from
    qgemm_weight (B itself then unused)."""
    A = _matrix(A, "A")
    if A.dtype not in _INT8:
        raise TypeError(f"{_FN}: A must be int8 or uint8, got {A.dtype}")
    _integer_operand("a", A.T if trans_a else A, a_zero_point, _FN)  # (a's zero point against A' first)
    b = weight if weight is not None else qgemm_weight(B, b_zero_point, trans_b)
    call = QGemmCall(b, a_scale, a_zero_point, b_scale, C, y_scale, y_zero_point, alpha=alpha, trans_a=trans_a)
    return call(A)


class QGemmCall:
    """One QGemm's parameters other than A, checked once (qgemm's checks, whose these are): B' from qgemm_weight,
    a's scale and zero point, b's scale, C, y's scale and zero point, alpha and transA; calls take A. The
    session holds one per node whose other inputs are all initializers: a call then checks A alone and hands
    the kernels arrays formed for the last A's row count."""

    def __init__(self, weight, a_scale, a_zero_point, b_scale, C, y_scale, y_zero_point, *, alpha=1.0, trans_a=False):
        b = weight
        N = b.x.shape[1]
        a_zp = np.asarray(a_zero_point) if a_zero_point is not None else None
        if a_zp is not None and a_zp.dtype not in _INT8:
            raise TypeError(f"{_FN}: a_zero_point must be int8 or uint8, got {a_zp.dtype}")
        if a_zp is not None and a_zp.size != 1:
            raise ValueError(f"{_FN}: a_zero_point must be per tensor (one element), got shape {a_zp.shape}")
        if b.zp.ndim not in (0, 1):
            raise ValueError(f"{_FN}: b_zero_point must be per tensor or per column [N], got shape {b.zp.shape}")
        a_s = _scale(a_scale, "a_scale")
        b_s = _scale(b_scale, "b_scale", N)
        if (b_s.size == 1) != (b.zp.size == 1) or (b_s.size > 1 and b_s.shape != b.zp.shape):
            raise ValueError(f"{_FN}: b_scale {np.shape(b_scale)} and b_zero_point {b.zp.shape} must have one shape")
        quantized = y_scale is not None or y_zero_point is not None
        if quantized and (y_scale is None or y_zero_point is None):
            raise ValueError(f"{_FN}: y_scale and y_zero_point come together (8-bit output) or not at all (float32)")
        if C is not None:
            C = np.asarray(C)
            if C.dtype != np.int32:
                raise TypeError(f"{_FN}: C must be int32, got {C.dtype}")
        with np.errstate(over="ignore", under="ignore"):
            scale = (np.float32(alpha) * a_s) * b_s  # float32, in the kernel's order
            if quantized:
                scale = scale / _scale(y_scale, "y_scale")
        zp = None
        if quantized:
            zp = np.asarray(y_zero_point)
            if zp.dtype not in _INT8 or zp.size != 1 or zp.ndim > 1:
                raise TypeError(f"{_FN}: y_zero_point must be one int8 or uint8 value, got {zp.dtype} {zp.shape}")
            if not np.all(np.isfinite(scale)):
                raise ValueError(f"{_FN}: alpha * a_scale * b_scale / y_scale overflows float32")
        self._b, self._a_zp, self._C, self._scale, self._zp, self._trans_a = b, a_zp, C, scale, zp, bool(trans_a)
        self._a_zp_int32 = np.zeros((), np.int32) if a_zp is None else a_zp.astype(np.int32).reshape(())
        self._kept = None  # the kernels' arrays for the last row count (_fused_operands)

    def __call__(self, A) -> np.ndarray:
        A = _matrix(A, "A")
        if A.dtype not in _INT8:
            raise TypeError(f"{_FN}: A must be int8 or uint8, got {A.dtype}")
        if self._a_zp is not None and self._a_zp.dtype != A.dtype:
            raise TypeError(f"{_FN}: a_zero_point dtype {self._a_zp.dtype} does not match a dtype {A.dtype}")
        b, C = self._b, self._C
        a_x = np.ascontiguousarray(A.T) if self._trans_a else A
        (M, K), (K_b, N) = a_x.shape, b.x.shape
        if K != K_b:
            raise ValueError(f"{_FN}: A' is {M}x{K} and B' {K_b}x{N}: inner dimensions differ")
        if C is not None and not _fits(C.shape, (M, N)):  # unidirectional broadcasting
            raise ValueError(f"{_FN}: C has shape {C.shape}, which does not broadcast to [M, N] = [{M}, {N}]")
        a = _IntegerOperand(a_x, self._a_zp_int32)
        if self._zp is not None:
            fused = self._requantized_by_the_kernels(a, M, K, N)
            if fused is not None:
                return fused
        acc = _matmul_integer(a, b)  # int32 [M, N], wrapping
        if C is not None:
            with np.errstate(over="ignore"):
                acc = np.add(acc, C, dtype=np.int32)  # int32 addition wraps, as the kernel's
        with np.errstate(over="ignore", under="ignore"):
            values = acc.astype(np.float32) * self._scale
        if self._zp is None:
            return values
        info, z = np.iinfo(self._zp.dtype), int(self._zp.reshape(-1)[0])
        clamped = np.clip(values, np.float32(info.min - z), np.float32(info.max - z))
        return (np.rint(clamped).astype(np.int32) + z).astype(self._zp.dtype)

    def _requantized_by_the_kernels(self, a: _IntegerOperand, M: int, K: int, N: int) -> np.ndarray | None:
        """The 8-bit output in the int8 GEMM's own epilogue (ONNX Runtime's requantization there: f32(acc) *
        scale[n], clamped to [qmin - zp, qmax - zp], rounded half to even, + zp; the same operations as the
        module's formula), C added to the sums as a column bias: for a packed B and a C that is per column or
        per tensor (or none). None otherwise (the numpy epilogue)."""
        b, C = self._b, self._C
        if b.packed is None or M == 0 or K == 0 or N == 0 or (C is not None and C.size not in (1, N)):
            return None
        if C is not None and C.size == N and C.ndim == 2 and C.shape[0] != 1:
            return None  # ([N, 1] with N = 1 is per tensor: size 1 above)
        kept = self._kept
        if kept is None or kept[0] != (M, int(a.zp)):
            index = np.zeros(1, np.int64)
            a_zp = np.full((1, M), a.zp, np.int32)
            b_zp = np.ascontiguousarray(np.broadcast_to(b.zp.astype(np.int32), (1, N)))
            scale = np.broadcast_to(self._scale.astype(np.float32), (1, M, N))
            zp = np.broadcast_to(self._zp.astype(np.int32).reshape(()), (1, M, N))
            bias = None if C is None else np.ascontiguousarray(np.broadcast_to(C.reshape(-1), (1, N)))
            kept = self._kept = ((M, int(a.zp)), index, a_zp, b_zp, scale, zp, bias)
        _, index, a_zp, b_zp, scale, zp, bias = kept
        y = np.empty((1, M, N), self._zp.dtype)
        operands = (np.ascontiguousarray(a.x)[None], a.x.dtype == np.int8, index, a_zp)
        operands += (b.packed, b.x.dtype == np.int8, index, b_zp)
        tail = (scale, y, y.dtype == np.int8, zp)
        if bias is None:
            _core.qlinear_matmul_onnxruntime(*operands, *tail)
        else:
            _core.qlinear_matmul_onnxruntime_bias(*operands, bias, *tail)
        return y[0]


def _matrix(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{_FN}: {name} must be a matrix (2-D), got shape {x.shape}")
    return x


def _scale(s, name: str, n: int | None = None) -> np.ndarray:
    """A float32 scale: one value, or for b_scale one per column ([N]); finite."""
    s = np.asarray(s)
    if s.dtype != _F32:
        raise TypeError(f"{_FN}: {name} must be float32, got {names([s.dtype])}")
    if not (s.size == 1 and s.ndim <= 1) and not (n is not None and s.shape == (n,)):
        expected = "one value" + (f" or one per column ([{n}])" if n is not None else "")
        raise ValueError(f"{_FN}: {name} must be {expected}, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{_FN}: {name} must be finite")
    return s.reshape(-1) if s.size > 1 else s.reshape(())
