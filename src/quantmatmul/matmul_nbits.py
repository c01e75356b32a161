"""matmul_nbits.py: ONNX Runtime's com.microsoft MatMulNBits (bits 2..8, any block size): validation, dispatch and the numpy compute."""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from . import _core
from ._dtypes import SCALE_TYPES, names
from .nbits_layout import packed_size, unpack_nbits

__all__ = ["matmul_nbits", "MatMulNBits", "dequantize_nbits", "ACCURACY_LEVELS"]

ACCURACY_LEVELS = (0, 1, 2, 3, 4)

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_CHUNK = 1 << 18  # elements of dequantized weight held at once (1 MiB of float32)
_TINY_AMAX = np.float32(127.0) / np.finfo(np.float32).max  # below it ORT's 127 / max|a| overflows


def _unpacked(packed) -> _Held:
    """The codes, scales and zero points a packed weight holds, exactly as they were packed."""
    scales, zero_points = _core.unpack_nbits_floats(packed)
    return _Held(_core.unpack_nbits_weight(packed), scales, zero_points)


class _Held(NamedTuple):
    """The weight as the kernels take it: its codes [N, row_bytes], float32 scales and zero points
    (uint8 or float32) [N, k_blocks], or all three None and `packed`, the weight packed for the
    kernels in use (_core.pack_nbits_weight), which then holds them all."""

    codes: np.ndarray | None
    scales: np.ndarray | None
    zero_points: np.ndarray | None
    packed: object = None


def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0) -> np.ndarray:
    """Block-quantized matrix product, ONNX Runtime's ``com.microsoft::MatMulNBits`` (opset 1).

    ``Y = A @ W.T + bias`` where ``W[n, k] = (q[n, k] - zero_point[n, b]) * scale[n, b]``, ``q`` the
    ``bits``-wide unsigned code of B and ``b = k // block_size`` (or ``g_idx[k]``) its block.

    Parameters
    ----------
    A : array of float32, float16 or bfloat16 (ml_dtypes), shape ``[..., K]`` (1-D allowed).
    B : uint8 array ``[N, k_blocks, blob_size]``, ``k_blocks = ceil(K / block_size)``,
        ``blob_size = block_size * bits / 8``. Each row of B is one LSB-first bitstream of
        ``k_blocks * block_size`` codes (ONNX Runtime's layout for 2, 4 and 8 bits; the same rule
        for 3, 5, 6 and 7, which ONNX Runtime rejects). Codes past K in the last block are ignored,
        whatever they hold.
    scales : ``[N, k_blocks]`` or flat ``[N * k_blocks]``, A's dtype. Any sign.
    zero_points : optional. uint8, packed like B along the blocks with each row padded on its own:
        ``[N, ceil(k_blocks * bits / 8)]`` (or that many bytes flat); or unpacked in the scales'
        dtype, ``[N, k_blocks]`` (or flat), fractional values allowed. Default ``2**(bits - 1)``.
    g_idx : optional integer array ``[K]`` or ``[k_blocks * block_size]`` (ONNX: int32), the block
        of each k (act-order); values in ``[0, k_blocks)``. Codes are not permuted.
    bias : optional ``[N]``, A's dtype.
    K, N : int, the logical weight is ``K x N``.
    bits : int in 2..8 (default 4).
    block_size : int, a power of two >= 16 (no upper limit).
    accuracy_level : {0, 1, 2, 3, 4}
        The least precision the product may be computed in (ONNX Runtime's attribute):

        * 0, 1: float32. W is dequantized exactly as :func:`dequantize_nbits` does
          (``float32(q - zero_point) * scale``), A is widened to float32, float32 products and sums.
        * 2: float16 operands: A and the float32 W are rounded to float16 (round to nearest even),
          products accumulated in float32. A and W must lie in float16's range.
        * 3: bfloat16 operands, likewise, accumulated in float32.
        * 4: int8 A, as ONNX Runtime's CompInt8 kernels: every row of A is cut into blocks of
          ``block_size`` along K; per block ``scale_a = max|a| / 127`` and
          ``qa = round_half_even(a * (127 / max|a|))`` in float32, in that order (ORT's
          ``QuantizeARow_CompInt8``). Per block the integer dot product ``sum qa * q`` is exact;
          ``Y = sum_b scale_a * scale_b * dot_b - sum_b (scale_a * sum qa) * scale_b * zp_b + bias``
          (the zero point enters through the block sums), scaled and summed in float32. With a
          non-trivial g_idx the scales change inside an A block, so the dequantized int8 A
          (``scale_a * qa`` in float32) multiplies W as at level 0 instead. Blocks whose
          ``max|a|`` is below ``127 / FLT_MAX`` (where ORT's ``127 / max|a|`` overflows) use the
          exact ratio ``a * 127 / max|a|``.

        The result is rounded once to A's dtype (round to nearest even).

    Returns
    -------
    numpy.ndarray of A's dtype, shape ``A.shape[:-1] + (N,)``.

    Notes
    -----
    Error bounds: against the exact real value ``Y*`` of the formula above (inputs as given), every output
    satisfies ``|Y - Y*| <= u_out * |Y*| + (1 + u_out) * E + eta_out`` with ``u_out`` the unit
    roundoff of A's dtype (2**-24, 2**-11, 2**-8 for float32, float16, bfloat16), ``eta_out`` half
    its smallest subnormal, ``g(n) = n * 2**-24 / (1 - n * 2**-24)``,
    ``T = sum_k |A_k| * |scale_kn| * (|q_kn| + |zp_kn|) + |bias_n|`` and

    * level 0, 1: ``E = g(2K + 16) * T``;
    * level 2, 3: ``E = (2.01 u_c + 1.01 g(2K + 16)) * T + 1.01 eta_c * (sum_k |A_k| + sum_k |W*_kn|)``
      with ``u_c = 2**-11, eta_c = 2**-25`` (float16) or ``u_c = 2**-8, eta_c = 2**-126`` (bfloat16,
      plus ``(2K + 16) * 2**-126``: kernels that flush denormals, as AVX512-BF16's vdpbf16ps does);
    * level 4: ``E = (1/254 + g(2K + 24)) * R`` with
      ``R = sum_b max(max|A_b|, 2**-100) * sum_{k in b} |scale_kn| * (|q_kn| + |zp_kn|) + |bias_n|``.

    These hold for any summation order (they are what later native kernels must meet too); the
    derivation and measured errors are in docs/matmul_nbits.md. Non-finite inputs give non-finite
    outputs.

    Examples
    --------
    >>> import numpy as np, quantmatmul
    >>> from quantmatmul.nbits_layout import pack_nbits
    >>> codes = np.array([[8, 9, 10, 11] + [0] * 12, [7] * 16])  # N=2 rows of one 16-code block (K=4: 12 ignored)
    >>> B = pack_nbits(codes, 4).reshape(2, 1, 8)
    >>> scales = np.array([[0.5], [2.0]], np.float32)
    >>> quantmatmul.matmul_nbits(np.ones(4, np.float32), B, scales, K=4, N=2, bits=4, block_size=16)
    array([ 3., -8.], dtype=float32)
    """
    fn = "matmul_nbits"
    K, N, bits, block_size = _layout_ints(fn, K, N, bits, block_size)
    level = _level(fn, accuracy_level)
    A = _activations(fn, A, K, None)
    w = _Weights(fn, B, scales, zero_points, g_idx, K, N, bits, block_size, A.dtype)
    return _apply(A, w, _bias(fn, bias, A.dtype, N), level, _Held(w.B, w.scales, w.kernel_zero_points))


class MatMulNBits:
    """MatMulNBits with a constant weight, validated and prepared once: the way models run it.

    ``w = MatMulNBits(B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
    accuracy_level=0)`` takes exactly :func:`matmul_nbits`'s weight arguments (A's dtype is the
    scales' dtype); ``w(A)`` returns what ``matmul_nbits(A, B, scales, ...)`` returns, bit for bit
    (a NaN's sign aside: from infinities in A and a NaN scale the two may combine NaNs in another order).
    The codes are copied once, and scales and zero points are held as float32 [N, k_blocks], so a
    call does no weight validation or conversion. At accuracy levels 4 and 0/1 (without g_idx) the
    codes are held instead packed for the kernels in use where they read a packed layout
    (docs/matmul_nbits.md, "Level 4 on a packed weight": the codes' bytes for 2-, 4- and 8-bit
    codes, plus 5 bytes per block and column, 8 with float zero points), packed again if
    ``set_isa`` later selects kernels that read another layout. ``MatMulNBits.from_float(W,
    bits=..., block_size=..., method=...)`` quantizes a float [K, N] weight with
    :func:`quantize_nbits` first.

    Examples
    --------
    >>> import numpy as np, quantmatmul
    >>> W = np.linspace(-1, 1, 64 * 8, dtype=np.float32).reshape(64, 8)
    >>> w = quantmatmul.MatMulNBits.from_float(W, bits=4, block_size=32)
    >>> A = np.ones((2, 64), np.float32)
    >>> bool(np.allclose(w(A), A @ W, atol=0.5))
    True
    """

    _FN = "MatMulNBits"

    def __init__(self, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0):
        fn = self._FN
        K, N, bits, block_size = _layout_ints(fn, K, N, bits, block_size)
        self.accuracy_level = _level(fn, accuracy_level)
        self.dtype = _float_array(fn, "scales", scales).dtype
        self._weights = _Weights(fn, B, scales, zero_points, g_idx, K, N, bits, block_size, self.dtype)
        bias = _bias(fn, bias, self.dtype, N)
        self._bias = None if bias is None else bias.copy()  # private, as the weight's arrays below
        self.K, self.N, self.bits, self.block_size = K, N, bits, block_size
        # What is held of the weight, replaced as one tuple (calls on other threads see one state):
        # (_Held: the codes, scales and zero points, or the weight packed for a kernel layout; that
        # layout's name or None). At levels 0, 1 and 4 without g_idx the weight is packed once for
        # the layout the active kernel entry reads at that level and then held only packed (as ONNX
        # Runtime prepacks: the packed form holds the codes, scales and zero points exactly); set_isa
        # to an entry of another layout (or none) packs again, or restores the arrays, from it.
        w = self._weights
        codes = np.array(w.B, order="C")  # a private contiguous copy
        # Private copies: later changes to the caller's arrays do not reach the held weight.
        self._held = (_Held(codes, np.array(w.scales, order="C"), np.array(w.kernel_zero_points, order="C")), None)
        w.B = w.scales = w.kernel_zero_points = None  # held in _held
        self._for_kernels()

    def _for_kernels(self) -> _Held:
        """The weight for a call now: packed (re)made for the layout the active entry reads at this
        accuracy level (csrc/matmul_nbits.h, NBitsLayout) where it has one that takes this weight, else
        the codes, scales and zero points."""
        held, layout = self._held
        w = self._weights
        if w.g_idx is not None:
            return held
        current = _core.nbits_weight_layout(self.accuracy_level)
        if current != layout:
            if held.packed is not None:
                held = _unpacked(held.packed)
            packed = None if current is None else _core.pack_nbits_weight(
                held.codes, w.K, w.bits, w.block_size, held.scales, held.zero_points, self.accuracy_level)
            if packed is not None:
                held = _Held(None, None, None, packed)
            self._held = (held, current)
        return held

    @property
    def _packed(self):
        """The weight packed for the kernels (levels 0, 1 and 4), or None."""
        return self._held[0].packed

    def __getstate__(self):
        """Pickling and copy.deepcopy: the codes, scales and zero points as given (from the packed form
        where only that is held); the copy packs them again for its own kernels on first use."""
        state = self.__dict__.copy()
        held = self._held[0]
        state["_held"] = (held if held.packed is None else _unpacked(held.packed), None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    @classmethod
    def from_float(cls, W, *, bits=4, block_size=32, method="rtn", symmetric=False, bias=None, accuracy_level=0):
        """Quantize a float [K, N] weight with :func:`quantize_nbits` and hold the result."""
        from .quantize_nbits import quantize_nbits

        q = quantize_nbits(W, bits=bits, block_size=block_size, symmetric=symmetric, method=method)
        return cls(*q.tensors(), bias, **q.attributes(), accuracy_level=accuracy_level)

    @property
    def nbytes(self) -> int:
        """Bytes held: the codes, float32 scales and the zero points (uint8, or float32 when given as floats),
        or at levels 0, 1 and 4 instead the weight packed for the kernels (codes, per-block scales and zero
        points), and the bias."""
        held = self._held[0]
        nbytes = held.packed.nbytes if held.packed is not None else sum(
            x.nbytes for x in (held.codes, held.scales, held.zero_points))
        return nbytes + (0 if self._bias is None else self._bias.nbytes)

    def __call__(self, A) -> np.ndarray:
        held = self._for_kernels()  # this call's: another thread's set_isa may change what is held
        return _apply(_activations(self._FN, A, self.K, self.dtype), self._weights, self._bias, self.accuracy_level,
                      held)

    def __repr__(self) -> str:
        return (f"MatMulNBits(K={self.K}, N={self.N}, bits={self.bits}, block_size={self.block_size}, "
                f"accuracy_level={self.accuracy_level}, dtype={self.dtype})")


def _level(fn, accuracy_level):
    if isinstance(accuracy_level, bool) or not isinstance(accuracy_level, (int, np.integer)) \
            or int(accuracy_level) not in ACCURACY_LEVELS:
        raise ValueError(f"{fn}: accuracy_level must be one of 0, 1, 2, 3, 4, got {accuracy_level!r}")
    return int(accuracy_level)


def _activations(fn, A, K, dtype):
    A = _float_array(fn, "A", A)
    if dtype is not None and A.dtype != dtype:
        raise TypeError(f"{fn}: A dtype {A.dtype} does not match the weight's scales dtype {dtype}")
    if A.ndim == 0:
        raise ValueError(f"{fn}: A must have at least 1 dimension, got a 0-d array")
    if A.shape[-1] != K:
        raise ValueError(f"{fn}: A has shape {A.shape}, its last dimension must be K={K}")
    return A


def _bias(fn, bias, dtype, N):
    if bias is None:
        return None
    bias = _float_array(fn, "bias", bias)
    if bias.dtype != dtype:
        raise TypeError(f"{fn}: bias dtype {bias.dtype} does not match A dtype {dtype}")
    if bias.shape != (N,):
        raise ValueError(f"{fn}: bias has shape {bias.shape}, expected ({N},)")
    return bias


def _apply(A, w, bias, level, held):
    """The product for validated operands: A [..., K] times the weight (w: its shape and g_idx; held:
    its codes, scales and zero points, or the weight packed for the kernels), in A's dtype."""
    out_shape = A.shape[:-1] + (w.N,)
    a2 = A.reshape(-1, w.K)
    if A.dtype == _F32 and w.g_idx is None and level in (0, 1, 4) and a2.shape[0]:  # all in C++: no numpy warnings
        y = _product_int8(a2, w, held, bias) if level == 4 else _product_float(a2, w, held, bias, None)
        return y.reshape(out_shape)
    with np.errstate(all="ignore"):
        if a2.shape[0] == 0:
            y = np.zeros((0, w.N), _F32)
        elif level == 4:
            y = _product_int8(a2, w, held, bias)
        else:
            y = _product_float(a2, w, held, bias, {2: np.float16, 3: _BF16}.get(level))
        return y.astype(A.dtype).reshape(out_shape)


def dequantize_nbits(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size) -> np.ndarray:
    """The float32 weight ``W[k, n] = float32(q[n, k] - zero_point) * scale`` of a MatMulNBits node, shape ``[K, N]``.

    The code minus the zero point is one float32 subtraction (exact for uint8 zero points), times
    the scale widened to float32: one rounding, as ONNX Runtime's MLAS dequantizes. Arguments as in
    :func:`matmul_nbits`; scales may be float32, float16 or bfloat16 and a float zero point must
    have the scales' dtype.

    Examples
    --------
    >>> import numpy as np, quantmatmul
    >>> from quantmatmul.nbits_layout import pack_nbits
    >>> B = pack_nbits(np.array([[8, 9, 10, 11] + [0] * 12]), 4).reshape(1, 1, 8)
    >>> quantmatmul.dequantize_nbits(B, np.array([[0.5]], np.float32), K=4, N=1, bits=4, block_size=16).ravel()
    array([0. , 0.5, 1. , 1.5], dtype=float32)
    """
    fn = "dequantize_nbits"
    K, N, bits, block_size = _layout_ints(fn, K, N, bits, block_size)
    w = _Weights(fn, B, scales, zero_points, g_idx, K, N, bits, block_size, None)
    out = np.empty((K, N), _F32)
    with np.errstate(all="ignore"):
        for n0, n1 in _chunks(N, w.chunk_rows()):
            out[:, n0:n1] = w.dequantize(n0, n1).T
    return out


# ---------------------------------------------------------------------------------------------------
# Validation


def _layout_ints(fn, K, N, bits, block_size):
    for name, value in (("K", K), ("N", N), ("bits", bits), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{fn}: {name} must be an integer, got {value!r}")
    K, N, bits, block_size = int(K), int(N), int(bits), int(block_size)
    if not 2 <= bits <= 8:
        raise ValueError(f"{fn}: bits must be in 2..8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{fn}: block_size must be a power of two >= 16, got {block_size}")
    if K < 1 or N < 1:
        raise ValueError(f"{fn}: K and N must be positive, got K={K}, N={N}")
    return K, N, bits, block_size


def _float_array(fn, name, x):
    x = np.asarray(x)
    if x.dtype not in SCALE_TYPES:
        raise TypeError(f"{fn}: {name} dtype {x.dtype} is not supported, expected {names(SCALE_TYPES)}")
    return x


class _Weights:
    """B, its scales and zero points and g_idx, validated and normalized; dequantizes rows of W on demand."""

    def __init__(self, fn, B, scales, zero_points, g_idx, K, N, bits, block_size, a_dtype):
        self.K, self.N, self.bits, self.block_size = K, N, bits, block_size
        kb = self.k_blocks = -(-K // block_size)
        self.padded_K = kb * block_size
        layout = f"K={K}, bits={bits}, block_size={block_size}"

        B = np.asarray(B)
        if B.dtype != np.uint8:
            raise TypeError(f"{fn}: B dtype {B.dtype} is not supported, expected uint8")
        blob = block_size * bits // 8
        if B.shape != (N, kb, blob):
            raise ValueError(f"{fn}: B has shape {B.shape}, expected {(N, kb, blob)} for {layout}")
        self.B = B.reshape(N, kb * blob)

        scales = _float_array(fn, "scales", scales)
        if a_dtype is not None and scales.dtype != a_dtype:
            raise TypeError(f"{fn}: scales dtype {scales.dtype} does not match A dtype {a_dtype}")
        if scales.shape not in ((N, kb), (N * kb,)):
            raise ValueError(f"{fn}: scales has shape {scales.shape}, expected {(N, kb)} or ({N * kb},) "
                             f"for N={N}, K={K}, block_size={block_size}")
        self.scales = scales.reshape(N, kb).astype(_F32, copy=False)  # may be the caller's: never written

        # Zero points as the kernels take them, [N, k_blocks]: integer ones as uint8 (a quarter of
        # the bytes of float32), float ones as float32.
        if zero_points is None:
            self.kernel_zero_points = np.full((N, kb), 1 << (bits - 1), np.uint8)
            self.integer_zero_points = True
        else:
            zp = np.asarray(zero_points)
            if zp.dtype == np.uint8:
                row = packed_size(kb, bits)
                if zp.shape not in ((N, row), (N * row,)):
                    hint = (" (uint8 zero points are packed; unpacked zero points take the scales' dtype)"
                            if zp.shape in ((N, kb), (N * kb,)) else "")
                    raise ValueError(f"{fn}: zero_points has shape {zp.shape}, expected packed uint8 {(N, row)} "
                                     f"or ({N * row},) for N={N}, k_blocks={kb}, bits={bits}{hint}")
                self.kernel_zero_points = np.ascontiguousarray(unpack_nbits(zp.reshape(N, row), bits, kb), np.uint8)
                self.integer_zero_points = True
            elif zp.dtype in SCALE_TYPES:
                if zp.dtype != scales.dtype:
                    raise TypeError(f"{fn}: zero_points dtype {zp.dtype} does not match scales dtype {scales.dtype} "
                                    "(float zero points take the scales' dtype; packed ones are uint8)")
                if zp.shape not in ((N, kb), (N * kb,)):
                    raise ValueError(f"{fn}: zero_points has shape {zp.shape}, expected {(N, kb)} or ({N * kb},) "
                                     f"for unpacked {zp.dtype} zero points, N={N}, k_blocks={kb}")
                self.kernel_zero_points = zp.reshape(N, kb).astype(_F32, copy=False)  # likewise
                self.integer_zero_points = False
            else:
                raise TypeError(f"{fn}: zero_points dtype {zp.dtype} is not supported, expected uint8 (packed) "
                                f"or the scales' dtype {scales.dtype} (unpacked)")

        self.g_idx = None
        if g_idx is not None:
            g = np.asarray(g_idx)
            if g.dtype.kind not in "iu":
                raise TypeError(f"{fn}: g_idx dtype {g.dtype} is not supported, expected an integer type (ONNX: int32)")
            if g.shape not in ((K,), (self.padded_K,)):
                lengths = f"({K},)" if K == self.padded_K else f"({K},) or ({self.padded_K},)"
                raise ValueError(f"{fn}: g_idx has shape {g.shape}, expected {lengths} "
                                 f"for K={K}, block_size={block_size}")
            if g.size and (int(g.min()) < 0 or int(g.max()) >= kb):
                bad = g[(g < 0) | (g >= kb)][0]
                raise ValueError(f"{fn}: g_idx values must lie in [0, {kb}) (k_blocks), got {bad}")
            g = g[:K].astype(np.intp)
            if not np.array_equal(g, np.arange(K) // block_size):  # a trivial g_idx changes nothing
                self.g_idx = g
        self.kernel_g_idx = None if self.g_idx is None else np.ascontiguousarray(self.g_idx, np.int32)

    def chunk_rows(self, minimum=16):
        return max(minimum, _CHUNK // self.padded_K)

    def zero_points(self, n0, n1):
        """float32 zero points of output rows n0..n1, [n1 - n0, k_blocks]."""
        return self.kernel_zero_points[n0:n1].astype(_F32)

    def codes(self, n0, n1):
        """Codes of output rows n0..n1 as uint8 [n1 - n0, padded_K]."""
        return _decode(self.B[n0:n1], self.bits, self.padded_K)

    def dequantize(self, n0, n1):
        """float32 W rows n0..n1, [n1 - n0, K]: float32(q - zp) * scale (codes past K dropped)."""
        q = self.codes(n0, n1)
        zp, s = self.zero_points(n0, n1), self.scales[n0:n1]
        if self.g_idx is None:
            w = q.reshape(n1 - n0, self.k_blocks, self.block_size).astype(_F32)
            w -= zp[:, :, None]
            w *= s[:, :, None]
            return w.reshape(n1 - n0, self.padded_K)[:, : self.K]
        w = q[:, : self.K].astype(_F32)
        w -= zp[:, self.g_idx]
        w *= s[:, self.g_idx]
        return w


def _chunks(total, size):
    for start in range(0, total, size):
        yield start, min(start + size, total)


# ---------------------------------------------------------------------------------------------------
# Decoding codes: the LSB-first bitstream (nbits_layout.py), by the C++ decoder the kernels use.


def _decode(rows, bits, count):
    """The first count codes of each row of rows (uint8 [n, bytes]) as uint8 [n, count]."""
    return _core.decode_nbits(np.ascontiguousarray(rows), bits, count)


# ---------------------------------------------------------------------------------------------------
# Levels 0-3: the C++ float kernels (float32 products; A and W rounded at levels 2 and 3).


def _product_float(a2, w, held, bias, compute_dtype):
    """Levels 0-3: float32 [M, N]; with compute_dtype, A and each dequantized W are rounded to it first.
    held: the codes, scales and zero points, or (levels 0/1) the weight MatMulNBits holds packed."""
    a32 = a2.astype(_F32, copy=False)
    # Levels 0-3: the C++ kernels (csrc/matmul_nbits.h); at levels 2 and 3 A and W are rounded there.
    operands = {None: 0, np.dtype(np.float16): 1, np.dtype(ml_dtypes.bfloat16): 2}[
        None if compute_dtype is None else np.dtype(compute_dtype)]
    return _core.matmul_nbits_f32(np.ascontiguousarray(a32), _contiguous(held.codes), w.K, w.bits, w.block_size,
                                  _contiguous(held.scales), _contiguous(held.zero_points),
                                  None if bias is None else np.ascontiguousarray(bias, dtype=_F32), operands,
                                  w.kernel_g_idx, held.packed)


def _contiguous(x):
    """x as a C-contiguous array (itself where it is one), or None."""
    return None if x is None else np.ascontiguousarray(x)


# ---------------------------------------------------------------------------------------------------
# Level 4: int8 A per block (ORT's formula), exact integer dot products per block.


def _quantize_a(a32, block_size, k_blocks):
    """ORT's QuantizeARow_CompInt8 per row and block of A.

    Returns qa (integers in float32, [M, k_blocks, block_size], zero past K) and scale_a (float32 [M, k_blocks])."""
    M, K = a32.shape
    padded = np.zeros((M, k_blocks * block_size), _F32)
    padded[:, :K] = a32
    blocks = padded.reshape(M, k_blocks, block_size)
    amax = np.max(np.abs(blocks), axis=2)  # NaN propagates
    scale = amax / np.float32(127)
    inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(_F32)
    qa = np.rint(blocks * inverse[:, :, None])
    tiny = (amax > 0) & (amax < _TINY_AMAX)  # 127 / amax overflows in float32: use the exact ratio
    if np.any(tiny):
        exact = np.rint(blocks.astype(_F64) * 127 / amax.astype(_F64)[:, :, None]).astype(_F32)
        qa = np.where(tiny[:, :, None], exact, qa)
    bad = ~np.isfinite(amax)
    if np.any(bad):  # a block holding NaN or infinity cannot be quantized: it makes its outputs NaN
        qa = np.where(bad[:, :, None], np.float32(0), qa)
        scale = np.where(bad, np.float32(np.nan), scale)
    return qa.astype(_F32), scale.astype(_F32)


def _product_int8(a2, w, held, bias):
    """Level 4: float32 [M, N], bias added; docs/matmul_nbits.md."""
    if w.g_idx is None:  # the C++ kernels (csrc/matmul_nbits.h): A quantized there exactly as below
        return _core.matmul_nbits_int8(np.ascontiguousarray(a2, dtype=_F32), _contiguous(held.codes), w.K, w.bits,
                                       w.block_size, _contiguous(held.scales), _contiguous(held.zero_points),
                                       None if bias is None else np.ascontiguousarray(bias, dtype=_F32),
                                       packed=held.packed)
    # A non-trivial g_idx changes the scales inside an A block, so the integer form does not factor:
    # the dequantized int8 A (float32 qa * scale_a) times W through the float32 kernels, an order the
    # level-4 bound covers.
    M, kb, bs = a2.shape[0], w.k_blocks, w.block_size
    qa, scale_a = _quantize_a(a2.astype(_F32), bs, kb)
    a_fq = (qa * scale_a[:, :, None]).reshape(M, w.padded_K)[:, : w.K]
    return _product_float(a_fq, w, held, bias, None)
