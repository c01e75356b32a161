"""reference/matmul_nbits.py: a plain float64 oracle of MatMulNBits written straight from the layout (tests only, never the fast path).

Independent of the implementation: codes are read bit by bit from their stream offsets (not through
nbits_layout), every value is exact in float64, and the product is a float64 sum.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32


def read_code(row: np.ndarray, index: int, bits: int) -> int:
    """Code number index of one LSB-first bitstream row (uint8 bytes): its bit t is stream bit index*bits + t."""
    value = 0
    for t in range(bits):
        position = index * bits + t
        value |= ((int(row[position // 8]) >> (position % 8)) & 1) << t
    return value


def _read_codes(rows: np.ndarray, count: int, bits: int) -> np.ndarray:
    """read_code for codes 0..count-1 of every row, vectorized over the codes: int64 [n, count]."""
    rows = rows.astype(np.int64)
    out = np.zeros((rows.shape[0], count), np.int64)
    for t in range(bits):
        position = np.arange(count) * bits + t
        out |= ((rows[:, position // 8] >> (position % 8)) & 1) << t
    return out


def codes(B, K, N, bits, block_size) -> np.ndarray:
    """The codes q[n, k] for k < K as int64 [N, K] (row n of B is one stream; padded codes past K are not read)."""
    rows = np.asarray(B).reshape(N, -1)
    return _read_codes(rows, K, bits)


def zero_points(zp, N, k_blocks, bits) -> np.ndarray:
    """z[n, b] as float64 [N, k_blocks]: default 2^(bits-1); uint8 packed per row like B; float as given."""
    if zp is None:
        return np.full((N, k_blocks), 2.0 ** (bits - 1))
    zp = np.asarray(zp)
    if zp.dtype == np.uint8:
        return _read_codes(zp.reshape(N, -1), k_blocks, bits).astype(np.float64)
    return zp.reshape(N, k_blocks).astype(np.float64)


def block_of(K, block_size, g_idx) -> np.ndarray:
    """b(k) for k < K: k // block_size, or g_idx[k]."""
    if g_idx is None:
        return np.arange(K) // block_size
    return np.asarray(g_idx)[:K].astype(np.int64)


class Decoded:
    """q [N, K] (int64), z and s gathered per k [N, K] (float64), the exact real W* [N, K] and its block map."""

    def __init__(self, B, scales, zp, g_idx, K, N, bits, block_size):
        k_blocks = -(-K // block_size)
        self.K, self.N, self.bits, self.block_size, self.k_blocks = K, N, bits, block_size, k_blocks
        self.q = codes(B, K, N, bits, block_size)
        self.block = block_of(K, block_size, g_idx)
        self.z_blocks = zero_points(zp, N, k_blocks, bits)
        self.s_blocks = np.asarray(scales).reshape(N, k_blocks).astype(np.float64)
        self.z = self.z_blocks[:, self.block]
        self.s = self.s_blocks[:, self.block]
        self.raw_z = None if zp is None else np.asarray(zp)
        self.W = (self.q - self.z) * self.s  # exact for uint8 zp (integer times a float); float zp: 2^-53 relative

    def float32(self) -> np.ndarray:
        """The documented float32 weight [K, N]: float32(q - z) (one float32 subtraction) times float32(s)."""
        q32 = self.q.astype(F32)
        z32 = self.z.astype(F32)
        s32 = self.s.astype(F32)
        return ((q32 - z32) * s32).T


def dequantize(B, scales, zp, g_idx, *, K, N, bits, block_size) -> np.ndarray:
    """The exact real weight W*[k, n] = (q - z) * s in float64, shape [K, N]."""
    return Decoded(B, scales, zp, g_idx, K, N, bits, block_size).W.T


def dequantize_float32(B, scales, zp, g_idx, *, K, N, bits, block_size) -> np.ndarray:
    """dequantize_nbits' documented result, float32 [K, N]."""
    return Decoded(B, scales, zp, g_idx, K, N, bits, block_size).float32()


def quantize_a_int8(A, K, block_size):
    """ORT's QuantizeARow_CompInt8, one block at a time, all float32: scale = max|a| / 127, qa = rint(a * (127 / max|a|)).

    Returns (qa int64 [M, K], scale_a float32 [M, k_blocks]). For max|a| below 127 / FLT_MAX, where
    127 / max|a| overflows float32, the exact ratio is used (the documented deviation from ORT)."""
    A = np.asarray(A).reshape(-1, K).astype(F32)
    M = A.shape[0]
    k_blocks = -(-K // block_size)
    qa = np.zeros((M, K), np.int64)
    scale = np.zeros((M, k_blocks), F32)
    for m in range(M):
        for b in range(k_blocks):
            block = A[m, b * block_size : (b + 1) * block_size]
            amax = F32(np.max(np.abs(block)))
            scale[m, b] = amax / F32(127)
            if amax == 0:
                continue
            inverse = F32(127) / amax
            if np.isinf(inverse):
                values = np.rint(block.astype(np.float64) * 127 / float(amax))
            else:
                values = np.rint(block * inverse)  # float32 product, round half to even
            qa[m, b * block_size : (b + 1) * block_size] = values.astype(np.int64)
    return qa, scale


def _round_operand(x, level):
    if level == 2:
        return x.astype(np.float16).astype(np.float64)
    if level == 3:
        return x.astype(ml_dtypes.bfloat16).astype(np.float64)
    return x


def effective_operands(A, decoded: Decoded, level):
    """The operands (A' [M, K], W' [N, K]) whose exact product each accuracy level models, float64.

    Levels 0, 1: A, and the float32 W of dequantize_nbits. 2, 3: both rounded to float16 /
    bfloat16. 4: the int8-quantized A dequantized exactly (scale_a * qa), and the exact W*."""
    K = decoded.K
    A64 = np.asarray(A).reshape(-1, K).astype(np.float64)
    if level == 4:
        qa, scale = quantize_a_int8(A, K, decoded.block_size)
        per_k = scale.astype(np.float64)[:, np.arange(K) // decoded.block_size]
        return qa * per_k, decoded.W
    W32 = decoded.float32().T.astype(np.float64)
    if level in (2, 3):
        with np.errstate(over="ignore"):
            a32 = np.asarray(A).reshape(-1, K).astype(F32)
            return _round_operand(a32, level), _round_operand(W32.astype(F32), level)
    return A64, W32


def matmul_nbits(A, B, scales, zp=None, g_idx=None, bias=None, *, K, N, bits, block_size, level=None,
                 decoded=None) -> np.ndarray:
    """float64 Y [..., N]: the exact A @ W*.T + bias (level None), or the product of a level's effective operands.
    decoded: the weight's Decoded, when the caller has it already."""
    if decoded is None:
        decoded = Decoded(B, scales, zp, g_idx, K, N, bits, block_size)
    A = np.asarray(A)
    if level is None:
        a, w = A.reshape(-1, K).astype(np.float64), decoded.W
    else:
        a, w = effective_operands(A, decoded, level)
    y = a @ w.T
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float64)
    return y.reshape(A.shape[:-1] + (N,))


# ---------------------------------------------------------------------------------------------------
# The documented error bounds (docs/matmul_nbits.md), per output element.

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
HALF_SUBNORMAL = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}


def gamma(n: float) -> float:
    u = 2.0**-24
    return n * u / (1 - n * u)


def underflow(a, decoded, K) -> np.ndarray:
    """The bound's underflow term, [..., N] for |A| a [..., K]: in the float32 steps each rounding may
    lose up to 2^-150 absolutely (products and fused multiply-adds whose result is subnormal; sums of
    float32 values never), a loss in a block's sum is scaled by at most the block's |s| (1 + |z|),
    and W's own rounding costs up to 2^-150 |a| per term."""
    sigma = (np.abs(decoded.s) * (1 + np.abs(decoded.z))).max(axis=1, initial=0.0)  # [N]
    return 1.01 * 2.0**-150 * ((2 * K + 16) * (1 + sigma) + np.asarray(a).sum(axis=-1)[..., None])


def error_bound(A, B, scales, zp=None, g_idx=None, bias=None, *, K, N, bits, block_size, level,
                out_dtype, decoded=None, exact=None) -> np.ndarray:
    """The bound on |Y - Y*| that matmul_nbits documents for accuracy_level=level, [..., N] float64.
    decoded, exact: the weight's Decoded and the exact product Y*, when the caller has them already."""
    if decoded is None:
        decoded = Decoded(B, scales, zp, g_idx, K, N, bits, block_size)
    A = np.asarray(A)
    a = np.abs(A.reshape(-1, K).astype(np.float64))
    magnitude = np.abs(decoded.s) * (np.abs(decoded.q) + np.abs(decoded.z))  # [N, K]
    b = np.zeros(N) if bias is None else np.abs(np.asarray(bias).astype(np.float64))
    if exact is None:
        exact = matmul_nbits(A, B, scales, zp, g_idx, bias, K=K, N=N, bits=bits, block_size=block_size,
                             decoded=decoded)
    exact = np.abs(exact)
    exact = exact.reshape(-1, N)
    if level == 4:
        k_blocks = -(-K // block_size)
        padded = np.zeros((a.shape[0], k_blocks * block_size))
        padded[:, :K] = a
        amax = np.maximum(padded.reshape(-1, k_blocks, block_size).max(axis=2), 2.0**-100)
        R = amax[:, np.arange(K) // block_size] @ magnitude.T + b
        E = (1 / 254 + gamma(2 * K + 24)) * R
    else:
        T = a @ magnitude.T + b
        E = gamma(2 * K + 16) * T
        if level in (2, 3):
            # bfloat16: the smallest normal, not half the smallest subnormal, for hardware that reads
            # denormal operands as zero and flushes denormal sums (vdpbf16ps), one flush per step
            u_c, eta_c = (2.0**-11, 2.0**-25) if level == 2 else (2.0**-8, 2.0**-126)
            E = (2.01 * u_c + 1.01 * gamma(2 * K + 16)) * T + 1.01 * eta_c * (
                a.sum(axis=1)[:, None] + np.abs(decoded.W).sum(axis=1)[None, :])
            if level == 3:
                E = E + (2 * K + 16) * 2.0**-126
    E = E + underflow(a, decoded, K)
    name = np.dtype(out_dtype).name
    u_out, eta_out = UNIT_ROUNDOFF[name], HALF_SUBNORMAL[name]
    bound = u_out * exact + (1 + u_out) * E + eta_out
    return bound.reshape(A.shape[:-1] + (N,))
