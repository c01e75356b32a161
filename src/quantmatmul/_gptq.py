"""_gptq.py: GPTQ (Frantar et al. 2022) for quantize_nbits(method="gptq"): the Hessian's checks, the inverse-Hessian Cholesky factor and the lazy-batch error-feedback sweep.

The math and the options are derived in docs/quantizer.md ("method="gptq""). In W's orientation
([K, N], the ONNX MatMul B) GPTQ's "columns" are the K rows of W: each step quantizes one row (all N
output columns at once, every operation below is over N) and pushes its error onto the rows not yet
quantized through the upper Cholesky factor U of the inverse Hessian (``H^-1 = U^T U``).
"""

from __future__ import annotations

import numpy as np

from .quantize_nbits import _codes

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_FN = "quantize_nbits"
DEFAULT_DAMP = 0.01
LAZY_ROWS = 128  # rows quantized before their errors reach the rest of W (one GEMM); at least block_size
_SUB_ROWS = 16  # within a lazy batch: rows whose errors reach the batch's later rows together (one GEMM)
_INVERSE_LEAF = 256  # the recursive triangular inverse hands blocks this small to LAPACK
_SYMMETRY_TOLERANCE = 1e-4  # |H - H^T| allowed, relative to max |H| (X^T X in float32 is symmetric to ~K ulps)


# ---------------------------------------------------------------------------------------------------
# Validation


def check_options(damp, act_order, desc_act):
    """damp (None: 0.01) as a float >= 0; act_order (None: True) and desc_act (None: False) as bools."""
    if damp is None:
        damp = DEFAULT_DAMP
    if isinstance(damp, (bool, np.bool_)) or not isinstance(damp, (int, float, np.integer, np.floating)):
        raise TypeError(f"{_FN}: damp must be a real number, got {type(damp).__name__}")
    if not np.isfinite(damp) or damp < 0:
        raise ValueError(
            f"{_FN}: damp must be a finite number >= 0 (a fraction of the mean of diag(hessian)), got {damp}"
        )
    flags = []
    for name, value, default in (("act_order", act_order, True), ("desc_act", desc_act, False)):
        if value is None:
            value = default
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{_FN}: {name} must be a bool, got {type(value).__name__}")
        flags.append(bool(value))
    act_order, desc_act = flags
    if desc_act and not act_order:
        raise ValueError(f"{_FN}: desc_act=True forms the groups in activation order and needs act_order=True")
    return float(damp), act_order, desc_act


def check_hessian(hessian, K):
    """The hessian as a float64 [K, K] copy, symmetrized; raises on a wrong type, shape, non-finite
    value, asymmetry or negative diagonal."""
    array_like = not isinstance(hessian, (np.ndarray, np.generic))
    H = np.asarray(hessian)
    if array_like and H.dtype.kind != "f":
        raise TypeError(f"{_FN}: hessian must be a floating-point array, got an array-like of {H.dtype} values")
    if H.dtype not in (_F32, _F64):
        raise TypeError(f"{_FN}: hessian dtype {H.dtype} is not supported, expected float32 or float64")
    if H.shape != (K, K):
        raise ValueError(
            f"{_FN}: hessian must be the [K, K] = [{K}, {K}] matrix X^T X / n of the layer's inputs "
            f"X [n, K], got shape {H.shape}"
        )
    H = H.astype(_F64)  # a copy: the caller's array is never modified
    bad = ~np.isfinite(H)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"{_FN}: hessian[{i}, {j}] = {H[i, j]} is not finite")
    asym = np.abs(H - H.T)
    if asym.max() > _SYMMETRY_TOLERANCE * np.abs(H).max():
        i, j = np.unravel_index(np.argmax(asym), asym.shape)
        raise ValueError(
            f"{_FN}: hessian is not symmetric: hessian[{i}, {j}] = {H[i, j]}, hessian[{j}, {i}] = {H[j, i]}"
        )
    diag = np.diagonal(H)
    if (diag < 0).any():
        i = int(np.argmax(diag < 0))
        raise ValueError(f"{_FN}: hessian[{i}, {i}] = {diag[i]} < 0; X^T X / n is positive semidefinite")
    H += H.T
    H *= 0.5
    return H


# ---------------------------------------------------------------------------------------------------
# The inverse Hessian's Cholesky factor


def _lower_inverse(L):
    """Inverse of a lower triangular matrix, recursively: [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]]
    (n^3 / 3 flops, nearly all in matrix products; numpy has no triangular inverse)."""
    n = L.shape[0]
    if n <= _INVERSE_LEAF:
        return np.linalg.inv(L)
    h = n // 2
    out = np.zeros_like(L)
    A = out[:h, :h] = _lower_inverse(L[:h, :h])
    D = out[h:, h:] = _lower_inverse(L[h:, h:])
    out[h:, :h] = -(D @ (L[h:, :h] @ A))
    return out


def inverse_cholesky_upper(H):
    """U upper triangular with ``H^-1 = U^T U`` for a symmetric positive definite float64 H.

    With J the reversal permutation, ``J H J = L L^T`` (Cholesky) gives ``H = R R^T`` with ``R = J L J``
    upper, so ``H^-1 = R^-T R^-1`` and ``U = R^-1 = J L^-1 J``: one Cholesky and one triangular inverse."""
    try:
        L = np.linalg.cholesky(H[::-1, ::-1])
    except np.linalg.LinAlgError:
        raise ValueError(
            f"{_FN}: hessian plus damping is not positive definite (its Cholesky factorization "
            "failed); X^T X / n is positive semidefinite: check the hessian or raise damp"
        ) from None
    return np.ascontiguousarray(_lower_inverse(L)[::-1, ::-1])


# ---------------------------------------------------------------------------------------------------
# Block scales and zero points: the module's "mse" search


def _search(rows, bits, block_size, symmetric, scale_dtype):
    """The "mse" clipping search on W rows [k, N] cut into blocks of block_size consecutive rows:
    stored scales [N, k_blocks] in scale_dtype and integer zero points as float32 [N, k_blocks].
    The C++ core's search (quantize_nbits(method="mse"), threaded over blocks), on float32 rows."""
    from .quantize_nbits import _quantize_in_core

    w = _quantize_in_core(np.ascontiguousarray(rows, _F32), bits, block_size, symmetric, "mse", scale_dtype)
    return np.asarray(w.scales), w.zero_point_values().astype(_F32)


# ---------------------------------------------------------------------------------------------------
# GPTQ


def gptq(x, H, *, bits, block_size, symmetric, scale_dtype, damp, act_order, desc_act):
    """GPTQ on the float32 weight x [K, N] (not modified) with the checked float64 Hessian H [K, K].

    Returns (scales [N, k_blocks] in scale_dtype, zero points float32 [N, k_blocks], codes uint8
    [N, k_blocks * block_size] in W's row order (past K: 0), g_idx int32 [K] or None)."""
    K, N = x.shape
    kb = -(-K // block_size)
    qmax = np.float32((1 << bits) - 1)

    # Dead inputs (always 0 in the calibration data): their rows cannot matter, GPTQ zeroes them
    diag = np.diagonal(H).copy()
    dead = diag == 0
    w0 = x.copy()
    w0[dead] = 0
    H = H.copy()
    H[dead, dead] = 1
    H[np.diag_indices(K)] += damp * float(diag.mean())

    perm = np.argsort(-np.diagonal(H), kind="stable") if act_order else np.arange(K)
    U = inverse_cholesky_upper(H[np.ix_(perm, perm)])
    W = w0[perm]  # float32, permuted: the working copy the sweep updates

    scales = np.zeros((N, kb), scale_dtype)
    zps = np.zeros((N, kb), _F32)
    if desc_act or not act_order:
        group_of = np.arange(K) // block_size  # by position in the sweep: group g starts at row g * block_size
        dynamic = True
    else:  # static groups: W's own blocks, their scales fixed on w0 before the sweep
        group_of = perm // block_size
        dynamic = False
        scales[:], zps[:] = _search(w0, bits, block_size, symmetric, scale_dtype)
    scales32 = np.ascontiguousarray(scales.T.astype(_F32))  # [k_blocks, N], filled per group when dynamic
    zpsT = np.ascontiguousarray(zps.T)

    Q = _sweep(W, U, group_of, scales32, zpsT, scales, zps, qmax, bits, block_size, symmetric, scale_dtype, dynamic)
    if not np.isfinite(scales32).all():
        raise ValueError(f"{_FN}: gptq's updated weights left the float32 range (a scale is not finite); raise damp")

    codes = np.zeros((N, kb * block_size), np.uint8)
    unpermuted = np.empty_like(Q)
    unpermuted[perm] = Q  # whole rows: 2.5x faster than scattering the columns of the transpose
    codes[:, :K] = unpermuted.T
    g_idx = None
    if desc_act:
        g_idx = np.empty(K, np.int32)
        g_idx[perm] = group_of
    return scales, zps, codes, g_idx


def _sweep(W, U, group_of, scales32, zpsT, scales, zps, qmax, bits, block_size, symmetric, scale_dtype, dynamic):
    """The error-feedback sweep over the rows of W (permuted, float32, updated in place).

    Row r is quantized with its group's scale and zero point, ``E[r] = (W[r] - dq(r)) / U[r, r]``,
    and every later row t gets ``W[t] -= U[r, t] E[r]``, applied lazily. A lazy batch of 128 rows
    first receives the errors of every earlier row in one GEMM (``W[b0:b1] -= U[:b0, b0:b1]^T E[:b0]``,
    left-looking: the product's output is the batch, not the rest of W); inside it, a row receives
    the errors of the earlier rows of its 16 (a vector-matrix product), and after each 16 rows the
    rest of the batch gets theirs (one GEMM). Dynamic groups are searched when the sweep reaches
    their first row, whose group rows then hold every earlier update (a group never straddles a
    lazy batch)."""
    K, N = W.shape
    U32 = U.astype(_F32)
    Q = np.empty((K, N), np.uint8)
    E = np.empty((K, N), _F32)
    lazy = max(LAZY_ROWS, block_size) if dynamic else LAZY_ROWS
    with np.errstate(all="ignore"):
        for b0 in range(0, K, lazy):
            b1 = min(b0 + lazy, K)
            if b0:
                W[b0:b1] -= U32[:b0, b0:b1].T @ E[:b0]
            for s0 in range(b0, b1, _SUB_ROWS):
                s1 = min(s0 + _SUB_ROWS, b1)
                if dynamic and s0 % block_size == 0:
                    g = s0 // block_size
                    rows = W[s0 : min(s0 + block_size, K)]
                    s, z = _search(rows, bits, block_size, symmetric, scale_dtype)
                    scales[:, g], zps[:, g] = s[:, 0], z[:, 0]
                    scales32[g], zpsT[g] = s[:, 0].astype(_F32), z[:, 0]
                for r in range(s0, s1):
                    w = W[r] - U32[s0:r, r] @ E[s0:r] if r > s0 else W[r]
                    g = group_of[r]
                    s32, z = scales32[g], zpsT[g]
                    q = _codes(w[:, None], s32, z, qmax)[:, 0]
                    Q[r] = q
                    E[r] = (w - (q - z) * s32) / U32[r, r]
                if s1 < b1:
                    W[s1:b1] -= U32[s0:s1, s1:b1].T @ E[s0:s1]
    return Q
