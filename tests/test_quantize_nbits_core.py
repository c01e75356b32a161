"""test_quantize_nbits_core.py: quantize_nbits' C++ block loops byte for byte against the numpy reference (random and adversarial weights, every width, both builds, any thread count)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_quantize_nbits import _random_weight, adversarial_blocks, ort_quantize

import quantmatmul
from quantmatmul import _core
from quantmatmul.quantize_nbits import quantize_nbits
from quantmatmul.reference.quantize_nbits import quantize_nbits_reference

F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (F32, F16, BF16, F64)
# (method, symmetric): every combination quantize_nbits accepts
MODES = [("rtn", False), ("rtn", True), ("mse", False), ("mse", True), ("hqq", False)]
MODE_IDS = [f"{m}-{'sym' if s else 'asym'}" for m, s in MODES]


def assert_same(w, r, where=""):
    """Two NBitsWeights with the same bytes and dtypes everywhere."""
    assert w.B.shape == r.B.shape, where
    np.testing.assert_array_equal(w.B, r.B, err_msg=where)
    assert w.scales.dtype == r.scales.dtype, where
    np.testing.assert_array_equal(w.scales.view(np.uint8), r.scales.view(np.uint8), err_msg=where)
    assert (w.zero_points is None) == (r.zero_points is None), where
    if w.zero_points is not None:
        assert w.zero_points.dtype == r.zero_points.dtype, where
        np.testing.assert_array_equal(w.zero_points.view(np.uint8), r.zero_points.view(np.uint8), err_msg=where)
    assert (w.K, w.N, w.bits, w.block_size, w.method, w.symmetric) == (
        r.K,
        r.N,
        r.bits,
        r.block_size,
        r.method,
        r.symmetric,
    )


def without_mixed_zeros(W, bs):
    """W with -0 made +0 in every block that holds zeros of both signs: there the core takes the
    first zero as min / max, as ONNX Runtime does, and the reference whichever numpy's reduction
    returns (test_mixed_signed_zero_blocks_follow_onnxruntime)."""
    W = np.array(W)
    for k0 in range(0, W.shape[0], bs):
        block = W[k0 : k0 + bs].astype(np.float32)
        negative = (block == 0) & np.signbit(block)
        mixed = negative.any(axis=0) & ((block == 0) & ~np.signbit(block)).any(axis=0)
        W[k0 : k0 + bs][negative & mixed] = 0
    return W


def check(W, bits, bs, symmetric, method):
    W = without_mixed_zeros(W, bs)
    kw = {"bits": bits, "block_size": bs, "symmetric": symmetric, "method": method}
    assert_same(quantize_nbits(W, **kw), quantize_nbits_reference(W, **kw), f"{W.dtype} {W.shape} {kw}")


@pytest.mark.parametrize(("method", "symmetric"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("bits", range(2, 9))
def test_core_matches_reference_random(method, symmetric, bits):
    rng = np.random.default_rng(bits * 10 + MODES.index((method, symmetric)))
    # short last blocks, K below one block, several lane groups of 8 columns and a partial one
    for bs, K, N in ((16, 37, 11), (32, 64, 8), (32, 100, 3), (64, 197, 17), (256, 300, 9), (16, 5, 2)):
        for dtype in DTYPES:
            check(_random_weight(rng, K, N, dtype), bits, bs, symmetric, method)


@pytest.mark.parametrize(("method", "symmetric"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_core_matches_reference_adversarial(method, symmetric, bits):
    """Zero, constant and one-value blocks, roundf ties, subnormal and near-FLT_MAX magnitudes,
    outliers; two blocks and a short tail per column."""
    rng = np.random.default_rng(bits)
    for dtype in (F32, F16, BF16):
        for bs in (16, 64):
            blocks = adversarial_blocks(bs, F32 if dtype == BF16 else dtype, rng)
            if dtype == BF16:  # float32's blocks, within bfloat16's range
                top = float(ml_dtypes.finfo(BF16).max)
                blocks = [np.clip(b, -top, top).astype(BF16) for b in blocks]
            order = rng.permutation(len(blocks))
            columns = [np.concatenate([blocks[i], blocks[j], blocks[j][:5]]) for i, j in zip(order, np.roll(order, 1))]
            W = np.stack(columns, axis=1)
            if not symmetric:  # ranges that overflow float32 are refused (tests/test_quantize_nbits.py)
                x = W.astype(np.float32)
                with np.errstate(over="ignore"):
                    span = np.maximum(x, 0).max(axis=0).astype(np.float32) - np.minimum(x, 0).min(axis=0)
                W = W[:, np.isfinite(span)]
            check(W, bits, bs, symmetric, method)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_core_large_magnitudes_take_the_exact_hqq_shrinkage(bits):
    """Weights of magnitude 10..1e6: residuals above HQQ's shrinkage, where its powf is exact
    (blocks near the threshold decide element by element)."""
    rng = np.random.default_rng(bits)
    for scale in (3.0, 10.0, 100.0, 1e4, 1e6):
        W = (rng.standard_normal((96, 10)) * scale * rng.uniform(0.5, 2, 10)).astype(np.float32)
        check(W, bits, 32, False, "hqq")
        check(W.astype(F16) if scale < 1e3 else W, bits, 16, False, "hqq")


@pytest.mark.parametrize(("method", "symmetric"), MODES, ids=MODE_IDS)
def test_core_builds_and_thread_counts_agree(method, symmetric):
    """The baseline and AVX2 builds of the block loops, at 1, 2 and 3 threads: the same bytes."""
    rng = np.random.default_rng(7)
    W = (rng.standard_normal((300, 45)) * rng.uniform(0.01, 10, 45)).astype(np.float32)
    kw = {"bits": 3, "block_size": 32, "symmetric": symmetric, "method": method}
    isa, threads = quantmatmul.cpu_info()["isa"], quantmatmul.get_num_threads()
    results = {}
    try:
        for level in ["portable"] + [i for i in ("avx2",) if i in quantmatmul.available_isas()]:
            quantmatmul.set_isa(level)
            for n in (1, 2, 3):
                quantmatmul.set_num_threads(n)
                results[level, n, _core.quantize_nbits_path()] = quantize_nbits(W, **kw)
    finally:
        quantmatmul.set_isa(isa)
        quantmatmul.set_num_threads(threads)
    assert {key[2] for key in results} >= {"portable"}
    first = next(iter(results.values()))
    for key, w in results.items():
        assert_same(w, first, str(key))


def test_core_path_follows_the_active_level():
    isa = quantmatmul.cpu_info()["isa"]
    try:
        quantmatmul.set_isa("portable")
        assert _core.quantize_nbits_path() == "portable"
        if "avx2" in quantmatmul.available_isas():
            quantmatmul.set_isa("avx2")
            assert _core.quantize_nbits_path() == "avx2"
    finally:
        quantmatmul.set_isa(isa)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_mixed_signed_zero_blocks_follow_onnxruntime(symmetric):
    """A block of zeros of both signs: the first zero is its min and max (MLAS's scan), which decides
    the sign of a symmetric scale. The numpy reference's reductions pick another zero (docs/quantizer.md)."""
    W = np.zeros((64, 4), np.float32)
    W[0::2, 0] = -0.0
    W[1::2, 1] = -0.0
    W[:31, 2] = -0.0
    W[:, 3] = -0.0
    packed, scales, zero_points = ort_quantize(W, 4, 32, symmetric)
    w = quantize_nbits(W, bits=4, block_size=32, symmetric=symmetric)
    np.testing.assert_array_equal(w.B, packed)
    np.testing.assert_array_equal(w.scales.view(np.uint32), scales.view(np.uint32))
    if symmetric:
        assert (w.scales.view(np.uint32)[:, 0] == [0, 0x80000000, 0, 0]).all()  # -(-0) / 8 = +0, -(+0) / 8 = -0
    np.testing.assert_array_equal(w.dequantize(), np.zeros((64, 4), np.float32))


def test_float32_to_16_bit_rounding():
    """The core's float16 / bfloat16 rounding (stored scales): numpy's and ml_dtypes' astype bit for bit."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    specials = np.array(
        [
            0.0,
            -0.0,
            65504,
            65519.996,
            65520,
            65536,
            2.0**-24,
            2.0**-25,
            2.0**-25 * 1.0000001,
            2.0**-14,
            2.0**-14 * (1 - 2**-11),
            1.5 * 2.0**-24,
            np.finfo(np.float32).max,
            np.finfo(np.float32).tiny,
            np.inf,
            -np.inf,
        ],
        np.float32,
    )
    ladder = (2.0 ** np.arange(-30, 20)).astype(np.float32)
    x = np.concatenate([x, specials, -specials, ladder * 1.00048828125, ladder * 1.000977, ladder * 0.99951171875])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_core.round_float32_bits(x, 1), x.astype(np.float16).view(np.uint16))
        np.testing.assert_array_equal(_core.round_float32_bits(x, 2), x.astype(BF16).view(np.uint16))


def test_round_half_away_as_the_core_computes_it():
    """The core's roundf of a code clamped to [0, 255] is trunc(v + (0.5 - 2^-25)) (checked offline for every
    float in [0, 256)); here for the floats within 4096 ulps of each half-integer and of 0.5 - 2^-25."""
    centers = np.concatenate([np.arange(256) + 0.5, [0.5 - 2.0**-25]]).astype(np.float32)
    bits = centers.view(np.uint32)[:, None].astype(np.int64) + np.arange(-4096, 4097)
    v = bits.astype(np.uint32).view(np.float32).ravel()
    v = v[(v >= 0) & (v < 256)]
    expected = np.floor(v.astype(np.float64) + 0.5)  # C roundf for v >= 0, exact in float64
    np.testing.assert_array_equal(np.trunc(v + np.float32(0.5 - 2.0**-25)), expected)
    assert np.trunc(np.float32(0.5 - 2.0**-25) + np.float32(0.5)) == 1  # why not 0.5 itself


@pytest.mark.parametrize(("method", "symmetric"), MODES, ids=MODE_IDS)
def test_core_reads_any_strides(method, symmetric):
    """Reversed, strided and broadcast (zero-stride, read-only) views: the core reads W in place."""
    rng = np.random.default_rng(9)
    base = rng.standard_normal((80, 30)).astype(np.float32)
    views = (
        base[::-1],
        base[:, ::-2],
        base[::-3, 1::2],
        np.broadcast_to(base[:1], (40, 30)),
        base.astype(F16)[::-1, ::-1],
        base.astype(BF16).T.copy().T[5:, 3:],
        base.astype(F64)[::2],
    )
    kw = {"bits": 4, "block_size": 16, "symmetric": symmetric, "method": method}
    for W in views:  # (no zeros: check()'s copy is not needed)
        assert_same(quantize_nbits(W, **kw), quantize_nbits_reference(W, **kw), str(W.strides))
