"""reference/gptq.py: a plain float64 GPTQ written from the paper, one row at a time, no lazy batches (tests only, never the fast path).

Frantar et al. 2022, Algorithm 1, in W's [K, N] orientation (a "column" of the paper is a K row
here): ``U = cholesky(H^-1)`` upper; for each row i in the chosen order, quantize it, take
``err = (w_i - dq_i) / U[i, i]`` and subtract ``U[i, j] * err`` from every later row j at once.
Everything is float64 except the block scale rule, which is the "mse" search of quantize_nbits
applied to the float32-rounded group (the rule the fast path uses), and the codes, which round
``w / scale + zero_point`` half away from zero in float64.
"""

from __future__ import annotations

import numpy as np

from ..quantize_nbits import quantize_nbits


def group_parameters(rows, bits, block_size, symmetric):
    """(float64 scales [N, groups], float64 zero points [N, groups], stored scales) of W rows [k, N]
    by the "mse" search, blocks of block_size consecutive rows."""
    w = quantize_nbits(np.asarray(rows, np.float32), bits=bits, block_size=block_size, symmetric=symmetric,
                       method="mse")
    return w.scales.astype(np.float64), w.zero_point_values().astype(np.float64), w.scales


def gptq_reference(W, H, *, bits=4, block_size=32, symmetric=False, damp=0.01, act_order=True, desc_act=False):
    """GPTQ of W [K, N] for the Hessian H [K, K].

    Returns a dict: ``codes`` int64 [K, N] in W's row order, ``scales`` / ``zero_points`` float64
    [N, groups] (the stored scales in ``stored``), ``group`` int64 [K] (the group of each row of W),
    ``value`` float64 [K, N] (``w / scale + zero_point`` before rounding, to find near-ties) and
    ``perm`` (the order the rows were quantized in)."""
    W = np.array(W, np.float64)
    H = np.array(H, np.float64)
    K, N = W.shape
    qmax = 2**bits - 1
    d = np.diag(H).copy()
    dead = d == 0
    H[dead, dead] = 1
    W[dead, :] = 0
    H = H + damp * d.mean() * np.eye(K)
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(K)
    groups = -(-K // block_size)
    dynamic = desc_act or not act_order
    if not dynamic:  # static groups: W's own blocks, from W before the sweep
        scales, zps, stored = group_parameters(W, bits, block_size, symmetric)
        group = np.arange(K) // block_size
    else:  # group g: positions g * block_size .. of the sweep, searched when the sweep gets there
        scales, zps = np.zeros((N, groups)), np.zeros((N, groups))
        stored = []
        group = np.empty(K, np.int64)
        group[perm] = np.arange(K) // block_size
    W = W[perm]
    H = H[np.ix_(perm, perm)]
    U = np.linalg.cholesky(np.linalg.inv(H)).T  # H^-1 = U^T U, U upper
    codes = np.zeros((K, N), np.int64)
    value = np.zeros((K, N))
    for i in range(K):
        g = group[perm[i]]
        if dynamic and i % block_size == 0:
            s, z, st = group_parameters(W[i:i + block_size], bits, block_size, symmetric)
            scales[:, g], zps[:, g] = s[:, 0], z[:, 0]
            stored.append(st)
        s, z = scales[:, g], zps[:, g]
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(s != 0, W[i] / s + z, z)
        q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), 0, qmax)
        value[perm[i]], codes[perm[i]] = v, q
        err = (W[i] - (q - z) * s) / U[i, i]
        W[i + 1:] -= np.outer(U[i, i + 1:], err)
    if dynamic:
        stored = np.concatenate(stored, axis=1)
    return {"codes": codes, "scales": scales, "zero_points": zps, "group": group, "value": value, "perm": perm,
            "stored": stored}
