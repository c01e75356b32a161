"""reference/quantize_nbits.py: the numpy implementation of quantize_nbits ("rtn", "mse", "hqq"), vectorized over blocks; tests only, never the fast path.

This was quantize_nbits itself before the block loops moved into the C++ core
(csrc/quantize_nbits.cpp); the tests hold the core to it byte for byte (docs/quantizer.md says
where the two may differ). Validation and the method parameters are shared with the public module.
One change: HQQ's float32 power is the C library's powf (through _core.powf), the function the core
calls, where numpy's np.power may be another one (SVML on AVX-512 machines).
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..quantize_nbits import (
    _BF16,
    _F32,
    _F64,
    _FN,
    _HQQ_BETA,
    _HQQ_ITERS,
    _HQQ_KAPPA,
    _HQQ_LP_NORM,
    _MSE_LOCAL,
    _MSE_LOCAL_ROUNDS,
    _MSE_REFITS,
    _MSE_SHRINK,
    _MSE_SYM_SHRINK,
    NBitsWeight,
    _assemble,
    _codes,
    _options,
    _roundf,
    _weights,
)

__all__ = ["quantize_nbits_reference"]


def quantize_nbits_reference(W, *, bits: int = 4, block_size: int = 32, symmetric: bool = False,
                             method: str = "rtn") -> NBitsWeight:
    """quantize_nbits in numpy: the same arguments, validation and result."""
    bits, block_size, symmetric, method = _options(bits, block_size, symmetric, method)
    x, scale_dtype = _weights(W)
    K, N = x.shape
    blocks = _Blocks(x, block_size)
    if not symmetric:
        _check_ranges(blocks)
    if method == "hqq":
        scales, zp, q = _hqq(blocks, bits, scale_dtype)
    else:
        scales, zp, q = _rtn(blocks, bits, symmetric, scale_dtype)
        if method == "mse":
            scales, zp, q = _mse(blocks, bits, symmetric, scale_dtype, scales, zp, q)
    return _assemble(q, zp, scales, K, N, bits, block_size, method, symmetric)


# ---------------------------------------------------------------------------------------------------
# Blocks


class _Blocks:
    """The blocks of W as rows: x [N * k_blocks, block_size] float32, the short last block of each
    column padded with its own last value (so min and max are unchanged); valid marks real elements."""

    def __init__(self, x, block_size):
        K, N = x.shape
        self.K, self.N, self.block_size = K, N, block_size
        self.k_blocks = kb = -(-K // block_size)
        pad = kb * block_size - K
        xt = np.pad(x.T, ((0, 0), (0, pad)), mode="edge") if pad else x.T
        self.x = np.ascontiguousarray(xt).reshape(N * kb, block_size)
        if pad:
            valid = np.ones((N, kb * block_size), _F32)
            valid[:, K:] = 0
            self.valid = valid.reshape(N * kb, block_size)
        else:
            self.valid = None
        self.x64 = None

    def min_max(self):
        return self.x.min(axis=1), self.x.max(axis=1)

    def sse(self, q, zp, scale32):
        """Squared error of each block dequantized as MatMulNBits does, float64 [blocks]."""
        if self.x64 is None:
            self.x64 = self.x.astype(_F64)
        # huge blocks: a candidate's dequantized values may overflow (inf, and inf * 0 in the padding,
        # which repeats the last real element: that block's error is inf or NaN either way)
        with np.errstate(over="ignore", invalid="ignore"):
            d = ((q - zp[:, None]) * scale32[:, None]).astype(_F64) - self.x64
            d *= d
            if self.valid is not None:
                d *= self.valid
        return d.sum(axis=1)


def _check_ranges(blocks):
    """Asymmetric scales need max(x, 0) - min(x, 0) finite in float32 (ORT would store an infinite scale)."""
    mn, mx = blocks.min_max()
    with np.errstate(over="ignore"):
        span = np.maximum(mx, np.float32(0)) - np.minimum(mn, np.float32(0))
    if not np.isfinite(span).all():
        b = int(np.argmin(np.isfinite(span)))
        n, kb = divmod(b, blocks.k_blocks)
        raise ValueError(f"{_FN}: block {kb} of column {n} spans [{mn[b]}, {mx[b]}], a range that overflows "
                         f"float32; no finite asymmetric scale exists (symmetric=True has one)")


def _stored(scale32, scale_dtype):
    """The scale as stored, and as float32 again."""
    stored = scale32.astype(scale_dtype)
    return stored, (stored if scale_dtype == _F32 else stored.astype(_F32))


def _rtn(blocks, bits, symmetric, scale_dtype):
    """ONNX Runtime's MlasQuantizeBlockwise (q4_dq.cpp), vectorized: stored scales, zero points and
    codes (float32 [blocks], [blocks], [blocks, block_size])."""
    qmax = np.float32((1 << bits) - 1)
    mid = np.float32(1 << (bits - 1))
    mn, mx = blocks.min_max()
    with np.errstate(all="ignore"):
        if symmetric:
            # the signed extreme maps to code 0: scale = -extreme / 2^(bits-1), negative when max wins
            extreme = np.where(np.abs(mx) > np.abs(mn), mx, mn)
            scale_f = -extreme / mid
            zp = np.full(mn.shape, mid, _F32)
        else:
            lo = np.minimum(mn, np.float32(0))
            hi = np.maximum(mx, np.float32(0))
            scale_f = (hi - lo) / qmax
            zp_f = np.where(scale_f != 0, np.float32(0) - lo / scale_f, lo)  # from the unrounded scale
            zp = np.where(zp_f < 0, np.float32(0), np.where(zp_f > qmax, qmax, _roundf(zp_f))).astype(_F32)
    stored, as32 = _stored(scale_f, scale_dtype)
    # MLAS quantizes with the stored scale read back; a bfloat16 weight is quantized in float32 by
    # ORT's Python quantizer and only its scales are rounded to bfloat16 afterwards
    used = scale_f if scale_dtype == _BF16 else as32
    return stored, zp, _codes(blocks.x, used, zp, qmax)


# ---------------------------------------------------------------------------------------------------
# The "mse" search


class _Best:
    def __init__(self, blocks, scale_dtype, stored, zp, q):
        self.blocks, self.scale_dtype = blocks, scale_dtype
        self.stored, self.zp, self.q = stored, zp, q
        self.err = blocks.sse(q, zp, stored.astype(_F32))

    def offer(self, scale_f, zp, qmax):
        """Try scale_f (rounded to the stored dtype) with zero points zp; keep it where it is strictly better.
        Returns the mask of blocks that improved."""
        stored, as32 = _stored(scale_f, self.scale_dtype)
        q = _codes(self.blocks.x, as32, zp, qmax)
        err = self.blocks.sse(q, zp, as32)
        better = err < self.err
        self.err = np.where(better, err, self.err)
        self.stored = np.where(better, stored, self.stored)
        self.zp = np.where(better, zp, self.zp)
        self.q = np.where(better[:, None], q, self.q)
        return better


def _mse(blocks, bits, symmetric, scale_dtype, stored, zp, q):
    """Start from the rtn result; search per block for a lower squared error (docs/quantizer.md)."""
    qmax = np.float32((1 << bits) - 1)
    mid = np.float32(1 << (bits - 1))
    best = _Best(blocks, scale_dtype, stored, zp, q)
    mn, mx = blocks.min_max()
    with np.errstate(all="ignore"):
        if symmetric:
            extreme = np.where(np.abs(mx) > np.abs(mn), mx, mn)
            mids = np.full(mn.shape, mid, _F32)
            for p in _MSE_SYM_SHRINK:
                best.offer((-extreme * np.float32(p) / mid).astype(_F32), mids, qmax)  # rtn's orientation
                best.offer((extreme * np.float32(p) / (mid - 1)).astype(_F32), mids, qmax)  # extreme at the top code
        else:
            lo = np.minimum(mn, np.float32(0))
            hi = np.maximum(mx, np.float32(0))

            def offer(plo, phi):
                l_, h_ = (lo * plo).astype(_F32), (hi * phi).astype(_F32)
                scale_f = ((h_ - l_) / qmax).astype(_F32)
                zp_f = np.where(scale_f != 0, np.float32(0) - l_ / scale_f, l_)
                zp_ = np.clip(_roundf(zp_f), 0, qmax).astype(_F32)
                return best.offer(scale_f, zp_, qmax)

            n = lo.shape[0]
            plo = np.ones(n, _F32)
            phi = np.ones(n, _F32)
            for p in _MSE_SHRINK[1:]:
                better = offer(np.float32(p), np.float32(p))
                plo = np.where(better, np.float32(p), plo)
                phi = np.where(better, np.float32(p), phi)
            for _ in range(_MSE_LOCAL_ROUNDS):
                for end in (0, 1):
                    base_lo, base_hi = plo.copy(), phi.copy()
                    for d in _MSE_LOCAL:
                        if d == 0:
                            continue
                        try_lo = np.clip(base_lo + np.float32(d), 0.05, 1).astype(_F32) if end == 0 else base_lo
                        try_hi = np.clip(base_hi + np.float32(d), 0.05, 1).astype(_F32) if end == 1 else base_hi
                        better = offer(try_lo, try_hi)
                        plo = np.where(better, try_lo, plo)
                        phi = np.where(better, try_hi, phi)
        # least squares: the best scale for the chosen codes and zero points, then requantize
        for _ in range(_MSE_REFITS):
            c = (best.q - best.zp[:, None]).astype(_F64)
            if blocks.valid is not None:
                c *= blocks.valid
            den = (c * c).sum(axis=1)
            num = (c * blocks.x).sum(axis=1)
            current = best.stored.astype(_F32)
            scale_f = np.where(den > 0, num / np.where(den > 0, den, 1), current).astype(_F32)
            best.offer(scale_f, best.zp, qmax)
    return best.stored, best.zp, best.q


# ---------------------------------------------------------------------------------------------------
# HQQ


def _hqq(blocks, bits, scale_dtype):
    """Half-Quadratic Quantization (Badri & Shaji 2023), the proximal solver of ONNX Runtime's
    HQQWeightOnlyQuantizer (official HQQ ``optimize_weights_proximal_legacy``), vectorized per block:
    ``inv = qmax / (max - min)``, ``zero = round(-min * inv)``, then up to 20 rounds of
    ``q = clip(round(x inv + zero))``, ``e = shrink_lp(x - (q - zero) / inv, beta)``,
    ``zero = mean(q - (x - e) inv)``, ``beta *= kappa``, stopping when the mean absolute error stops
    falling. Differences from ORT (docs/quantizer.md): each block stops on its own error (ORT stops
    all blocks on the global mean); short tail blocks use their real elements only (ORT pads with
    zeros); no clamp of ``inv`` at 2e4 (ORT's guard for CUDA half precision); constant blocks are
    exact. The final codes use the stored scale and zero point with the rtn rounding rule."""
    qmax = np.float32((1 << bits) - 1)
    x = blocks.x
    valid = blocks.valid
    count = np.float32(blocks.block_size) if valid is None else valid.sum(axis=1)
    mn, mx = blocks.min_max()
    with np.errstate(all="ignore"):
        inv = (qmax / (mx - mn)).astype(_F32)
        constant = ~np.isfinite(inv) | (mx == mn)  # constant (or ~1e-38 wide): scale 1, zero -min, exact
        inv = np.where(constant, np.float32(1), inv)
        zero = np.where(constant, -mn, np.rint(-mn * inv)).astype(_F32)
        best_zero = zero.copy()
        best_err = np.full(zero.shape, np.inf)
        active = ~constant
        beta = _HQQ_BETA
        for _ in range(_HQQ_ITERS):
            q = np.clip(np.rint(x * inv[:, None] + zero[:, None]), 0, qmax)
            r = x - (q - zero[:, None]) / inv[:, None]
            err = np.abs(r) if valid is None else np.abs(r) * valid
            err = err.sum(axis=1) / count
            improved = active & (err < best_err)
            best_zero = np.where(improved, zero, best_zero)
            best_err = np.where(improved, err, best_err)
            active = improved
            if not active.any():
                break
            a = np.abs(r)
            base = np.ascontiguousarray(a + np.float32(1e-8))  # the C library's powf, as the core calls it
            power = _core.powf(base.ravel(), np.float32(_HQQ_LP_NORM - 1)).reshape(base.shape)
            shrink = np.float32(1 / beta) * power
            e = np.sign(r) * np.maximum(a - shrink, 0)  # the generalized soft threshold of the Lp (p < 1) prox
            update = q - (x - e) * inv[:, None]
            update = (update.sum(axis=1) if valid is None else (update * valid).sum(axis=1)) / count
            zero = np.where(active, update, zero).astype(_F32)
            beta *= _HQQ_KAPPA
        stored, scale32 = _stored((np.float32(1) / inv).astype(_F32), scale_dtype)
        zp_stored, zp32 = _stored(best_zero, scale_dtype)
    return stored, zp_stored, _codes(x, scale32, zp32, qmax)


# ---------------------------------------------------------------------------------------------------
# Layout


