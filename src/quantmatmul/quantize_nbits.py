"""quantize_nbits.py: block-wise 2..8-bit weight quantization for MatMulNBits: ONNX Runtime's own quantizer bit for bit ("rtn"), an error-minimizing search ("mse"), HQQ ("hqq") and GPTQ ("gptq", in _gptq.py)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import _core
from .nbits_layout import pack_nbits, packed_size, unpack_nbits

__all__ = ["quantize_nbits", "NBitsWeight", "METHODS", "CALIBRATED_METHODS"]

METHODS = ("rtn", "mse", "hqq")  # from W alone
CALIBRATED_METHODS = ("gptq",)  # also need the layer's input statistics (hessian=)
_FLOAT_ZERO_POINT_METHODS = ("hqq",)  # asymmetric only
_FN = "quantize_nbits"
_F32, _F16, _F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_WEIGHT_TYPES = (_F32, _F16, _BF16, _F64)
_ORT_BITS = (2, 4, 8)  # widths ONNX Runtime's quantizer (and MatMulNBits on every EP) supports

# The "mse" search (docs/quantizer.md): shrink factors of the rtn range tried for every block.
_MSE_SHRINK = np.linspace(1.0, 0.5, 21)  # asymmetric: both ends scaled by p
_MSE_LOCAL = np.linspace(-0.12, 0.12, 9)  # then each end alone, around the best factor ...
_MSE_LOCAL_ROUNDS = 2  # ... this many times
_MSE_SYM_SHRINK = np.linspace(1.0, 0.3, 36)  # symmetric: the one scale, in both orientations
_MSE_REFITS = 2  # least-squares rescaling of the best codes
# HQQ (Badri & Shaji 2023) as ONNX Runtime's HQQWeightOnlyQuantizer runs it: its proximal solver's parameters
# (csrc/quantize_nbits_blocks.inc spells these four out again)
_HQQ_ITERS, _HQQ_LP_NORM, _HQQ_BETA, _HQQ_KAPPA = 20, 0.7, 10.0, 1.01
# What the core takes: the grids as float32 factors (p = 1 and the step 0 left out), the types' codes
_MSE_GRIDS = tuple(np.ascontiguousarray(g, np.float32)
                   for g in (_MSE_SHRINK[1:], _MSE_LOCAL[_MSE_LOCAL != 0], _MSE_SYM_SHRINK))
_TYPE_CODES = {_F32: 0, _F16: 1, _BF16: 2, _F64: 3}  # qmm::QuantizeType


@dataclass(frozen=True, eq=False)
class NBitsWeight:
    """A weight quantized for MatMulNBits: the operator's inputs 1..4 and its attributes.

    Attributes
    ----------
    B : uint8 [N, k_blocks, blob_size]
        The codes, ``blob_size = block_size * bits / 8``; each row of B is one LSB-first bitstream
        (``nbits_layout``). Codes past K in the last block are padding, ignored by every consumer.
    scales : [N, k_blocks] in ``scale_dtype``
        float32 for float32 and float64 weights, else the weights' own dtype (float16, bfloat16),
        as ONNX Runtime's quantizer writes them. MatMulNBits needs ``A.dtype == scales.dtype``.
    zero_points : uint8 [N, ceil(k_blocks * bits / 8)], float [N, k_blocks] or None
        uint8: packed like B along the block axis, each row padded on its own. Float (method
        "hqq"): one fractional zero point per block, in ``scale_dtype``. None when symmetric: the
        operator's default zero point 2**(bits-1) applies.
    g_idx : int32 [K] or None
        The block (group) of each K row: set by ``method="gptq"`` with ``desc_act=True`` (groups
        formed in activation order, GPTQ's g_idx), else None (row k is in block ``k // block_size``).
        Codes are not permuted: g_idx only picks the scale and zero point of each row.
    K, N, bits, block_size : int
        The operator's attributes.
    method : str
        The method that produced it, "rtn", "mse", "hqq" or "gptq".
    symmetric : bool

    The arrays are read-only. ``matmul_nbits(A, *w.tensors(), **w.attributes())`` runs the
    quantized product; ``w.dequantize()`` is the float32 weight it multiplies by.
    """

    B: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    g_idx: np.ndarray | None
    K: int
    N: int
    bits: int
    block_size: int
    method: str
    symmetric: bool

    @property
    def k_blocks(self) -> int:
        """Blocks per column of W: ``ceil(K / block_size)``."""
        return -(-self.K // self.block_size)

    @property
    def scale_dtype(self) -> np.dtype:
        return self.scales.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of B, scales and zero points together."""
        return self.B.nbytes + self.scales.nbytes + (0 if self.zero_points is None else self.zero_points.nbytes)

    @property
    def float_zero_points(self) -> bool:
        """Whether zero_points holds float zero points (one per block, the scales' dtype) rather than packed uint8."""
        return self.zero_points is not None and self.zero_points.dtype != np.uint8

    def tensors(self) -> tuple:
        """``(B, scales, zero_points, g_idx)``: MatMulNBits inputs 1..4, in order (None where absent)."""
        return (self.B, self.scales, self.zero_points, self.g_idx)

    def attributes(self) -> dict:
        """``{"K", "N", "bits", "block_size"}``: the MatMulNBits attributes (keyword arguments of ``matmul_nbits``)."""
        return {"K": self.K, "N": self.N, "bits": self.bits, "block_size": self.block_size}

    def codes(self) -> np.ndarray:
        """The unsigned codes, uint8 [K, N] (W's orientation; padding dropped)."""
        return unpack_nbits(self.B.reshape(self.N, -1), self.bits, self.K).T.copy()

    def zero_point_values(self) -> np.ndarray:
        """The zero point of every block, [N, k_blocks]: uint8 (2**(bits-1) everywhere when symmetric),
        or a copy of the float zero points."""
        if self.zero_points is None:
            return np.full((self.N, self.k_blocks), 1 << (self.bits - 1), np.uint8)
        if self.float_zero_points:
            return self.zero_points.copy()
        return unpack_nbits(self.zero_points, self.bits, self.k_blocks)

    def dequantize(self) -> np.ndarray:
        """The weight MatMulNBits multiplies by, float32 [K, N]:
        ``(float32(q) - float32(zp)) * float32(scale)`` (for integer zero points the difference is exact),
        the scale and zero point of row k those of block ``g_idx[k]`` (``k // block_size`` without g_idx)."""
        q = unpack_nbits(self.B.reshape(self.N, -1), self.bits, self.K).astype(_F32)
        block = np.arange(self.K) // self.block_size if self.g_idx is None else self.g_idx.astype(np.intp)
        zp = self.zero_point_values().astype(_F32)[:, block]
        scale = self.scales.astype(_F32)[:, block]
        return ((q - zp) * scale).T.copy()


def quantize_nbits(W, *, bits: int = 4, block_size: int = 32, symmetric: bool = False, method: str = "rtn",
                   hessian=None, damp: float | None = None, act_order: bool | None = None,
                   desc_act: bool | None = None) -> NBitsWeight:
    """Quantize a MatMul weight block-wise to ``bits``-wide codes for MatMulNBits.

    Every column of W is cut into blocks of ``block_size`` consecutive K rows (the last one may be
    short); each block gets a scale and, unless symmetric, a zero point (an integer, a float with
    ``"hqq"``), and each element
    the code ``q`` with ``W[k, n] ~ (q - zero_point) * scale``.

    Parameters
    ----------
    W : array [K, N] of float32, float16, bfloat16 or float64
        The weight in the orientation of an ONNX MatMul's B (a torch Linear's ``weight.T``).
        float64 is rounded to float32 first (MatMulNBits has no float64 type). Must be finite.
    bits : int in 2..8
        2, 4 and 8 are what ONNX Runtime supports; 3, 5, 6 and 7 use the same LSB-first
        bitstream layout (``nbits_layout``), which ONNX Runtime does not accept.
    block_size : int, a power of two >= 16
        ONNX Runtime's quantizer handles 16..256; larger blocks are supported here.
    symmetric : bool
        No zero point tensor: the default zero point ``2**(bits-1)`` applies.
    method : {"rtn", "mse", "hqq"}
        ``"rtn"``: round to nearest from the block's min/max, identical byte for byte (B, scales,
        zero points) to ONNX Runtime's quantizer (``MatMulNBitsQuantizer``'s default algorithm,
        the C++ ``quantize_matmul_{2,4,8}bits``) for bits 2, 4 and 8, and the same formulas for
        the other widths. ``"mse"``: per block, search the clipping range that minimizes the
        squared error of the dequantized block (a grid over shrink factors of the range, then
        least-squares rescaling); never worse than "rtn" on any block. ``"hqq"``: Half-Quadratic
        Quantization as ONNX Runtime's ``HQQWeightOnlyQuantizer`` runs it (no torch needed),
        with float zero points; asymmetric only. ``"gptq"``: GPTQ (Frantar et al. 2022), which
        needs ``hessian``: each K row is quantized in turn and its error, weighted by the inverse
        Hessian, is compensated on the rows not yet quantized; block scales and zero points from
        the "mse" search. See docs/quantizer.md.
    hessian : array [K, K] of float32 or float64, method "gptq" only (and required there)
        ``X^T X / n`` for the layer's calibration inputs ``X [n, K]`` (symmetric positive
        semidefinite; any positive multiple gives the same result). Not modified. An input whose
        diagonal entry is 0 (never nonzero in the calibration data) is dead: its W row is set to
        0 first, so its codes are the zero points (dequantized: exact zeros).
    damp : float >= 0, "gptq" only, default 0.01
        ``damp * mean(diag(hessian))`` is added to the diagonal before inverting it.
    act_order : bool, "gptq" only, default True
        Quantize the K rows in order of decreasing ``diag(hessian)`` (the inputs with the most
        energy first). The blocks stay W's own consecutive rows, so the result has the plain
        MatMulNBits layout (no g_idx): their scales and zero points are fixed before the sweep, from
        W (dead rows zeroed) ("static groups"). With act_order=False the rows go in order and
        each block's scale and zero point are searched when the sweep reaches it, on the updated W.
    desc_act : bool, "gptq" only, default False
        Groups in activation order, as GPTQ checkpoints with desc_act make them: group g is rows
        g*block_size .. of the act-order sequence, its scales and zero points searched when the
        sweep reaches it, on the updated W; the result has a ``g_idx`` (MatMulNBits input 4).
        ONNX Runtime's CPU kernel runs g_idx only at 4 bits and then ignores uint8 zero points
        (docs/quantizer.md); needs act_order=True.

    Returns
    -------
    NBitsWeight
        ``matmul_nbits(A, *w.tensors(), **w.attributes())``; ``w.dequantize()``.

    Examples
    --------
    >>> import numpy as np
    >>> W = np.linspace(-1, 1, 32, dtype=np.float32).reshape(16, 2)
    >>> w = quantize_nbits(W, bits=4, block_size=16)
    >>> w.B.shape, w.scales.shape, w.zero_points.shape
    ((2, 1, 8), (2, 1), (2, 1))
    >>> bool(np.abs(w.dequantize() - W).max() <= w.scales.max() / 2)
    True
    """
    bits, block_size, symmetric, method = _options(bits, block_size, symmetric, method)
    gptq_options = _gptq_options(method, hessian, damp, act_order, desc_act)
    if method == "gptq":
        from . import _gptq

        x, scale_dtype = _weights(W)
        if not symmetric:
            check_block_ranges(x, block_size)
        K, N = x.shape
        H = _gptq.check_hessian(hessian, K)
        scales, zp, q, g_idx = _gptq.gptq(x, H, bits=bits, block_size=block_size, symmetric=symmetric,
                                          scale_dtype=scale_dtype, **gptq_options)
        return _assemble(q, zp, scales, K, N, bits, block_size, method, symmetric, g_idx)
    W, scale_dtype = _weight_array(W)
    return _quantize_in_core(W, bits, block_size, symmetric, method, scale_dtype)


def _quantize_in_core(W, bits, block_size, symmetric, method, scale_dtype):
    """rtn, mse or hqq on a checked W [K, N] (any supported dtype) in the C++ core, scales stored in scale_dtype."""
    K, N = W.shape
    raw = W.view(np.uint16) if W.dtype in (_F16, _BF16) else W  # the core reads 16-bit floats as bits
    status, B, scales, zero_points = _core.quantize_nbits(
        raw, _TYPE_CODES[W.dtype], bits, block_size, symmetric, METHODS.index(method), _TYPE_CODES[scale_dtype],
        _MSE_GRIDS[0], _MSE_GRIDS[1], _MSE_LOCAL_ROUNDS, _MSE_GRIDS[2], _MSE_REFITS)
    if status != 0:
        _raise_for_values(W, block_size, symmetric)
    scales = scales.view(scale_dtype)
    if zero_points is not None and zero_points.dtype != np.uint8:
        zero_points = zero_points.view(scale_dtype)
    for a in (B, scales, zero_points):
        if a is not None:
            a.setflags(write=False)
    return NBitsWeight(B=B, scales=scales, zero_points=zero_points, g_idx=None, K=K, N=N, bits=bits,
                       block_size=block_size, method=method, symmetric=symmetric)


# ---------------------------------------------------------------------------------------------------
# Validation


def _options(bits, block_size, symmetric, method):
    for name, value in (("bits", bits), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{_FN}: {name} must be an integer, got {type(value).__name__}")
    bits, block_size = int(bits), int(block_size)
    if not 2 <= bits <= 8:
        raise ValueError(f"{_FN}: bits must be in 2..8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{_FN}: block_size must be a power of two >= 16, got {block_size}")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"{_FN}: symmetric must be a bool, got {type(symmetric).__name__}")
    if not isinstance(method, str) or method not in METHODS + CALIBRATED_METHODS:
        raise ValueError(f"{_FN}: method must be one of {', '.join(map(repr, METHODS + CALIBRATED_METHODS))}, "
                         f"got {method!r}")
    if symmetric and method in _FLOAT_ZERO_POINT_METHODS:
        raise ValueError(f"{_FN}: method {method!r} fits a float zero point per block and cannot be symmetric")
    return bits, block_size, bool(symmetric), method


def _gptq_options(method, hessian, damp, act_order, desc_act):
    """The GPTQ keyword arguments: required / checked with "gptq", refused with any other method."""
    if method != "gptq":
        given = [n for n, v in (("hessian", hessian), ("damp", damp), ("act_order", act_order),
                                ("desc_act", desc_act)) if v is not None]
        if given:
            raise ValueError(f"{_FN}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} only used by "
                             f"method 'gptq', got method {method!r}")
        return None
    if hessian is None:
        raise ValueError(f"{_FN}: method 'gptq' needs hessian=, the [K, K] matrix X^T X / n of the layer's "
                         "calibration inputs X [n, K]")
    from ._gptq import check_options

    damp, act_order, desc_act = check_options(damp, act_order, desc_act)
    return {"damp": damp, "act_order": act_order, "desc_act": desc_act}


def _weight_array(W):
    """W as an ndarray [K, N] of a supported dtype (not copied when it is one) and the dtype the scales will have."""
    array_like = not isinstance(W, (np.ndarray, np.generic))
    W = np.asarray(W)
    if array_like and W.dtype.kind != "f":
        raise TypeError(f"{_FN}: W must be a floating-point array, got an array-like of {W.dtype} values")
    if W.dtype not in _WEIGHT_TYPES:
        raise TypeError(f"{_FN}: W dtype {W.dtype} is not supported, expected float32, float16, bfloat16 or float64")
    if W.ndim != 2:
        raise ValueError(f"{_FN}: W must be 2-D [K, N], got shape {W.shape}")
    if W.shape[0] == 0 or W.shape[1] == 0:
        raise ValueError(f"{_FN}: W must not be empty, got shape {W.shape}")
    return W, (_F32 if W.dtype in (_F32, _F64) else W.dtype)


def _weights(W):
    """W as float32 [K, N] (a view when it already is one), checked finite, and the dtype the scales will have."""
    W, scale_dtype = _weight_array(W)
    with np.errstate(over="ignore"):
        x = W.astype(_F32, copy=False)
    bad = ~np.isfinite(x)
    if bad.any():
        k, n = np.argwhere(bad)[0]
        what = "is not finite" if not np.isfinite(W[k, n]) else "overflows float32"
        raise ValueError(f"{_FN}: W[{k}, {n}] = {W[k, n]} {what}; weights must be finite")
    return x, scale_dtype


def check_block_ranges(x, block_size):
    """Asymmetric scales need max(x, 0) - min(x, 0) finite in float32 for every block of x (float32 [K, N]);
    ORT would store an infinite scale. Raises ValueError naming the first block that fails."""
    K, N = x.shape
    kb = -(-K // block_size)
    pad = kb * block_size - K
    xt = np.pad(x.T, ((0, 0), (0, pad)), mode="edge") if pad else x.T
    blocks = xt.reshape(N * kb, block_size)
    mn, mx = blocks.min(axis=1), blocks.max(axis=1)
    with np.errstate(over="ignore"):
        span = np.maximum(mx, np.float32(0)) - np.minimum(mn, np.float32(0))
    if not np.isfinite(span).all():
        b = int(np.argmin(np.isfinite(span)))
        n, k = divmod(b, kb)
        raise ValueError(f"{_FN}: block {k} of column {n} spans [{mn[b]}, {mx[b]}], a range that overflows "
                         f"float32; no finite asymmetric scale exists (symmetric=True has one)")


def _raise_for_values(W, block_size, symmetric):
    """The core found a value it cannot quantize: name it (numpy, only on this error path)."""
    x, _ = _weights(W)
    if not symmetric:
        check_block_ranges(x, block_size)
    raise AssertionError(f"{_FN}: the core rejected W but no non-finite value or overflowing range was found")


# ---------------------------------------------------------------------------------------------------
# GPTQ's result as MatMulNBits tensors (the other methods' are assembled in the core)


def _roundf(v):
    """C roundf: to nearest, ties away from zero (NaN stays NaN)."""
    a = np.abs(v)
    f = np.floor(a)
    f += (a - f) >= 0.5
    return np.copysign(f, v)


def _codes(x, scale32, zp, qmax):
    """MLAS's ``clamp(roundf(x * (1 / scale) + zp), 0, qmax)`` in float32 (reciprocal 0 for scale 0);
    a NaN (x == 0 with an overflowing reciprocal) gives code 0, as the C++ conversion does on x86-64."""
    with np.errstate(all="ignore"):
        rec = np.where(scale32 != 0, np.float32(1) / scale32, np.float32(0)).astype(_F32)
        v = x * rec[:, None] + zp[:, None]
        q = np.clip(_roundf(v), 0, qmax)
    q[np.isnan(q)] = 0
    return q


def _assemble(q, zp, scales, K, N, bits, block_size, method, symmetric, g_idx=None):
    kb = -(-K // block_size)
    codes = q.astype(np.uint8).reshape(N, kb * block_size)
    float_zp = method in _FLOAT_ZERO_POINT_METHODS
    zps = zp.reshape(N, kb) if float_zp else zp.astype(np.uint8).reshape(N, kb)
    if bits in _ORT_BITS:
        codes, zp_row = _ort_padding(codes, zps, K, bits, block_size)
    else:
        codes[:, K:] = 0  # unused tail bits zero (the contiguous-bitstream proposal)
        zp_row = zps
    B = pack_nbits(codes, bits).reshape(N, kb, block_size * bits // 8)
    if symmetric:
        zero_points = None
    elif float_zp:
        zero_points = np.ascontiguousarray(zps)
    else:
        zero_points = pack_nbits(zp_row, bits)
        assert zero_points.shape == (N, packed_size(kb, bits))
    for a in (B, scales, zero_points, g_idx):
        if a is not None:
            a.setflags(write=False)
    return NBitsWeight(B=B, scales=np.ascontiguousarray(scales).reshape(N, kb), zero_points=zero_points, g_idx=g_idx,
                       K=K, N=N, bits=bits, block_size=block_size, method=method, symmetric=symmetric)


def _ort_padding(codes, zps, K, bits, block_size):
    """The padding ONNX Runtime's quantizer leaves, so that the bytes match (docs/quantizer.md).

    MLAS packs 8/bits codes per byte from a scratch vi[] that is reused across the bytes of one
    thread block (block_size * 8/bits rows of one column): in the byte that straddles K the slots
    past K keep the codes of the previous byte (0 at a thread block's first byte); bytes wholly
    past K are never written (0). Zero points are packed 8/bits per byte from a scratch
    initialised to 2**(bits-1), so the unused slots of a row's last zero-point byte hold that.
    """
    per_byte = 8 // bits
    codes[:, K:] = 0
    tail = K % per_byte
    if tail:
        start = K - tail
        if start % (block_size * per_byte):
            codes[:, K:start + per_byte] = codes[:, start - per_byte + tail:start]
    kb = zps.shape[1]
    slots = -(-kb // per_byte) * per_byte
    if slots != kb and zps.dtype == np.uint8:
        zps = np.concatenate([zps, np.full((zps.shape[0], slots - kb), 1 << (bits - 1), np.uint8)], axis=1)
    return codes, zps
