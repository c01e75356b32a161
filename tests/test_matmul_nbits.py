"""test_matmul_nbits.py: MatMulNBits against the float64 oracle within the documented bounds, against onnxruntime, layout and bad input."""

from __future__ import annotations

import copy
import functools
import platform
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from conftest import kernel_entry

import quantmatmul
from quantmatmul.matmul_nbits import _decode, dequantize_nbits, matmul_nbits
from quantmatmul.nbits_layout import pack_nbits, packed_size, unpack_nbits
from quantmatmul.quantize_nbits import quantize_nbits
from quantmatmul.reference import matmul_nbits as oracle

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
DTYPES = [F32, F16, BF16]
BITS = [2, 3, 4, 5, 6, 7, 8]
BLOCK_SIZES = [16, 32, 64, 128, 256, 512, 1024]
ZP_FORMS = ["none", "packed", "float"]
G_FORMS = [None, "random", "padded", "trivial"]
LEVELS = [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------------------------------
# Cases


class Case:
    """One MatMulNBits problem with random data; B's padded codes (past K) and zero-point padding bits are garbage."""

    def __init__(self, rng, bits, block_size, *, K, N, batch=(3,), zp="none", g=None, bias=False, dtype=F32,
                 legacy=False):
        self.bits, self.block_size, self.K, self.N, self.dtype = bits, block_size, K, N, np.dtype(dtype)
        self.zp_form, self.g_form = zp, g
        kb = self.k_blocks = -(-K // block_size)
        self.B = rng.integers(0, 256, (N, kb, block_size * bits // 8), dtype=np.uint8)
        magnitude = rng.uniform(0.5, 2.0, (N, kb)) * 2.0 ** rng.integers(-6, -1, (N, kb))
        self.scales = (magnitude * rng.choice([-1.0, 1.0], (N, kb))).astype(dtype)
        self.zero_points = None
        if zp == "packed":
            self.zero_points = rng.integers(0, 256, (N, packed_size(kb, bits)), dtype=np.uint8)
        elif zp == "float":
            self.zero_points = (np.round(rng.uniform(0, 2**bits - 1, (N, kb)) * 4) / 4).astype(dtype)
        self.g_idx = None
        if g == "random":
            self.g_idx = rng.integers(0, kb, K).astype(np.int32)
        elif g == "padded":
            self.g_idx = rng.integers(0, kb, kb * block_size).astype(np.int32)
        elif g == "trivial":
            self.g_idx = (np.arange(K) // block_size).astype(np.int32)
        self.bias = rng.normal(size=N).astype(dtype) if bias else None
        self.A = rng.normal(size=tuple(batch) + (K,)).astype(dtype)
        if legacy:
            self.scales = self.scales.reshape(-1)
            if self.zero_points is not None:
                self.zero_points = self.zero_points.reshape(-1)

    @property
    def kw(self):
        return dict(K=self.K, N=self.N, bits=self.bits, block_size=self.block_size)

    def args(self):
        return (self.A, self.B, self.scales, self.zero_points, self.g_idx, self.bias)

    def run(self, level, A=None):
        A = self.A if A is None else A
        return matmul_nbits(A, self.B, self.scales, self.zero_points, self.g_idx, self.bias, **self.kw,
                            accuracy_level=level)

    def exact(self):
        return oracle.matmul_nbits(*self.args(), **self.kw)

    def bound(self, level, out_dtype=None):
        return oracle.error_bound(*self.args(), **self.kw, level=level, out_dtype=out_dtype or self.dtype)

    def replace(self, **changes):
        other = copy.copy(self)
        other.__dict__.update(changes)
        return other

    def __repr__(self):
        return (f"Case(bits={self.bits}, block_size={self.block_size}, K={self.K}, N={self.N}, A={self.A.shape} "
                f"{self.dtype}, zp={self.zp_form}, g_idx={self.g_form}, bias={self.bias is not None})")


def assert_within(Y, reference, tolerance, context):
    Y = np.asarray(Y).astype(np.float64)
    assert Y.shape == reference.shape, f"{context}: shape {Y.shape} != {reference.shape}"
    err = np.abs(Y - reference)
    ok = err <= tolerance
    if not ok.all():
        i = np.unravel_index(np.argmax(np.where(ok, -np.inf, err / tolerance)), err.shape)
        raise AssertionError(f"{context}: {np.count_nonzero(~ok)} of {ok.size} outside; worst at {i}: got {Y[i]!r}, "
                             f"reference {reference[i]!r}, error {err[i]:.3g} > tolerance {tolerance[i]:.3g}")


def tight_tolerance(case, level, out_dtype=None, a_block=None):
    """(y, tol): the exact product y of the level's effective operands A', W' (as the oracle forms them:
    int8 A exactly as ORT quantizes it, or the float16 / bfloat16 roundings), and how far an
    implementation may be from it: final rounding plus float32 arithmetic, no A or W rounding.
    a_block (level 4): A quantized in blocks of that many columns instead of block_size."""
    decoded = oracle.Decoded(case.B, case.scales, case.zero_points, case.g_idx, **case.kw)
    a, w = oracle.effective_operands(case.A, decoded, level)
    if a_block is not None:
        qa, scale = oracle.quantize_a_int8(case.A, case.K, a_block)
        a = qa * scale.astype(np.float64)[:, np.arange(case.K) // a_block]
    bias = np.zeros(case.N) if case.bias is None else case.bias.astype(np.float64)
    y = a @ w.T + bias
    # Levels 0, 1 and 4 may apply the zero point after the sum (the block-factored kernels, as the
    # documented bound allows): their terms scale with |q| and |z| separately, not with |q - z|.
    factored = level in (0, 1, 4)
    magnitude = np.abs(decoded.s) * (np.abs(decoded.q) + np.abs(decoded.z)) if factored else np.abs(w)
    T = np.abs(a) @ magnitude.T + np.abs(bias)
    name = np.dtype(out_dtype or case.dtype).name
    u, eta = oracle.UNIT_ROUNDOFF[name], oracle.HALF_SUBNORMAL[name]
    # and the float32 steps' underflow, as the documented bound has it (oracle.error_bound)
    under = oracle.underflow(np.abs(a), decoded, case.K)
    tol = u * np.abs(y) + (1 + u) * (oracle.gamma(2 * case.K + 24) * T + under) + eta
    shape = case.A.shape[:-1] + (case.N,)
    return y.reshape(shape), tol.reshape(shape)


# --------------------------------------------------------------------------------------------------
# Against the float64 oracle: every bits x block size, every zero-point form, g_idx form, bias, A dtype
# and accuracy level (a rotating covering design inside each bits x block size), within the bounds.


def _sizes(rng, block_size, i):
    """K: mostly a tail (not a multiple of block_size), sometimes exact or below one block."""
    choice = i % 4
    if choice == 0:
        K = block_size * int(rng.integers(1, 3))
    elif choice == 1:
        K = int(rng.integers(1, block_size))
    else:
        K = block_size * int(rng.integers(1, 3)) + int(rng.integers(1, block_size))
    N = int(rng.integers(1, 20))
    batch = [(), (3,), (2, 2), (1,)][i % 4]
    return K, N, batch


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("bits", BITS)
def test_every_configuration_within_the_documented_bounds(bits, block_size):
    rng = np.random.default_rng(bits * 10007 + block_size)
    i = 0
    for zi, zp in enumerate(ZP_FORMS):
        for di, dtype in enumerate(DTYPES):
            for bias in (False, True):
                g = G_FORMS[(zi + di + bits + bias) % len(G_FORMS)]
                K, N, batch = _sizes(rng, block_size, i)
                case = Case(rng, bits, block_size, K=K, N=N, batch=batch, zp=zp, g=g, bias=bias, dtype=dtype,
                            legacy=(i % 5 == 4))
                i += 1
                exact = case.exact()
                for level in LEVELS:
                    Y = case.run(level)
                    assert Y.dtype == case.dtype and Y.shape == case.A.shape[:-1] + (N,), (case, level)
                    assert_within(Y, exact, case.bound(level), f"{case} level {level} vs exact")
                    # Tighter: the level's own effective operands (int8 A exactly as ORT quantizes it, or
                    # the float16 / bfloat16 roundings) multiplied exactly.
                    y_eff, tol = tight_tolerance(case, level)
                    assert_within(Y, y_eff, tol, f"{case} level {level} vs its effective operands")


@pytest.mark.parametrize("level", [0, 4])
def test_the_bound_covers_underflow_in_the_float32_steps(isa, level):
    """Near float32's underflow every product or fused multiply-add may lose up to 2^-150 absolutely:
    the documented bound has a term for it (the fuzzing of the fourteenth session found results 0.75
    and 1 ulp of 2^-149 off under a bound of half an ulp: the portable table's rounded products, the
    x86 tables' block sums scaled by 1.5). The two cases found, then random A and scales near it."""
    ulp = 2.0**-149
    cases = [  # (codes, zero point or None, scale, A in ulps)
        ([11, 10, 7], None, 0.75, [0, -7, -5]),
        ([0, 13, 3, 5], 15, 1.5, [6, 7, -1, 1]),
    ]
    for codes, zp, scale, a in cases:
        K = len(codes)
        B = pack_nbits(np.array([codes + [0] * (16 - K)]), 4).reshape(1, 1, 8)
        zps = None if zp is None else pack_nbits(np.array([[zp]]), 4).reshape(1, 1)
        scales = np.array([[scale]], np.float32)
        A = (np.array([a]) * ulp).astype(np.float32)
        kw = dict(K=K, N=1, bits=4, block_size=16)
        y = matmul_nbits(A, B, scales, zps, **kw, accuracy_level=level)
        exact = oracle.matmul_nbits(A, B, scales, zps, **kw)
        bound = oracle.error_bound(A, B, scales, zps, **kw, level=level, out_dtype=np.float32, exact=exact)
        assert_within(y, exact, bound, f"codes {codes}, level {level}")
    rng = np.random.default_rng(1414)
    for _ in range(6):
        case = Case(rng, 4, 32, K=77, N=19, batch=(5,))
        case.A = (case.A * np.float32(2.0**-130)).astype(np.float32)  # products of 2^-149 and less
        case.scales = (case.scales * np.float32(rng.choice([2.0**-20, 1.0, 2.0**20]))).astype(np.float32)
        assert_within(case.run(level), case.exact(), case.bound(level), f"random, level {level}")


def test_levels_0_and_1_are_identical_and_2_3_4_differ_as_documented():
    rng = np.random.default_rng(1)
    case = Case(rng, 4, 32, K=200, N=16, batch=(5,), zp="packed", dtype=F32)
    y = {level: case.run(level) for level in LEVELS}
    assert np.array_equal(y[0], y[1])
    exact = case.exact()
    errors = {level: np.abs(y[level] - exact).max() for level in LEVELS}
    assert errors[0] < errors[3] and errors[0] < errors[4] and errors[0] < errors[2]


def test_padded_codes_are_ignored_whatever_they_hold():
    rng = np.random.default_rng(2)
    for bits in BITS:
        case = Case(rng, bits, 64, K=64 + 21, N=5, zp="packed", dtype=F32)
        q = unpack_nbits(case.B.reshape(case.N, -1), bits, 2 * 64)
        garbage = []
        for fill in (0, (1 << bits) - 1):
            codes = q.copy()
            codes[:, case.K:] = fill
            garbage.append(pack_nbits(codes, bits).reshape(case.B.shape))
        for level in LEVELS:
            ys = []
            for B in garbage:
                ys.append(matmul_nbits(case.A, B, case.scales, case.zero_points, K=case.K, N=case.N, bits=bits,
                                       block_size=64, accuracy_level=level))
            assert np.array_equal(ys[0], ys[1]), (bits, level)
        W = [dequantize_nbits(B, case.scales, case.zero_points, **case.kw) for B in garbage]
        assert np.array_equal(W[0], W[1])


# --------------------------------------------------------------------------------------------------
# Level 4: the int8 quantization of A is ORT's, bit for bit


def _one_hot_weight(K):
    """B, scales and zero points making W the K x K identity: W[n, k] = (q - 0) * 1 with q one-hot."""
    codes = np.eye(K, dtype=np.int64)
    B = pack_nbits(codes, 4).reshape(K, K // 16, 8)
    scales = np.ones((K, K // 16), np.float32)
    zero_points = np.zeros((K, packed_size(K // 16, 4)), np.uint8)
    return B, scales, zero_points


def test_level4_quantizes_A_like_onnxruntime_ties_to_even():
    B, scales, zp = _one_hot_weight(16)
    a = np.array([[2.5, 3.5, -2.5, -3.5, 0.5, 1.5, 126.5, 127.0, -127.0, 0.49, 0.0, -0.0, 64.5, 65.5, 1.0, 2.0]], np.float32)
    y = matmul_nbits(a, B, scales, zp, K=16, N=16, bits=4, block_size=16, accuracy_level=4)
    # max|a| = 127: scale 1, and a * (127/127) rounds half to even
    assert y.tolist() == [[2, 4, -2, -4, 0, 2, 126, 127, -127, 0, 0, 0, 64, 66, 1, 2]]


def test_level4_uses_127_over_max_not_the_reciprocal_of_the_scale():
    """scale_a = max/127 and the multiplier 127/max are computed separately (ORT's order); find
    values where 1/(max/127) would round a * multiplier differently, and check ours follows ORT."""
    rng = np.random.default_rng(3)
    amax = rng.uniform(1, 2, 20000).astype(np.float32)
    ort_mul = np.float32(127) / amax
    other_mul = np.float32(1) / (amax / np.float32(127))
    j = np.arange(1, 126, dtype=np.float32)
    a = ((j[None, :] + np.float32(0.5)) / ort_mul[:, None]).astype(np.float32)  # near rounding points
    differs = np.rint(a * ort_mul[:, None]) != np.rint(a * other_mul[:, None])
    rows, cols = np.nonzero(differs)
    assert len(rows) >= 3
    B, scales, zp = _one_hot_weight(16)
    for r, c in zip(rows[:5], cols[:5]):
        x = np.zeros((1, 16), np.float32)
        x[0, 0], x[0, 1] = amax[r], a[r, c]
        y = matmul_nbits(x, B, scales, zp, K=16, N=16, bits=4, block_size=16, accuracy_level=4)
        qa, scale = oracle.quantize_a_int8(x, 16, 16)
        assert qa[0, 1] == np.rint(a[r, c] * ort_mul[r]) != np.rint(a[r, c] * other_mul[r])
        assert y[0, 1] == np.float32(scale[0, 0] * np.float32(qa[0, 1]))


def test_level4_quantizes_a_tall_A_row_by_row_like_the_oracle():
    """A is quantized in row tasks on the thread pool (1024 rows of K = 16 per task): every row of
    every task, ties included, as the oracle does, with the blocks' non-finite and tiny cases mixed in."""
    B, scales, zp = _one_hot_weight(16)
    rng = np.random.default_rng(11)
    amax = rng.uniform(0.5, 4, 3001).astype(np.float32)
    a = (rng.integers(-254, 255, (3001, 16)) / np.float32(254) * amax[:, None]).astype(np.float32)  # many ties
    a[:, 0] = amax
    a[5, 3], a[2000, 7], a[2999, :2] = np.nan, -np.inf, [1e-38, -5e-39]
    before = quantmatmul.get_num_threads()
    quantmatmul.set_num_threads(2)
    try:
        y = matmul_nbits(a, B, scales, zp, K=16, N=16, bits=4, block_size=16, accuracy_level=4)
    finally:
        quantmatmul.set_num_threads(before)
    finite = np.isfinite(a).all(axis=1)
    qa, scale = oracle.quantize_a_int8(a[finite], 16, 16)
    assert np.array_equal(y[finite], (scale * qa.astype(np.float32)).astype(np.float32))
    assert np.isnan(y[~finite]).all()


def test_level4_tiny_blocks_and_non_finite_rows():
    B, scales, zp = _one_hot_weight(16)
    a = np.zeros((3, 16), np.float32)
    a[0, :2] = [1e-38, -5e-39]  # 127 / max|a| overflows float32: the exact ratio is used
    a[1, 3] = np.nan
    a[2, 0] = np.inf
    y = matmul_nbits(a, B, scales, zp, K=16, N=16, bits=4, block_size=16, accuracy_level=4)
    assert np.all(np.isfinite(y[0]))
    np.testing.assert_allclose(y[0, :2], a[0, :2], rtol=0, atol=1e-38 / 254 * 1.01)
    assert np.all(np.isnan(y[1])) and np.all(np.isnan(y[2]))
    # levels 0..3 propagate NaN / inf through the product as usual, without warnings
    for level in (0, 2, 3):
        y = matmul_nbits(a, B, scales, zp, K=16, N=16, bits=4, block_size=16, accuracy_level=level)
        assert np.isnan(y[1]).any()


# --------------------------------------------------------------------------------------------------
# dequantize_nbits and the layout


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_matches_the_oracle_bit_for_bit(bits):
    rng = np.random.default_rng(bits)
    combos = [(bs, zp, dtype) for bs in BLOCK_SIZES for zp in ZP_FORMS for dtype in DTYPES]
    for i, (block_size, zp, dtype) in enumerate(combos):
        g = G_FORMS[i % len(G_FORMS)]
        K = block_size * (1 + i % 2) + (i * 7) % block_size
        case = Case(rng, bits, block_size, K=K, N=1 + i % 9, zp=zp, g=g, dtype=dtype, legacy=(i % 4 == 3))
        W = dequantize_nbits(case.B, case.scales, case.zero_points, case.g_idx, **case.kw)
        expected = oracle.dequantize_float32(case.B, case.scales, case.zero_points, case.g_idx, **case.kw)
        assert W.dtype == F32 and W.shape == (case.K, case.N) and W.flags.c_contiguous
        assert np.array_equal(W.view(np.uint32), expected.view(np.uint32)), case
        if case.zp_form != "float":  # integer zero points: float32(q - zp) is exact, one rounding in all
            exact = oracle.dequantize(case.B, case.scales, case.zero_points, case.g_idx, **case.kw)
            assert np.array_equal(W, exact.astype(np.float32)), case


def test_dequantize_of_known_codes():
    codes = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] * 2])
    B = pack_nbits(codes, 4).reshape(1, 2, 8)
    assert B[0, 0, 0] == 0x10  # first code in the low nibble
    scales = np.array([[0.5, -2.0]], np.float32)
    zp = pack_nbits(np.array([[3, 12]]), 4)  # one byte: block 0 low nibble, block 1 high nibble
    assert zp.tolist() == [[0xC3]]
    W = dequantize_nbits(B, scales, zp, K=32, N=1, bits=4, block_size=16)
    np.testing.assert_array_equal(W[:16, 0], (np.arange(16) - 3) * 0.5)
    np.testing.assert_array_equal(W[16:, 0], (np.arange(16) - 12) * -2.0)
    W = dequantize_nbits(B, scales, K=32, N=1, bits=4, block_size=16)  # default zero point 8
    np.testing.assert_array_equal(W[:16, 0], (np.arange(16) - 8) * 0.5)
    g = np.array([1] * 16 + [0] * 16, np.int32)  # act-order: only the scale / zero point lookup moves
    W = dequantize_nbits(B, scales, zp, g, K=32, N=1, bits=4, block_size=16)
    np.testing.assert_array_equal(W[:16, 0], (np.arange(16) - 12) * -2.0)
    np.testing.assert_array_equal(W[16:, 0], (np.arange(16) - 3) * 0.5)


@pytest.mark.parametrize("bits", BITS)
def test_pack_unpack_round_trips_and_decoders_agree(bits):
    rng = np.random.default_rng(100 + bits)
    for count in (16, 48, 1024):
        codes = rng.integers(0, 1 << bits, (7, count))
        packed = pack_nbits(codes, bits)
        assert packed.shape == (7, packed_size(count, bits))
        assert np.array_equal(unpack_nbits(packed, bits, count), codes)
        assert np.array_equal(_decode(packed, bits, count), codes)
        assert np.array_equal(oracle._read_codes(packed, count, bits), codes)
        for n in range(7):
            assert [oracle.read_code(packed[n], i, bits) for i in range(0, count, 5)] == codes[n, ::5].tolist()
    # odd k_blocks: every row of packed zero points is padded on its own, not one flat stream
    kb = 3
    zp = rng.integers(0, 1 << bits, (5, kb))
    packed = pack_nbits(zp, bits)
    assert packed.shape == (5, packed_size(kb, bits))
    B = np.zeros((5, kb, 16 * bits // 8), np.uint8)
    W = dequantize_nbits(B, np.ones((5, kb), np.float32), packed, K=16 * kb, N=5, bits=bits, block_size=16)
    np.testing.assert_array_equal(W[::16].T, -zp)


def test_legacy_shapes_and_g_idx_lengths_agree():
    rng = np.random.default_rng(5)
    for zp in ZP_FORMS:
        case = Case(rng, 4, 32, K=70, N=6, zp=zp, g="padded")
        flat = case.zero_points.reshape(-1) if case.zero_points is not None else None
        y1 = case.run(0)
        y2 = matmul_nbits(case.A, case.B, case.scales.reshape(-1), flat, case.g_idx, **case.kw)
        y3 = matmul_nbits(case.A, case.B, case.scales, case.zero_points, case.g_idx[: case.K], **case.kw)
        assert np.array_equal(y1, y2) and np.array_equal(y1, y3)
    # a trivial g_idx is the same as none
    case = Case(rng, 4, 32, K=70, N=6, zp="packed", g="trivial")
    y = case.run(4)
    assert np.array_equal(y, matmul_nbits(case.A, case.B, case.scales, case.zero_points, **case.kw, accuracy_level=4))


def test_shapes_one_d_batched_and_empty():
    rng = np.random.default_rng(6)
    case = Case(rng, 4, 16, K=40, N=3, batch=(2, 3, 4))
    for level in LEVELS:
        y = case.run(level)
        assert y.shape == (2, 3, 4, 3)
        flat = matmul_nbits(case.A.reshape(-1, 40), *case.args()[1:], **case.kw, accuracy_level=level)
        assert np.array_equal(y.reshape(-1, 3), flat)
        one = matmul_nbits(case.A[1, 2, 3], *case.args()[1:], **case.kw, accuracy_level=level)
        assert one.shape == (3,)  # BLAS may sum a lone row in another order: equal within the bound
        single = case.replace(A=case.A[1, 2, 3])
        assert_within(one, single.exact(), single.bound(level), f"1-D A, level {level}")
        empty = matmul_nbits(np.zeros((0, 40), np.float32), *case.args()[1:], **case.kw, accuracy_level=level)
        assert empty.shape == (0, 3) and empty.dtype == F32


def test_large_block_and_many_blocks_are_exact_integer_dots_at_level4():
    """block_size 1024 (> 512: the int8 dots are split into exact spans) and a long K, against the oracle."""
    rng = np.random.default_rng(7)
    for block_size, K in ((1024, 3000), (2048, 2100), (16, 4096)):
        case = Case(rng, 8, block_size, K=K, N=9, batch=(2,), zp="packed", bias=True)
        y_eff, tol = tight_tolerance(case, 4)
        assert_within(case.run(4), y_eff, tol, repr(case))


def test_memory_does_not_grow_like_m_k_n():
    rng = np.random.default_rng(8)
    M, K, N = 256, 1024, 1024  # M*K*N float32 would be 1 GiB
    B = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
    scales = rng.uniform(-1, 1, (N, K // 32)).astype(np.float32)
    A = rng.normal(size=(M, K)).astype(np.float32)
    for level in (0, 2, 4):
        tracemalloc.start()
        matmul_nbits(A, B, scales, K=K, N=N, bits=4, block_size=32, accuracy_level=level)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 48 << 20, (level, peak)


# --------------------------------------------------------------------------------------------------
# Inputs: never modified; read-only and non-contiguous accepted


def test_inputs_unmodified_read_only_and_non_contiguous():
    rng = np.random.default_rng(9)
    for zp, g, dtype in (("packed", "random", F32), ("float", None, F16), ("none", "padded", BF16)):
        case = Case(rng, 4, 32, K=90, N=7, batch=(4,), zp=zp, g=g, bias=True, dtype=dtype)
        args = list(case.args())
        copies = [None if x is None else x.copy() for x in args]
        expected = {level: case.run(level) for level in LEVELS}
        for x in args:
            if x is not None:
                x.setflags(write=False)
        W = dequantize_nbits(*args[1:5], **case.kw)
        for level in LEVELS:
            assert np.array_equal(matmul_nbits(*args, **case.kw, accuracy_level=level), expected[level])
        for x, c in zip(args, copies):
            assert (x is None and c is None) or (x.dtype == c.dtype and np.array_equal(x.view(np.uint8), c.view(np.uint8)))

        def strided(x):  # the same values as a non-contiguous view
            if x is None:
                return None
            big = np.zeros(x.shape + (2,), x.dtype)
            big[..., 0] = x
            return big[..., 0]

        views = [strided(x) for x in args]
        A_fortran = np.asfortranarray(args[0])
        assert not views[1].flags.c_contiguous
        for level in LEVELS:
            assert np.array_equal(matmul_nbits(*views, **case.kw, accuracy_level=level), expected[level])
            assert np.array_equal(matmul_nbits(A_fortran, *args[1:], **case.kw, accuracy_level=level), expected[level])
        assert np.array_equal(dequantize_nbits(*views[1:5], **case.kw), W)


# --------------------------------------------------------------------------------------------------
# Bad input: TypeError / ValueError, message starting with the function name


def _good(**over):
    base = dict(A=np.zeros((2, 64), np.float32), B=np.zeros((8, 2, 16), np.uint8), scales=np.ones((8, 2), np.float32),
                zero_points=None, g_idx=None, bias=None, K=64, N=8, bits=4, block_size=32, accuracy_level=0)
    base.update(over)
    return base


BAD = [
    (dict(B=np.zeros((8, 2, 15), np.uint8)), ValueError,
     r"matmul_nbits: B has shape \(8, 2, 15\), expected \(8, 2, 16\) for K=64, bits=4, block_size=32"),
    (dict(B=np.zeros((8, 2, 16), np.int8)), TypeError, "matmul_nbits: B dtype int8"),
    (dict(B=np.zeros((8, 32), np.uint8)), ValueError, r"matmul_nbits: B has shape \(8, 32\)"),
    (dict(bits=1), ValueError, "matmul_nbits: bits must be in 2..8, got 1"),
    (dict(bits=9), ValueError, "matmul_nbits: bits must be in 2..8, got 9"),
    (dict(bits=4.0), TypeError, "matmul_nbits: bits must be an integer"),
    (dict(bits=True), TypeError, "matmul_nbits: bits must be an integer"),
    (dict(block_size=48), ValueError, "matmul_nbits: block_size must be a power of two >= 16, got 48"),
    (dict(block_size=8), ValueError, "matmul_nbits: block_size must be a power of two >= 16, got 8"),
    (dict(K=65), ValueError, r"matmul_nbits: A has shape \(2, 64\), its last dimension must be K=65"),
    (dict(K=0), ValueError, "matmul_nbits: K and N must be positive"),
    (dict(N=7), ValueError, r"matmul_nbits: B has shape \(8, 2, 16\), expected \(7, 2, 16\)"),
    (dict(A=np.zeros((2, 64), np.float64)), TypeError, "matmul_nbits: A dtype float64 is not supported"),
    (dict(A=np.zeros((2, 64), np.int32)), TypeError, "matmul_nbits: A dtype int32 is not supported"),
    (dict(A=np.float32(1)), ValueError, "matmul_nbits: A must have at least 1 dimension"),
    (dict(scales=np.ones((8, 2), np.float16)), TypeError, "matmul_nbits: scales dtype float16 does not match A dtype float32"),
    (dict(scales=np.ones((8, 3), np.float32)), ValueError, r"matmul_nbits: scales has shape \(8, 3\), expected \(8, 2\) or \(16,\)"),
    (dict(scales=np.ones((2, 8), np.float32)), ValueError, r"matmul_nbits: scales has shape \(2, 8\)"),
    (dict(zero_points=np.zeros((8, 2), np.uint8)), ValueError,
     r"matmul_nbits: zero_points has shape \(8, 2\), expected packed uint8 \(8, 1\) .*\(uint8 zero points are packed"),
    (dict(zero_points=np.zeros((8, 2), np.float16)), TypeError,
     "matmul_nbits: zero_points dtype float16 does not match scales dtype float32"),
    (dict(zero_points=np.zeros((8, 3), np.float32)), ValueError, r"matmul_nbits: zero_points has shape \(8, 3\)"),
    (dict(zero_points=np.zeros((8, 2), np.int8)), TypeError, "matmul_nbits: zero_points dtype int8 is not supported"),
    (dict(g_idx=np.zeros(63, np.int32)), ValueError, r"matmul_nbits: g_idx has shape \(63,\), expected \(64,\) for K=64"),
    (dict(g_idx=np.full(64, 2, np.int32)), ValueError, r"matmul_nbits: g_idx values must lie in \[0, 2\) \(k_blocks\), got 2"),
    (dict(g_idx=np.full(64, -1, np.int32)), ValueError, r"matmul_nbits: g_idx values must lie in \[0, 2\)"),
    (dict(g_idx=np.zeros(64, np.float32)), TypeError, "matmul_nbits: g_idx dtype float32 is not supported"),
    (dict(bias=np.zeros(7, np.float32)), ValueError, r"matmul_nbits: bias has shape \(7,\), expected \(8,\)"),
    (dict(bias=np.zeros(8, np.float16)), TypeError, "matmul_nbits: bias dtype float16 does not match A dtype float32"),
    (dict(accuracy_level=5), ValueError, "matmul_nbits: accuracy_level must be one of 0, 1, 2, 3, 4, got 5"),
    (dict(accuracy_level=-1), ValueError, "matmul_nbits: accuracy_level must be one of"),
    (dict(accuracy_level="4"), ValueError, "matmul_nbits: accuracy_level must be one of"),
]


@pytest.mark.parametrize("over, exc, message", BAD)
def test_bad_input_is_rejected_with_the_function_name(over, exc, message):
    kw = _good(**over)
    args = [kw.pop(k) for k in ("A", "B", "scales", "zero_points", "g_idx", "bias")]
    with pytest.raises(exc, match="^" + message):
        matmul_nbits(*args, **kw)


@pytest.mark.parametrize("over, exc, message", [
    (dict(bits=3), ValueError, r"dequantize_nbits: B has shape \(8, 2, 16\), expected \(8, 2, 12\) for K=64, bits=3"),
    (dict(block_size=100), ValueError, "dequantize_nbits: block_size must be a power of two"),
    (dict(scales=np.ones((8, 2), np.float64)), TypeError, "dequantize_nbits: scales dtype float64 is not supported"),
    (dict(zero_points=np.zeros((8, 2), ml_dtypes.bfloat16)), TypeError,
     "dequantize_nbits: zero_points dtype bfloat16 does not match scales dtype float32"),
    (dict(g_idx=np.array([5] * 64)), ValueError, r"dequantize_nbits: g_idx values must lie in \[0, 2\)"),
])
def test_dequantize_bad_input(over, exc, message):
    kw = _good(**over)
    for k in ("A", "bias", "accuracy_level"):
        kw.pop(k)
    args = [kw.pop(k) for k in ("B", "scales", "zero_points", "g_idx")]
    with pytest.raises(exc, match="^" + message):
        dequantize_nbits(*args, **kw)


def test_float_zero_points_in_bfloat16_and_float16_scales_are_accepted():
    rng = np.random.default_rng(10)
    for dtype in (F16, BF16):
        case = Case(rng, 3, 16, K=20, N=3, zp="float", dtype=dtype)
        W = dequantize_nbits(case.B, case.scales, case.zero_points, **case.kw)
        assert np.array_equal(W, oracle.dequantize_float32(case.B, case.scales, case.zero_points, None, **case.kw))


# --------------------------------------------------------------------------------------------------
# Differential against onnxruntime (com.microsoft MatMulNBits, CPU EP), B and its parameters as initializers

ort = pytest.importorskip("onnxruntime")
from peer_deviations import deviation, peer_refuses, pinned  # noqa: E402

from quantmatmul.peers import run_matmul_nbits_onnxruntime  # noqa: E402

ort.set_default_logger_severity(4)
ORT_BITS, ORT_BLOCK_SIZES, ORT_DTYPES = [2, 4, 8], [16, 32, 64, 128, 256], [F32, F16]
X86 = platform.machine().lower() in ("x86_64", "amd64")
# The pinned ORT's refusals (ORT 1.31 refused 8-bit float zero points when run, "Only 2b and 4b ...")
EIGHT_BIT_FLOAT_ZP = "MatMulNBits on CPU does not support 8-bit weights with floating-point zero points"


def run_ort(case, level):
    """ONNX Runtime's MatMulNBits with the case's weight as constant initializers (as real models have it)."""
    return run_matmul_nbits_onnxruntime(*case.args(), **case.kw, accuracy_level=level)


def ort_uses_int8(case, level):
    """Whether ORT's CPU EP takes an int8 (CompInt8) kernel: docs/matmul_nbits.md, ORT kernel table (x86)."""
    if level != 4 or case.g_idx is not None or case.zp_form == "float":
        return False
    return case.block_size in ((32, 64, 128) if case.bits == 2 else (16, 32, 64, 128, 256))


@pytest.mark.parametrize("bits", ORT_BITS)
def test_onnxruntime_agrees_within_the_documented_bounds(bits):
    rng = np.random.default_rng(1000 + bits)
    grid = [(bs, zp, dtype, level, bias) for bs in ORT_BLOCK_SIZES for zp in ZP_FORMS for dtype in ORT_DTYPES
            for level in (0, 4) for bias in (False, True)]
    for i, (block_size, zp, dtype, level, bias) in enumerate(grid):
        K = 2 * block_size + 1 + (i * 37) % (block_size - 1)  # a tail, garbage in the padded codes
        if i % 4 == 3:
            K = block_size * (1 + i % 3)  # no tail
        case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 24)), batch=[(5,), (2, 3), ()][i % 3],
                    zp=zp, bias=bias, dtype=dtype, legacy=i % 7 == 6)
        if bits == 8 and zp == "float":
            # Deviation: ORT has no 8-bit float-zero-point kernel (1.32 refuses the model, 1.31 refused the run
            # with "Only 2b and 4b quantization is supported")
            run = lambda case=case, level=level: run_ort(case, level)
            refused, y_ort = peer_refuses("ort-nbits-8bit-float-zp", run, EIGHT_BIT_FLOAT_ZP)
            if refused:
                continue
        else:
            y_ort = run_ort(case, level)
        assert y_ort.dtype == case.dtype and y_ort.shape == case.A.shape[:-1] + (case.N,)
        assert_within(y_ort, case.exact(), case.bound(level), f"ORT {case} level {level} vs exact")
        ours = case.run(level)
        assert_within(ours, case.exact(), case.bound(level), f"ours {case} level {level} vs exact")
        if X86 and not (bits == 8 and zp == "float"):  # (a kernel that no ORT checked has)
            # Tighter, naming the kernel: the int8 kernels quantize A exactly as our level 4
            # does; every other path is our level 0 (fp16 A is widened to float32).
            same = 4 if ort_uses_int8(case, level) else 0
            y_eff, tol = tight_tolerance(case, same)
            assert_within(y_ort, y_eff, 2 * tol, f"ORT {case} level {level} vs our level {same} operands")
            assert_within(case.run(same), y_eff, tol, f"ours {case} level {same}")


def test_onnxruntime_g_idx_four_bit_float_or_no_zero_points_agree():
    rng = np.random.default_rng(11)
    for zp in ("none", "float"):
        for dtype in ORT_DTYPES:
            for level in (0, 4):
                case = Case(rng, 4, 32, K=100, N=9, zp=zp, g="random", bias=True, dtype=dtype)
                y_ort = run_ort(case, level)
                assert_within(y_ort, case.exact(), case.bound(level), repr(case))
                y_eff, tol = tight_tolerance(case, 0)  # g_idx: ORT dequantizes and runs SGEMM at any level
                assert_within(y_ort, y_eff, 2 * tol, repr(case))


def test_onnxruntime_deviation_g_idx_ignores_uint8_zero_points():
    """ORT's 4-bit g_idx dequantizer unpacks uint8 zero points and never uses them: it applies 8."""
    rng = np.random.default_rng(12)
    for dtype in ORT_DTYPES:
        for g in ("random", "trivial"):
            case = Case(rng, 4, 32, K=100, N=9, zp="packed", g=g, dtype=dtype)
            y_ort = run_ort(case, 0)
            wrong = np.abs(y_ort.astype(np.float64) - case.exact()) > case.bound(0)
            if deviation("ort-nbits-g-idx-uint8-zp", wrong.any()):
                without = case.replace(zero_points=None, zp_form="none")
                assert_within(y_ort, without.exact(), without.bound(0), f"ORT {case} as if zero_points were absent")
            else:
                assert_within(y_ort, case.exact(), case.bound(0), f"ORT {case}")


def test_onnxruntime_deviation_two_bit_g_idx_is_decoded_as_four_bit():
    """ORT's 2-bit g_idx path runs the 4-bit dequantizer: B is read as 4-bit codes with the 4-bit row
    stride (rows past N/2 read beyond B), zero point 8, scales looked up through g_idx."""
    rng = np.random.default_rng(13)
    for zp in ("none", "packed"):
        case = Case(rng, 2, 32, K=100, N=8, zp=zp, g="random")
        y_ort = run_ort(case, 0)
        if deviation("ort-nbits-2bit-g-idx", (np.abs(y_ort.astype(np.float64) - case.exact()) > case.bound(0)).any()):
            half = case.N // 2
            as4 = case.B.reshape(-1)[: half * case.k_blocks * 16].reshape(half, case.k_blocks, 16)
            expected = matmul_nbits(case.A, as4, case.scales[:half], None, case.g_idx, K=case.K, N=half, bits=4,
                                    block_size=32)
            np.testing.assert_allclose(y_ort[..., :half], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    case = Case(rng, 2, 32, K=100, N=8, zp="float", g="random")
    refused, y_ort = peer_refuses("ort-nbits-2bit-g-idx", lambda: run_ort(case, 0), "g_idx .* not supported for 2-bit")
    if not refused:
        assert_within(y_ort, case.exact(), case.bound(0), repr(case))


def test_onnxruntime_deviation_eight_bit_g_idx_is_rejected():
    rng = np.random.default_rng(14)
    case = Case(rng, 8, 32, K=100, N=8, g="random")
    refused, y_ort = peer_refuses("ort-nbits-8bit-g-idx", lambda: run_ort(case, 0),
                                  "Only 2b and 4b quantization is supported")
    if not refused:
        assert_within(y_ort, case.exact(), case.bound(0), repr(case))
    assert_within(case.run(0), case.exact(), case.bound(0), repr(case))


@pytest.mark.parametrize("block_size", [512, 1024])
def test_onnxruntime_deviation_block_sizes_above_256(block_size):
    """ORT 1.26 returned zeros for block_size > 256 (onnxruntime#28551); 1.31 refused the model; 1.32 computes
    4 and 8 bits (at level 4 with A quantized in blocks of 256) and refuses 2 bits and g_idx."""
    rng = np.random.default_rng(block_size)
    for bits in (2, 4, 8):
        for zp in ("none", "packed", "float") if bits != 8 else ("none", "packed"):
            for dtype in ORT_DTYPES:
                for level in (0, 4):
                    K = block_size + 100 if level == 0 else 2 * block_size + 3
                    case = Case(rng, bits, block_size, K=K, N=5, zp=zp, bias=True, dtype=dtype)
                    key = "ort-nbits-block-over-256-2bit" if bits == 2 else "ort-nbits-block-over-256"
                    message = ("2-bit MatMulNBits block_size must not exceed 256" if bits == 2
                               else "Only block sizes 16, 32, 64, 128, and 256 are supported")
                    refused, y_ort = peer_refuses(key, lambda case=case, level=level: run_ort(case, level), message)
                    if refused:
                        continue
                    assert_within(y_ort, case.exact(), case.bound(level), f"ORT {case} level {level} vs exact")
                    if X86 and pinned("onnxruntime"):
                        # The kernel 1.32 takes: float32 (our level 0), or at level 4 without float zero points
                        # its int8 kernel, with A quantized in blocks of 256 (ours: one block of block_size)
                        int8 = level == 4 and zp != "float"
                        y_eff, tol = tight_tolerance(case, 4 if int8 else 0, a_block=256 if int8 else None)
                        assert_within(y_ort, y_eff, 2 * tol, f"ORT {case} level {level} vs its kernel's operands")
    case = Case(rng, 4, block_size, K=block_size + 100, N=5, g="random")
    refused, y_ort = peer_refuses("ort-nbits-block-over-256-g-idx", lambda: run_ort(case, 0),
                                  "g_idx does not support block_size > 256|Only block sizes 16, 32, 64, 128, and 256")
    if not refused:
        assert_within(y_ort, case.exact(), case.bound(0), repr(case))
    case = Case(rng, 4, block_size, K=block_size + 100, N=5)
    for level in LEVELS:
        assert_within(case.run(level), case.exact(), case.bound(level), repr(case))


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
def test_onnxruntime_deviation_bits_other_than_2_4_8(bits):
    rng = np.random.default_rng(bits)
    case = Case(rng, bits, 32, K=70, N=5, zp="packed")
    refused, y_ort = peer_refuses("ort-nbits-bits", lambda: run_ort(case, 0), "[Bb]its")
    if not refused:
        assert_within(y_ort, case.exact(), case.bound(0), repr(case))
    assert_within(case.run(0), case.exact(), case.bound(0), repr(case))


def test_onnxruntime_deviation_no_bfloat16_on_cpu():
    rng = np.random.default_rng(15)
    case = Case(rng, 4, 32, K=64, N=4, dtype=BF16)
    refused, y_ort = peer_refuses("ort-nbits-bfloat16", lambda: run_ort(case, 0),
                                  "NOT_IMPLEMENTED|Could not find an implementation")
    if not refused:
        assert_within(y_ort, case.exact(), case.bound(0), repr(case))
    assert_within(case.run(0), case.exact(), case.bound(0), repr(case))


# --------------------------------------------------------------------------------------------------
# The native kernels (levels 0, 1 and 4): every kernel path this machine has, within the same bounds.


def test_native_paths_within_the_documented_bounds(isa):
    """Few rows of A (decode: 1..5 rows), every width, block sizes 16..1024, every zero-point form,
    with and without a g_idx, every level."""
    rng = np.random.default_rng(77)
    for bits in BITS:
        for block_size in (16, 32, 128, 1024):
            for zp in ZP_FORMS:
                K = int(rng.integers(1, 3 * block_size))
                N = int(rng.integers(1, 37))  # 4-column groups and 16-column tasks with tails
                g = "random" if zp == "float" else None  # a non-trivial g_idx: levels 0-3 in C++ too
                case = Case(rng, bits, block_size, K=K, N=N, batch=(int(rng.integers(1, 6)),), zp=zp, g=g,
                            bias=bool(rng.integers(0, 2)))
                exact = case.exact()
                for level in (0, 1, 2, 3, 4):
                    assert_within(case.run(level), exact, case.bound(level), f"{isa} {case} level {level}")
                    y_eff, tol = tight_tolerance(case, level)
                    assert_within(case.run(level), y_eff, tol, f"{isa} {case} level {level} tight")


def test_native_prefill_paths_within_the_documented_bounds(isa):
    """Many rows of A (4..39): level 4's few-row kernel and its int8 GEMM (8+ rows: groups of 4 and
    row tails), level 0's factored passes and 6-row tiles with their tails, every width, short and
    long blocks, columns past 16."""
    rng = np.random.default_rng(78)
    for bits in BITS:
        for block_size in (16, 32, 64, 256):
            # Every row path: level 4's few-row kernel (< 8) and GEMM, level 0's factored passes
            # (<= 12) and 6-row tiles.
            M = int(rng.integers(*{16: (4, 8), 32: (13, 40), 64: (5, 13), 256: (8, 40)}[block_size]))
            K = int(rng.integers(block_size // 2, 5 * block_size))
            case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 50)), batch=(M,),
                        zp=ZP_FORMS[int(rng.integers(0, len(ZP_FORMS)))], bias=bool(rng.integers(0, 2)),
                        g="random" if bits % 2 else None)
            for level in (0, 2, 3, 4):
                y_eff, tol = tight_tolerance(case, level)
                assert_within(case.run(level), y_eff, tol, f"{isa} {case} level {level} tight")
                assert_within(case.run(level), case.exact(), case.bound(level), f"{isa} {case} level {level}")


# --------------------------------------------------------------------------------------------------
# The AVX-512 VNNI and AMX level-4 kernels (nbits_int8_avx512vnni.cpp, nbits_int8_amx.cpp): emulated
# over SIMDe (and the AMX tile emulation) on any AVX2 machine, and natively where the CPU has the
# ISA. Their float32 epilogue is the AVX2 kernels', operation for operation, so the entries must
# agree bit for bit on every path; the integer dot products are checked exactly that way (a wrong
# product by one unit hides inside the bounds). The AMX entry runs the VNNI kernels below 16 rows.


def _levels(*names):
    import quantmatmul

    here = quantmatmul.available_isas() + quantmatmul.emulated_isas()
    return [isa for isa in names if isa in here and "avx2" in here]


def _select_nbits_entry(isa):
    """Selects the level `isa` and checks that MatMulNBits runs its own entry there; returns the level before.
    At level avx512_vnni, AVX512-BF16 is hidden (at level amx, AMX-BF16): else the avx512bf16
    (amxbf16) entry, which differs only in its level-3 prefill (tests/test_nbits_bf16.py), would run
    instead. _restore undoes both."""
    import quantmatmul

    before = quantmatmul.cpu_info()["isa"]
    quantmatmul.set_isa(isa)
    if isa.startswith("avx512_vnni"):
        quantmatmul._core.hide_features(["avx512_bf16"])
    if isa.startswith("amx"):
        quantmatmul._core.hide_features(["amx_bf16"])
    assert quantmatmul.cpu_info()["kernels"]["nbits"] == isa
    return before


def _restore(before):
    import quantmatmul

    quantmatmul._core.hide_features([])
    quantmatmul.set_isa(before)


_WIDE = _levels("avx512_vnni-emulated", "avx512_vnni", "amx-emulated", "amx")
_AMX = _levels("amx-emulated", "amx")


@pytest.fixture(params=_WIDE or [pytest.param(None, marks=pytest.mark.skip(reason="no AVX-512 VNNI or AMX entry"))])
def vnni(request):
    """Selects the AVX-512 VNNI or the AMX MatMulNBits entry (emulated, and native where the CPU has it)."""

    before = _select_nbits_entry(request.param)
    yield request.param
    _restore(before)


@pytest.fixture(params=_AMX or [pytest.param(None, marks=pytest.mark.skip(reason="no AMX entry"))])
def amx(request):
    """Selects the AMX MatMulNBits entry (emulated, and native where the CPU has AMX)."""

    before = _select_nbits_entry(request.param)
    yield request.param
    _restore(before)


def _under(isa, fn):
    import quantmatmul

    before = quantmatmul.cpu_info()["isa"]
    quantmatmul.set_isa(isa)
    try:
        return fn()
    finally:
        quantmatmul.set_isa(before)


@pytest.mark.parametrize("bits", BITS)
def test_vnni_level4_equals_avx2_bit_for_bit(vnni, bits):
    """Every width x block sizes 16..256 x rows 1, 3, 7 (per-column kernel) and 8, 9, 33 (GEMM: groups
    of 8 and row tails; the AMX entry: 33 on the tiles, a group of 32 and one row in a padded group of
    16, the rest on the VNNI kernels) x every zero-point form: the same bits as the AVX2 entry, and within the tight
    tolerance of the exact product of the level's operands. K: 1 to 19 blocks (whole groups of 8
    blocks and the blocks left over), mostly with a tail; N up to 40 (two tasks and a column tail)."""
    rng = np.random.default_rng(4000 + bits)
    for block_size in (16, 32, 64, 128, 256):
        for M in (1, 3, 7, 8, 9, 33):
            for zp in ZP_FORMS:
                K = block_size * int(rng.integers(1, 20)) - int(rng.integers(0, block_size // 2 + 1))
                case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 41)), batch=(M,), zp=zp,
                            bias=bool(rng.integers(0, 2)))
                y = case.run(4)
                expected = _under("avx2", lambda case=case: case.run(4))
                assert np.array_equal(y.view(np.uint32), expected.view(np.uint32)), f"{vnni} {case} vs avx2"
                y_eff, tol = tight_tolerance(case, 4)
                assert_within(y, y_eff, tol, f"{vnni} {case} tight")


@pytest.mark.parametrize("bits", BITS)
def test_vnni_level4_extreme_codes_and_activations(vnni, bits):
    """Codes all at their maximum (every bit of B set) against A at +-max|a| (qa = +-127): per block
    |sum qa * q| reaches 127 * (2^bits - 1) * block_size, and with 8-bit codes a pair of products
    (2 * 255 * 127) overflows int16, where vpmaddubsw would saturate. All-positive, all-negative and
    alternating-sign rows, every row regime (33: the AMX entry's tiles), groups of 8 blocks and
    blocks left over: the AVX2 entry's bits, and within the tight tolerance of the exact product."""
    rng = np.random.default_rng(5000 + bits)
    for block_size in (16, 32, 64, 256):
        for M in (1, 5, 8, 12, 33):
            K, N = 12 * block_size, 19  # 12 blocks: a group of 8 and 4 left over
            signs = np.ones((M, K), np.float32)
            signs[1::3] = -1.0
            signs[2::3, 1::2] = -1.0
            for zp in ("none", "packed"):
                case = Case(rng, bits, block_size, K=K, N=N, batch=(M,), zp=zp).replace(
                    A=signs * 3.0,  # max|a| = 3 in every block: qa = +-127
                    B=np.full((N, K // block_size, block_size * bits // 8), 255, np.uint8),
                    scales=np.ones((N, K // block_size), np.float32))
                if zp == "packed":  # zero points 0: nothing offsets the products
                    case = case.replace(zero_points=np.zeros_like(case.zero_points))
                y = case.run(4)
                assert np.array_equal(y, _under("avx2", lambda case=case: case.run(4))), (vnni, bits, block_size, M, zp)
                held = quantmatmul.MatMulNBits(case.B, case.scales, case.zero_points, **case.kw, accuracy_level=4)
                assert np.array_equal(held(case.A), y), ("packed", vnni, bits, block_size, M, zp)  # few-row kernel
                y_eff, tol = tight_tolerance(case, 4)
                assert_within(y, y_eff, tol, f"{vnni} bits {bits} block {block_size} M {M} zp {zp}")


# The AMX entry's tiles: groups of 32 rows (2 x 2 tiles; 1 x 2 for a last group of 16 rows or
# fewer, 2 x 1 / 1 x 1 for a last panel of 16 columns or fewer), blocks of 16 and 32 codes as one
# partial-K step, larger blocks in steps of 64, passes of 512 codes, and the driver's tasks of 32
# columns x ranges of whole groups (more ranges with more threads).
AMX_ROWS = [16, 17, 31, 32, 33, 48, 77]


@pytest.mark.parametrize("bits", BITS)
def test_amx_level4_row_blocks_equal_avx2_bit_for_bit(amx, bits):
    """Every width x block sizes 16..256 x rows 16..77 (whole groups of 32, and 1 to 31 rows past
    them) x the three zero-point forms in turn, bias in turn: the AVX2 entry's bits, and within the
    tight tolerance of the exact product. K: 1 to 5 blocks (one or two passes), mostly with a tail;
    N up to 70 (panels of 32 and column tails of 1-31 columns, over or under 16)."""
    import quantmatmul

    rng = np.random.default_rng(6000 + bits)
    threads = quantmatmul.get_num_threads()
    for i, block_size in enumerate((16, 32, 64, 128, 256)):
        for j, M in enumerate(AMX_ROWS):
            K = block_size * int(rng.integers(1, 6)) - int(rng.integers(0, block_size // 2 + 1))
            K = max(K, 1100) if block_size == 16 and j == 0 else K  # two passes with blocks of 16
            case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 71)), batch=(M,),
                        zp=ZP_FORMS[(i + j) % 3], bias=(i + j) % 2 == 1)
            expected = _under("avx2", lambda c=case: c.run(4))
            try:
                for n_threads in (threads, 16):  # 16: ranges of row groups over the same columns
                    quantmatmul.set_num_threads(n_threads)
                    y = case.run(4)
                    assert np.array_equal(y.view(np.uint32), expected.view(np.uint32)), f"{amx} {case} {n_threads}"
            finally:
                quantmatmul.set_num_threads(threads)
            y_eff, tol = tight_tolerance(case, 4)
            assert_within(y, y_eff, tol, f"{amx} {case} tight")


def test_amx_level4_a_prepared_in_ranges_of_row_groups(amx):
    """With at least 2 x 64 K values of A, its tile layout is prepared on the threads in ranges of
    whole 32-row groups, the last range taking the rows past the last whole group: 1, 2, 3 and 16
    threads give the AVX2 entry's bits, rows on both sides of the groups."""
    import quantmatmul

    rng = np.random.default_rng(6100)
    threads = quantmatmul.get_num_threads()
    try:
        for M in (64, 77, 101, 130):
            case = Case(rng, 4, 32, K=2080, N=40, batch=(M,), zp=ZP_FORMS[M % 3], bias=M % 2 == 1)
            expected = _under("avx2", lambda c=case: c.run(4))
            for n_threads in (1, 2, 3, 16):
                quantmatmul.set_num_threads(n_threads)
                y = case.run(4)
                assert np.array_equal(y.view(np.uint32), expected.view(np.uint32)), f"{amx} {case} {n_threads}"
    finally:
        quantmatmul.set_num_threads(threads)


def test_amx_level4_non_finite_rows_and_zero_padding(amx):
    """Rows holding NaN or infinity (qa 0, NaN scale: NaN outputs) among finite ones in the tiles,
    the padding rows of the last group dropped: the AVX2 entry's bits, NaN where the row has one."""
    rng = np.random.default_rng(61)
    for M, block_size in [(17, 16), (40, 64), (33, 128)]:
        case = Case(rng, 4, block_size, K=3 * block_size - 5, N=35, batch=(M,), zp="packed", bias=True)
        A = case.A.copy()
        A[0, 3], A[M - 1, 0], A[M // 2, -1] = np.nan, np.inf, -np.inf
        y = case.run(4, A)
        assert np.array_equal(y.view(np.uint32), _under("avx2", lambda c=case, a=A: c.run(4, a)).view(np.uint32))
        bad = np.zeros(M, bool)
        bad[[0, M - 1, M // 2]] = True
        assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all(), (amx, M, block_size)


def test_amx_tile_configuration_per_task(amx):
    """QLinearMatMul's AMX kernel (tiles of 16 x 64 bytes) and MatMulNBits' (A tiles of 16 or 32 bytes
    for blocks of 16 or 32 codes) take turns on the same threads: each task loads its own
    configuration, so both stay exact."""
    import quantmatmul
    from quantmatmul.reference import qlinear_matmul as qoracle

    rng = np.random.default_rng(62)
    a = rng.integers(0, 256, (40, 130), dtype=np.uint8)
    b = rng.integers(-128, 128, (130, 70), dtype=np.int8)
    qargs = (a, np.float32(0.02), np.uint8(128), b, np.float32(0.01), np.int8(0), np.float32(3.0), np.uint8(128))
    expected_q = qoracle.onnxruntime(*qargs)
    for block_size in (16, 32, 64, 16):
        case = Case(rng, 4, block_size, K=150, N=40, batch=(33,), zp="packed")
        expected = _under("avx2", lambda c=case: c.run(4))
        assert np.array_equal(quantmatmul.qlinear_matmul(*qargs), expected_q)
        assert np.array_equal(case.run(4).view(np.uint32), expected.view(np.uint32)), (amx, block_size)
        assert np.array_equal(quantmatmul.qlinear_matmul(*qargs), expected_q)


def test_amx_entry_is_reported():
    import quantmatmul

    entries = quantmatmul.cpu_info()["entries"]
    if "amx-emulated" in quantmatmul.emulated_isas():
        assert "nbits:amx (emulated)" in entries
        # The amxbf16 entry (level 3 prefill on tdpbf16ps) outranks it where AMX-BF16 is there.
        assert _under("amx-emulated", lambda: quantmatmul.cpu_info()["kernels"]["nbits"]) == "amxbf16-emulated"
        before = _select_nbits_entry("amx-emulated")
        _restore(before)
    assert any(e.startswith("nbits:amx") for e in entries) == any(e.startswith("qgemm:amx") for e in entries)


# --------------------------------------------------------------------------------------------------
# The AVX-512 float kernels, levels 0-3 (nbits_f32_avx512.cpp: the avx512_vnni entry's rows), emulated
# over SIMDe on AVX2 machines and natively where the CPU has AVX-512 VNNI: their own edges. (The
# `isa` tests above run them too.) Decode: up to 12 rows in passes of up to 6, 64-column tasks, k in
# chunks of 4096 / rows codes; prefill: 32-column panels, 12-row tiles, k-chunks of 128.


def fma_f32(x, y, acc):
    """float32 fused multiply-add x * y + acc, elementwise (broadcasting), one rounding: p = x * y is
    exact in float64 (24 + 24 bits), and the sum rounds once (TwoSum: the float64 sum s and its error
    e; s rounds to the right float32 unless it ties between two of them while e moves the exact sum
    off the midpoint). Finite operands."""
    f32, f64 = np.float32, np.float64
    p = np.asarray(x, f32).astype(f64) * np.asarray(y, f32).astype(f64)
    a = np.asarray(acc, f32).astype(f64)
    s = a + p
    bv = s - a
    e = (a - (s - bv)) + (p - bv)
    r = s.astype(f32)
    other = np.nextafter(r, np.where(s > r.astype(f64), np.inf, -np.inf).astype(f32))
    tie = (s != r.astype(f64)) & ((r.astype(f64) + other.astype(f64)) / 2 == s) & (e != 0)
    return np.where(tie, np.where(e > 0, np.maximum(r, other), np.minimum(r, other)), r)


def _fma_chain_f32(A, W):
    """[M, K] x [K, N] float32, each output one float32 fused multiply-add per k in order of k from +0."""
    acc = np.zeros((A.shape[0], W.shape[1]), np.float32)
    for k in range(A.shape[1]):
        acc = fma_f32(A[:, k, None], W[None, k, :], acc)
    return acc


@pytest.mark.parametrize("level", _levels("avx2") + _WIDE)
def test_simd_prefill_is_the_fma_chain_in_order_of_k(level):
    """Levels 0/1 with more than 12 rows on the AVX2 and AVX-512 tables dequantize W into panels and
    run register tiles that keep each output one FMA chain in order of k: bit for bit that chain
    over dequantize_nbits' W, whatever the rows' grouping (AVX2: ceil(M / 6) groups of 4 to 6 rows;
    AVX-512: 12-row tiles and their tails), the k chunks and whether A is read in place or
    interleaved by k (AVX-512: interleaved where K is a multiple of 1024). M around every group split."""
    rng = np.random.default_rng(77)
    before = _select_nbits_entry(level)
    try:
        for M in (13, 14, 17, 19, 24, 25, 29, 31, 37, 128):
            K, N = [96, 300, 1024][M % 3], 37
            W = rng.standard_normal((K, N)).astype(np.float32)
            A = rng.standard_normal((M, K)).astype(np.float32)
            q = quantize_nbits(W, bits=4, block_size=32, symmetric=M % 3 == 0)
            model = _fma_chain_f32(A, q.dequantize().astype(np.float32))
            for accuracy_level in (0, 1):
                Y = matmul_nbits(A, *q.tensors(), **q.attributes(), accuracy_level=accuracy_level)
                assert np.array_equal(Y.view(np.uint32), model.view(np.uint32)), (level, M, K, accuracy_level)
    finally:
        _restore(before)


@pytest.mark.skipif("avx2" not in quantmatmul.available_isas(), reason="no AVX2 table here")
def test_avx2_decoders_give_the_same_codes_with_and_without_pdep():
    """The AVX2 table's in-memory decoders deposit 2, 3, 5, 6 and 7-bit codes with pdep where it is
    fast and with shifts and masks where it is microcode (AMD before Zen 3: tens to hundreds of
    cycles each): both give the same bytes, so every path through them (levels 0, 3 and 4, decode
    and prefill, 3-bit codes transcoded to nibbles, K with a partial block) the same bits."""
    rng = np.random.default_rng(79)
    before = _select_nbits_entry("avx2")
    use_pdep = quantmatmul._core.pdep_preferred()
    try:
        for bits in (2, 3, 5, 6, 7):
            for M, K, bs in [(1, 200, 32), (3, 96, 16), (20, 160, 64)]:
                W = rng.standard_normal((K, 24)).astype(np.float32)
                A = rng.standard_normal((M, K)).astype(np.float32)
                q = quantize_nbits(W, bits=bits, block_size=bs)
                for accuracy_level in (0, 3, 4):
                    runs = []
                    for pdep in (True, False):
                        quantmatmul._core.set_pdep_preferred(pdep)
                        runs.append(matmul_nbits(A, *q.tensors(), **q.attributes(), accuracy_level=accuracy_level))
                    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32)), (bits, M, K, accuracy_level)
    finally:
        quantmatmul._core.set_pdep_preferred(use_pdep)
        _restore(before)


def test_a_is_prepared_in_parts_on_the_threads(isa):
    """The entry's preparation of A (levels 0-3, more than 12 rows: on the AVX-512 entries where K
    is a multiple of 1024 or A has more than 2^20 values, and the bfloat16 pair entries' level-3
    words; AVX2 reads A in place) runs in one part per thread (at least 64 K floats each; parts may
    outnumber the row groups): every thread count gives the one-thread bits, levels 0 and 3, M
    around the groups."""
    rng = np.random.default_rng(78)
    before = quantmatmul.get_num_threads()
    try:
        for M, K in [(13, 40001), (27, 40001), (37, 4099), (37, 4096), (61, 2200)]:
            W = rng.standard_normal((K, 20)).astype(np.float32)
            A = rng.standard_normal((M, K)).astype(np.float32)
            q = quantize_nbits(W, bits=4, block_size=32)
            for accuracy_level in (0, 3):
                runs = []
                for threads in (1, 2, 3, 5):
                    quantmatmul.set_num_threads(threads)
                    Y = matmul_nbits(A, *q.tensors(), **q.attributes(), accuracy_level=accuracy_level)
                    runs.append(Y.view(np.uint32))
                assert all(np.array_equal(runs[0], r) for r in runs[1:]), (isa, M, K, accuracy_level)
    finally:
        quantmatmul.set_num_threads(before)


@pytest.mark.parametrize("bits", BITS)
def test_avx512_float_levels_tile_and_pass_edges(vnni, bits):
    """Every width x block sizes 16 and 256 (and 32 for the 2- and 4-bit lane orders) x rows on
    both sides of each pass and tile height (1..7, 12 decode; 13, 24, 25, 37 prefill) x columns
    not a multiple of 16 or 32 (tasks of 64 and 32 with tails) x every zero-point form, g_idx,
    bias: levels 0-3 within the bound and the tight tolerance."""
    rng = np.random.default_rng(6000 + bits)
    block_sizes = (16, 32, 256) if bits in (2, 4) else (16, 256)
    for block_size in block_sizes:
        for i, M in enumerate((1, 2, 3, 5, 6, 7, 12, 13, 24, 25, 37)):
            zp = ZP_FORMS[i % 3]
            N = (1, 15, 17, 31, 33, 47, 65, 70)[(i + block_size) % 8]
            K = block_size * int(rng.integers(1, 3)) + int(rng.integers(0, 2)) * int(rng.integers(1, block_size))
            g = "random" if i % 4 == 3 else None
            case = Case(rng, bits, block_size, K=K, N=N, batch=(M,), zp=zp, g=g, bias=i % 2 == 1)
            exact = case.exact()
            for level in (0, 2, 3):
                y = case.run(level)
                assert_within(y, exact, case.bound(level), f"{vnni} {case} level {level}")
                y_eff, tol = tight_tolerance(case, level)
                assert_within(y, y_eff, tol, f"{vnni} {case} level {level} tight")


@pytest.mark.parametrize("bits", BITS)
def test_avx512_float_prefill_equals_avx2_bit_for_bit(vnni, bits):
    """More than 12 rows: both entries multiply dequantize_nbits's W (rounded at levels 2/3) in one FMA
    chain per output in order of k, then add the bias, so their bits agree whatever the tiles (12 x 32
    here, 6 x 16 there): every width x block sizes 16-256 x rows 13, 24, 25, 37 x every zero-point form,
    g_idx, bias, levels 0, 2, 3, columns past 32."""
    rng = np.random.default_rng(6500 + bits)
    for block_size in (16, 32, 64, 256):
        for i, M in enumerate((13, 24, 25, 37)):
            zp, g = ZP_FORMS[(i + block_size) % 3], "random" if i % 2 else None
            K = int(rng.integers(1, 3 * block_size))
            case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 70)), batch=(M,), zp=zp, g=g,
                        bias=bool(rng.integers(0, 2)))
            for level in (0, 2, 3):
                y = case.run(level)
                expected = _under("avx2", functools.partial(case.run, level))
                assert np.array_equal(y.view(np.uint32), expected.view(np.uint32)), f"{vnni} {case} level {level}"


@pytest.mark.parametrize("M", [1, 3, 6, 9])
def test_avx512_float_decode_k_chunks(vnni, M):
    """K long enough for the decode path's k-chunks (4096 codes for one row, about 4096 / rows for
    more; the sums wait in memory between chunks), block sizes 16 and 64, a K tail, every level."""
    rng = np.random.default_rng(6100 + M)
    for bits, block_size in ((4, 16), (3, 64), (8, 64)):
        K = (4096 if M == 1 else 1600) + 3 * block_size + 5
        case = Case(rng, bits, block_size, K=K, N=5, batch=(M,), zp="packed", bias=True)
        exact = case.exact()
        for level in (0, 2, 3):
            assert_within(case.run(level), exact, case.bound(level), f"{vnni} {case} level {level}")
            y_eff, tol = tight_tolerance(case, level)
            assert_within(case.run(level), y_eff, tol, f"{vnni} {case} level {level} tight")


def test_avx512_float_threads_do_not_change_bits(vnni):
    """Levels 0-3, decode and prefill, several tasks: the same bits on 1, 2, 3 and 5 threads."""
    rng = np.random.default_rng(6200)
    before = quantmatmul.get_num_threads()
    try:
        for bits, M, g in ((4, 1, None), (5, 7, None), (2, 30, None), (6, 3, "random"), (3, 26, "random")):
            case = Case(rng, bits, 32, K=200, N=150, batch=(M,), zp="float", g=g, bias=True)
            for level in (0, 2, 3):
                results = []
                for n in (1, 2, 3, 5):
                    quantmatmul.set_num_threads(n)
                    results.append(case.run(level))
                assert all(np.array_equal(r, results[0], equal_nan=True) for r in results), (vnni, case, level)
    finally:
        quantmatmul.set_num_threads(before)


def test_few_row_tasks_of_any_width_give_the_same_bits(isa):
    """Levels 0/1 with few rows take tasks of 64 to 512 columns (wider where the threads leave four
    tasks each): N = 5000 (a last panel of 8 columns) on 1, 2, 3 and 7 threads (tasks of 512, 512,
    384 and 128 columns) gives the same bits, held (packed) and as codes, M = 1, 5 and 12, within
    the documented bound."""
    rng = np.random.default_rng(5000)
    before = quantmatmul.get_num_threads()
    try:
        for M in (1, 5, 12):
            case = Case(rng, 4, 32, K=200, N=5000, batch=(M,), zp="packed")
            held = quantmatmul.MatMulNBits(*case.args()[1:], **case.kw, accuracy_level=0)
            runs = []
            for threads in (1, 2, 3, 7):
                quantmatmul.set_num_threads(threads)
                runs += [case.run(0).view(np.uint32), held(case.A).view(np.uint32)]
            assert all(np.array_equal(runs[0], r) for r in runs[1:]), (isa, M)
            assert_within(runs[0].view(np.float32), case.exact(), case.bound(0), f"{isa} {case}")
    finally:
        quantmatmul.set_num_threads(before)


def test_levels_2_3_round_a_as_numpy_and_ml_dtypes_do(isa):
    """Levels 2/3 round A to float16 / bfloat16 in C++ (the entry's round_operands, or the scalar
    round_operand): the same values as numpy's / ml_dtypes' astype, so A rounded beforehand gives the
    same bits. A holds ties (both parities), float16 subnormals and the values around them, values at
    and past float16's overflow threshold (65504, 65519.99, 65520), bfloat16 ties, both signs; rows of
    1 (decode) and 30 (prefill), K with a tail of fewer than 8 values (the SIMD rounding's scalar tail);
    then 2 x (2^16 + 3) floats (the rounding in parts on the threads)."""
    rng = np.random.default_rng(2023)
    special = np.array([1 + 2**-11, 1 + 3 * 2**-11, 2**-15, 3 * 2**-25, 2**-25, 2**-24 * 1.5, 6.1e-5, 6.104e-5,
                        65504.0, 65519.99, 65520.0, 1e9, 1 + 2**-8, 1 + 3 * 2**-8, 2**-133, 3.0e38], np.float64)
    for M, K in ((1, 37), (30, 37), (2, 2**16 + 3)):
        case = Case(rng, 4, 16, K=K, N=20, batch=(M,), zp="packed")
        A = (rng.standard_normal((M, K)) * 8).astype(np.float32)
        picks = rng.integers(0, special.size, (M, K))
        signs = rng.choice([-1.0, 1.0], (M, K))
        where = rng.random((M, K)) < 0.5
        A[where] = (special[picks] * signs)[where].astype(np.float32)
        for level, dtype in ((2, F16), (3, BF16)):
            with np.errstate(over="ignore"):
                pre = A.astype(dtype).astype(F32)
            y, y_pre = case.run(level, A), case.run(level, pre)
            assert np.array_equal(y.view(np.uint32), y_pre.view(np.uint32)), (isa, M, K, level)


def test_non_finite_activations_stay_in_their_rows(isa):
    """A row of A holding a NaN gives NaN in every column, a row holding an infinity a non-finite value
    in every column (inf * W, or NaN where W = 0 or the signs meet); no other row changes: decode and
    prefill rows, the prefill rows in different 12-row tiles, every level 0-3, with and without g_idx."""
    rng = np.random.default_rng(6300)
    for bits, M, g in ((4, 5, None), (4, 30, None), (7, 3, "random"), (2, 29, "random")):
        case = Case(rng, bits, 32, K=100, N=40, batch=(M,), zp="packed", g=g)
        A = case.A.copy()
        A[1, 7] = np.nan
        A[M - 2, 50] = np.inf
        A[M - 1, 99] = -np.inf
        clean = [m for m in range(M) if m not in (1, M - 2, M - 1)]
        dirty = case.replace(A=A)
        for level in (0, 2, 3):
            y = dirty.run(level)
            assert np.isnan(y[1]).all(), (isa, bits, M, level)
            assert not np.isfinite(y[[M - 2, M - 1]]).any(), (isa, bits, M, level)
            assert_within(y[clean], case.exact()[clean], case.bound(level)[clean], f"{isa} {case} level {level}")


_GUARDED_CODES = r"""
import ctypes, mmap, sys
import numpy as np
import quantmatmul
sys.path.insert(0, {tests!r})
from test_matmul_nbits import Case, assert_within

libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
keep = []

def guarded(x):
    # a copy of x whose last byte is followed by an unreadable page
    x = np.ascontiguousarray(x)
    pages = -(-x.nbytes // PAGE) + 1
    m = mmap.mmap(-1, pages * PAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(address + (pages - 1) * PAGE, PAGE, 0) == 0
    y = np.frombuffer(m, np.uint8, count=x.nbytes, offset=(pages - 1) * PAGE - x.nbytes).view(x.dtype)
    y[...] = x.reshape(-1)
    keep.append(m)
    return y.reshape(x.shape)

rng = np.random.default_rng(6400)
for isa in {isas!r}:
    quantmatmul.set_isa(isa)
    for bits in range(2, 9):
        for block_size, K in ((16, 16), (16, 40), (32, 32), (64, 150)):
            for M, g in ((1, None), (3, "random"), (13, None), (14, "random")):
                case = Case(rng, bits, block_size, K=K, N=3, batch=(M,), g=g)
                safe = case.replace(B=guarded(case.B), scales=guarded(case.scales),
                                    g_idx=None if g is None else guarded(case.g_idx))
                for level in (0, 3):
                    assert_within(safe.run(level), case.exact(), case.bound(level), f"{{isa}} {{case}} level {{level}}")
print("ok")
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="mprotect through ctypes")
def test_codes_scales_and_g_idx_ending_at_an_unreadable_page():
    """B, the scales and g_idx each end right before a page that cannot be read: every kernel level
    (native and emulated), every width, short rows (K = 16, the last column's group loads), decode and
    prefill, levels 0 and 3. A read past an input ends the child process (SIGSEGV)."""
    import os
    import subprocess
    import sys

    from conftest import kernel_levels

    code = _GUARDED_CODES.format(tests=os.path.dirname(os.path.abspath(__file__)), isas=kernel_levels())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.returncode, done.stderr[-2000:])


# --------------------------------------------------------------------------------------------------
# MatMulNBits: a constant weight prepared once


def test_constant_weight_class_equals_the_function():
    import quantmatmul

    rng = np.random.default_rng(88)
    for bits in BITS:
        for zp in ZP_FORMS:
            for g in (None, "random"):
                for level in LEVELS:
                    case = Case(rng, bits, 32, K=70, N=9, batch=(2, 3), zp=zp, g=g, bias=bool(bits % 2))
                    w = quantmatmul.MatMulNBits(case.B, case.scales, case.zero_points, case.g_idx, case.bias,
                                                **case.kw, accuracy_level=level)
                    assert np.array_equal(w(case.A), case.run(level)), (case, level)
                    assert np.array_equal(w(case.A[0, 0]), case.run(level, case.A[0, 0]))


def _quads_x16_bytes(bits, block_size, K, N, float_zero_points):
    """Bytes of a weight packed in "quads x16" (docs/matmul_nbits.md, "Level 4 on a packed weight"): per
    panel of 16 columns and block, the codes at their storage width (2-bit codes in 2 bits, 3- and 4-bit
    in 4, 5- to 8-bit in 8), and the panel's float32 scales and zero points (one uint8 per column, or a
    float32 product with float ones), rounded up to 64 bytes per panel."""
    panels, kb = -(-N // 16), -(-K // block_size)
    storage = 2 if bits == 2 else 4 if bits <= 4 else 8
    floats = 16 * kb + (16 if float_zero_points else 4) * kb
    return panels * (kb * block_size * 16 * storage // 8 + 4 * (-(-floats // 16) * 16))


def test_constant_weight_holds_its_codes_or_their_packed_form_and_nothing_more():
    """Without a packed layout (the portable entry, or a g_idx) a weight holds its codes as given, float32
    scales and uint8 zero points: at most 1.25x codes plus scales (the worst case, 2-bit codes in blocks
    of 16, exactly). Packed (levels 0, 1 and 4 on the x86 entries) it holds only the packed form, byte
    for byte as documented (the codes, scales and zero points are in it)."""
    import quantmatmul

    rng = np.random.default_rng(90)
    for bits in BITS:
        for block_size in (16, 32, 128):
            for zp in ("packed", "none", "float"):
                for N in (5, 48):
                    case = Case(rng, bits, block_size, K=2 * block_size + 3, N=N, zp=zp)
                    own = case.scales.astype(np.float32).nbytes + N * case.k_blocks * (4 if zp == "float" else 1)
                    with kernel_entry("nbits", "portable"):
                        w = quantmatmul.MatMulNBits(case.B, case.scales, case.zero_points, **case.kw)
                        assert w._packed is None
                        assert w.nbytes == case.B.nbytes + own, (bits, block_size, zp, N)
                        if zp != "float":
                            assert w.nbytes <= 1.25 * case.B.nbytes + case.scales.astype(np.float32).nbytes
                    for level in (0, 4):
                        w = quantmatmul.MatMulNBits(case.B, case.scales, case.zero_points, **case.kw,
                                                    accuracy_level=level)
                        if quantmatmul._core.nbits_weight_layout(level) is None:
                            continue
                        packed = _quads_x16_bytes(bits, block_size, case.K, N, zp == "float")
                        assert w.nbytes == packed, (bits, block_size, zp, N, level)


def test_constant_weight_class_from_float_copies_and_errors():
    import quantmatmul

    rng = np.random.default_rng(89)
    W = rng.normal(size=(96, 40)).astype(np.float32)
    w = quantmatmul.MatMulNBits.from_float(W, bits=4, block_size=32, method="mse")
    q = quantmatmul.quantize_nbits(W, bits=4, block_size=32, method="mse")
    A = rng.normal(size=(5, 96)).astype(np.float32)
    assert np.array_equal(w(A), matmul_nbits(A, *q.tensors(), **q.attributes()))
    B = q.B.copy()
    w2 = quantmatmul.MatMulNBits(B, *q.tensors()[1:], **q.attributes())
    before = w2(A)
    B[:] = 0  # the caller's codes change; the held weight does not
    assert np.array_equal(w2(A), before)
    # Nor do its bias and g_idx (the fuzzing of the fourteenth session found the bias held as given).
    bias, g_idx = rng.normal(size=40).astype(np.float32), (np.arange(96) // 32)[::-1].copy()
    w3 = quantmatmul.MatMulNBits(q.B, q.scales, q.zero_points, g_idx, bias, **q.attributes())
    before = w3(A)
    bias[:], g_idx[:] = 1000, 0
    assert np.array_equal(w3(A), before)
    # Nor do its scales and zero points, held as given (portable, level 2) or packed, integer or float.
    for entry, level, zp_form in (("portable", 0, "packed"), (None, 2, "float"), (None, 0, "float"), (None, 4, "packed")):
        case = Case(rng, 4, 32, K=96, N=40, batch=(5,), zp=zp_form)
        scales, zero_points = case.scales.copy(), case.zero_points.copy()
        with kernel_entry("nbits", entry or quantmatmul.cpu_info()["isa"]):
            held = quantmatmul.MatMulNBits(case.B, scales, zero_points, **case.kw, accuracy_level=level)
            before = held(case.A)
            scales[:] = 1
            zero_points[:] = 3
            assert np.array_equal(held(case.A).view(np.uint32), before.view(np.uint32)), (entry, level, zp_form)
    as_given = q.B.nbytes + 4 * q.scales.size + q.scales.size  # codes, float32 scales, uint8 zero points
    assert w2.nbytes == (as_given if w2._packed is None else _quads_x16_bytes(4, 32, 96, 40, False))
    assert "MatMulNBits(K=96, N=40, bits=4" in repr(w2)
    with pytest.raises(TypeError, match="^MatMulNBits: A dtype float16 does not match the weight's scales dtype"):
        w(A.astype(np.float16))
    with pytest.raises(ValueError, match="^MatMulNBits: A has shape \\(5, 95\\)"):
        w(A[:, :95])
    with pytest.raises(ValueError, match="^MatMulNBits: B has shape"):
        quantmatmul.MatMulNBits(q.B[:, :1], *q.tensors()[1:], **q.attributes())
    with pytest.raises(ValueError, match="^MatMulNBits: accuracy_level must be one of"):
        quantmatmul.MatMulNBits(*q.tensors(), **q.attributes(), accuracy_level=7)


def test_levels_2_and_3_round_w_exactly_like_numpy(isa):
    """With one-hot rows of A (a single 1.0), each output is one rounded weight: the kernels' float16 and
    bfloat16 rounding of W, bit for bit against numpy / ml_dtypes, over subnormal, overflowing and tie
    values (scales chosen to produce them), on every kernel path and both row regimes."""
    rng = np.random.default_rng(91)
    K, N, bits, block_size = 64, 24, 4, 16
    codes = rng.integers(0, 16, (N, K), dtype=np.uint8)
    scales = (2.0 ** rng.integers(-30, 17, (N, K // block_size))).astype(np.float32)
    scales *= rng.choice(np.array([1.0, 1.0009765625, 1.5, 0.99951171875, 1.00390625], np.float32), scales.shape)
    B = pack_nbits(codes, bits).reshape(N, K // block_size, block_size * bits // 8)
    zp = pack_nbits(rng.integers(0, 16, (N, K // block_size), dtype=np.uint8), bits)
    W = dequantize_nbits(B, scales, zp, K=K, N=N, bits=bits, block_size=block_size)  # float32 [K, N]
    for rows in (5, 40):  # the few-row and the many-row (6-row tiles) paths
        A = np.zeros((rows, K), np.float32)
        picks = rng.integers(0, K, rows)
        A[np.arange(rows), picks] = 1.0
        for level, dtype in ((2, np.float16), (3, ml_dtypes.bfloat16)):
            with np.errstate(over="ignore"):
                W16 = W.astype(dtype).astype(np.float32)
            expected = W16[picks]
            # 0 * inf is NaN: a column holding an infinity (float16 overflow) elsewhere gives NaN.
            infinite = np.isinf(W16)
            elsewhere = infinite.sum(axis=0)[None, :] - infinite[picks] > 0
            expected = np.where(elsewhere, np.float32(np.nan), expected)
            assert infinite.any() == (level == 2) and (np.abs(W16[W16 != 0]) < 2.0**-14).any()  # the cases are there
            y = matmul_nbits(A, B, scales, zp, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
            # Exact values (a sum from +0 turns a rounded -0 into +0: equal as numbers).
            np.testing.assert_array_equal(y, expected, err_msg=f"{isa} level {level}")
