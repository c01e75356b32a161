"""test_qlinear_matmul.py: QLinearMatMul bit for bit against the seed examples, onnxruntime, onnx.reference and exact fractions."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import itertools

import numpy as np
import pytest

import quantmatmul as qm
from quantmatmul import _core
from quantmatmul.reference import qlinear_matmul as oracle

from conftest import kernel_entry, kernel_levels
from peer_deviations import deviation
from quantmatmul.peers import onnxruntime_u8s8_saturates, run_onnx_reference, run_onnxruntime

u8, s8, f32, f16, bf16 = np.uint8, np.int8, np.float32, np.float16, ml_dtypes.bfloat16
FLOAT8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz]
ORT_COMBOS = [(u8, u8, u8), (u8, s8, u8), (s8, s8, s8)]
ALL_INT_COMBOS = [(x, y, z) for x in (u8, s8) for y in (u8, s8) for z in (u8, s8)]


def assert_identical(ours, theirs, context=""):
    """Bit-for-bit equality of dtype, shape and values; on failure, say where."""
    theirs = np.asarray(theirs)
    assert ours.dtype == theirs.dtype, f"{context}: dtype {ours.dtype} != {theirs.dtype}"
    assert ours.shape == theirs.shape, f"{context}: shape {ours.shape} != {theirs.shape}"
    diff = np.argwhere(ours.view(np.uint8) != theirs.view(np.uint8)) if ours.size else []
    assert len(diff) == 0, (f"{context}: {len(diff)} of {ours.size} elements differ, first at {tuple(diff[0])}: "
                            f"ours {ours[tuple(diff[0])]} theirs {theirs[tuple(diff[0])]}")


# --------------------------------------------------------------------------------------------------
# Random cases


def random_values(rng, dtype, shape, mode):
    info = np.iinfo(dtype)
    if mode == "uniform":
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    if mode == "extreme":
        return rng.choice(np.array([info.min, info.max], dtype), shape)
    centre = (int(info.min) + int(info.max)) // 2
    return np.clip(np.round(rng.normal(centre, 20, shape)), info.min, info.max).astype(dtype)


def random_case(rng, a_t, b_t, y_t, a_shape, b_shape, *, scale_t=f32, b_per_column=False, a_per_row=False,
                y_shape=None, reduce_range=False):
    """Operands and parameters with y_scale chosen so that a few percent of outputs saturate.

    reduce_range keeps b in [-64, 63] (7 bits), ONNX Runtime's own workaround for its int16 saturation."""
    mode = rng.choice(["uniform", "gauss", "extreme"], p=[0.5, 0.4, 0.1])
    a = random_values(rng, a_t, a_shape, mode)
    b = random_values(rng, b_t, b_shape, mode)
    if reduce_range:
        b = np.clip(b, -64, 63).astype(b_t)
    K = a_shape[-1]
    M = a_shape[-2] if len(a_shape) > 1 else None
    N = b_shape[-1] if len(b_shape) > 1 else None

    def params(dtype, shape):
        scale = rng.uniform(0.001, 0.05, shape).astype(scale_t)
        zp = random_values(rng, dtype, shape, "gauss")
        return scale, zp

    a_s, a_z = params(a_t, (M, 1) if a_per_row else (1,))
    if b_per_column:
        shape = (N,) if len(b_shape) == 2 else b_shape[:-2] + (1, N)
    else:
        shape = (1,)
    b_s, b_z = params(b_t, shape)
    y_s, y_z = params(y_t, y_shape or (1,))
    typical = float(np.sqrt(max(K, 1))) * 3600.0 * float(a_s.astype(f32).max()) * float(b_s.astype(f32).max())
    y_s = (y_s.astype(f32) / y_s.astype(f32).max() * typical / 60.0).astype(scale_t)
    return a, a_s, a_z, b, b_s, b_z, y_s, y_z


SHAPES = [
    ((1, 1), (1, 1)), ((1, 16), (16, 1)), ((1, 4096), (4096, 3)), ((3, 5), (5, 7)), ((7, 1), (1, 9)),
    ((2, 3, 17), (17, 4)), ((3, 17), (2, 17, 4)), ((2, 1, 3, 8), (4, 8, 5)), ((2, 3, 8), (2, 8, 5)),
    ((9,), (9, 4)), ((4, 9), (9,)), ((9,), (9,)), ((2, 3, 9), (9,)), ((33, 255), (255, 31)),
    ((5, 8192), (8192, 2)), ((64, 64), (64, 64)), ((1, 1000), (1000, 130)),
]


@pytest.mark.parametrize("combo", ORT_COMBOS, ids=lambda c: "".join(np.dtype(t).char for t in c))
@pytest.mark.parametrize("scale_t", [f32, f16], ids=["f32", "f16"])
def test_identical_to_onnxruntime(combo, scale_t):
    """Every shape class, per tensor and per column b, b as input and as prepacked initializer, opset 10 and 21."""
    rng = np.random.default_rng(hash((combo, scale_t)) & 0xFFFF)
    checked = 0
    for a_shape, b_shape in SHAPES:
        for trial in range(3):
            per_column = trial == 1 and len(b_shape) >= 2
            args = random_case(rng, *combo, a_shape, b_shape, scale_t=scale_t, b_per_column=per_column,
                               reduce_range=_reduce_range(combo))
            opset = 10 if scale_t == f32 and trial == 2 else 21
            expected = run_onnxruntime(*args, opset=opset, b_constant=trial == 0)
            assert_identical(qm.qlinear_matmul(*args), expected, f"{a_shape}x{b_shape} trial {trial}")
            checked += 1
    assert checked == 3 * len(SHAPES)


def test_identical_to_onnxruntime_many_small_random():
    """A broad sweep of small random problems; the ±1 tie flips between ORT and the reference live here."""
    rng = np.random.default_rng(7)
    for trial in range(1200):
        combo = ORT_COMBOS[trial % 3]
        M, N = rng.integers(1, 33, 2)
        K = int(rng.choice([1, 2, 3, 16, 64, 255, 256, 1000, 1024, 4095]))
        args = random_case(rng, *combo, (M, K), (K, N), b_per_column=bool(trial % 2), reduce_range=_reduce_range(combo))
        assert_identical(qm.qlinear_matmul(*args), run_onnxruntime(*args), f"trial {trial}")


def test_batches_of_both_operands_every_type_against_the_oracle():
    """Batches of one batch shape with every parameter per tensor (attention's products: the batched fast
    path) in all eight int8 / uint8 combinations, against the oracle's ONNX Runtime numerics, next to
    the same call with one parameter as a 1-element array of rank 3 (the general path)."""
    rng = np.random.default_rng(12)
    types = (np.int8, np.uint8)
    for trial, (a_t, b_t, y_t) in enumerate((x, y, z) for x in types for y in types for z in types):
        batch = [(2, 3), (8, 12), (1,), (4, 1, 2)][trial % 4]
        M, K, N = (int(v) for v in rng.integers(1, 40, 3))
        args = random_case(rng, a_t, b_t, y_t, (*batch, M, K), (*batch, K, N))
        expected = oracle.onnxruntime(*args)
        assert_identical(qm.qlinear_matmul(*args), expected, f"{a_t.__name__} {b_t.__name__} {y_t.__name__}")
        general = list(args)
        general[6] = np.asarray(args[6]).reshape(1, 1, 1)
        general[7] = np.asarray(args[7]).reshape(1, 1, 1)
        assert_identical(qm.qlinear_matmul(*general), expected, "general path")


def _reduce_range(combo):
    """On CPUs without VNNI, ORT's u8 x s8 kernel (vpmaddubsw) saturates pairs of products to int16
    (onnxruntime#16105): there we compare on 7-bit b, where no pair can saturate."""
    return combo == (u8, s8, u8) and onnxruntime_u8s8_saturates()


def test_onnxruntime_int16_saturation_is_a_documented_deviation():
    """a = [255, 255], b = [-128, -128]: the exact dot product is -65280; vpmaddubsw gives -32768.
    We always return the spec's int32 result; ORT returns it only on CPUs with VNNI (or without AVX2)."""
    args = (np.array([[255, 255]], u8), f32(1), u8(0), np.array([[-128], [-128]], s8), f32(1), s8(0),
            f32(1024), u8(128))
    assert qm.qlinear_matmul(*args).item() == 128 - 64  # -65280 / 1024 = -63.75 -> -64
    y = run_onnxruntime(*args).item()
    assert y in (96, 64)
    deviation("ort-qlinear-u8s8-int16", y == 96)


def test_tie_flip_matches_each_peer():
    """a=[[3]], b=[[1]], y_scale=6: exact 0.5 after float32 rounding (ORT 10), 0.500000015 in float64 (reference 11)."""
    args = (np.array([[3]], s8), f32(1), s8(0), np.array([[1]], s8), f32(1), s8(0), f32(6), s8(10))
    assert run_onnxruntime(*args).item() == 10 and run_onnx_reference(*args).item() == 11
    assert qm.qlinear_matmul(*args).item() == 10
    assert qm.qlinear_matmul(*args, numerics="onnx-reference").item() == 11
    assert qm.qlinear_matmul(*args, numerics="exact").item() == 10  # 3 * 1 / 6 is exactly 0.5 -> even 0


def test_int32_wraparound_matches_onnxruntime_and_exact_does_not_wrap():
    K = 40000  # 40000 * 255 * 255 > 2^31: the int32 accumulator wraps
    a = np.full((2, K), 255, u8)
    b = np.full((K, 3), 255, u8)
    args = (a, f32(1), u8(0), b, f32(1), u8(0), f32(2.0 ** 26), u8(100))
    wrapped = (K * 255 * 255) - 2 ** 32
    assert run_onnxruntime(*args)[0, 0] == 100 + round(wrapped / 2.0 ** 26)
    assert_identical(qm.qlinear_matmul(*args), run_onnxruntime(*args))
    assert_identical(qm.qlinear_matmul(*args, numerics="onnx-reference"), run_onnx_reference(*args))
    assert qm.qlinear_matmul(*args, numerics="exact")[0, 0] == 100 + round(Fraction(K * 255 * 255, 2 ** 26))


def test_k_zero_gives_zero_point_where_onnxruntime_does_not():
    """Documented deviation: ORT returns uninitialized/zero values for K = 0; the spec's formula gives y_zero_point."""
    args = (np.zeros((2, 0), u8), f32(0.5), u8(3), np.zeros((0, 3), u8), f32(0.5), u8(4), f32(1), u8(7))
    for numerics in qm.qlinear.NUMERICS:
        assert_identical(qm.qlinear_matmul(*args, numerics=numerics), np.full((2, 3), 7, u8), numerics)
    assert_identical(qm.qlinear_matmul(*args, numerics="onnx-reference"), run_onnx_reference(*args))
    # 64 x 64 outputs: uninitialized memory (fresh pages are zeros) cannot all read as the zero point 7
    big = (np.zeros((64, 0), u8), *args[1:3], np.zeros((0, 64), u8), *args[4:])
    deviation("ort-qlinear-k0", not (run_onnxruntime(*big) == 7).all())


def test_empty_dimensions():
    for a_shape, b_shape, out in [((0, 4), (4, 3), (0, 3)), ((2, 4), (4, 0), (2, 0)), ((0, 2, 4), (4, 3), (0, 2, 3))]:
        args = (np.zeros(a_shape, u8), f32(1), u8(0), np.zeros(b_shape, u8), f32(1), u8(0), f32(1), u8(0))
        for numerics in qm.qlinear.NUMERICS:
            assert qm.qlinear_matmul(*args, numerics=numerics).shape == out


# --------------------------------------------------------------------------------------------------
# onnx.reference: every integer combination, per-row a, y per column, float16 and bfloat16 scales


@pytest.mark.parametrize("combo", ALL_INT_COMBOS, ids=lambda c: "".join(np.dtype(t).char for t in c))
@pytest.mark.parametrize("scale_t", [f32, f16, bf16], ids=["f32", "f16", "bf16"])
def test_identical_to_onnx_reference(combo, scale_t):
    rng = np.random.default_rng(hash((combo, str(scale_t))) & 0xFFFF)
    for a_shape, b_shape in SHAPES:
        for trial in range(2):
            two_d = len(a_shape) == 2 and len(b_shape) == 2
            args = random_case(rng, *combo, a_shape, b_shape, scale_t=scale_t, a_per_row=two_d and trial == 0,
                               b_per_column=len(b_shape) >= 2 and trial == 1,
                               y_shape=(b_shape[-1],) if two_d and trial == 1 else None)
            expected = run_onnx_reference(*args)
            ours = qm.qlinear_matmul(*args, numerics="onnx-reference")
            if len(a_shape) == 1 and len(b_shape) == 1:
                # the reference's quirk: shape (1,) for [1]-shaped scales
                if deviation("onnx-qlinear-1d-shape", expected.shape == (1,)):
                    expected = expected.reshape(())
            assert_identical(ours, expected, f"{a_shape}x{b_shape} trial {trial}")
            if len(a_shape) > 1 and len(b_shape) > 1:
                assert_identical(ours, oracle.onnx_reference(*args), "numpy oracle")


# --------------------------------------------------------------------------------------------------
# exact: against Python fractions, random and constructed ties


def test_exact_against_fractions_random():
    rng = np.random.default_rng(11)
    for trial in range(40):
        combo = ALL_INT_COMBOS[trial % 8]
        scale_t = [f32, f16, bf16][trial % 3]
        M, N = rng.integers(1, 5, 2)
        K = int(rng.choice([1, 5, 64, 300]))
        args = random_case(rng, *combo, (M, K), (K, N), scale_t=scale_t, a_per_row=bool(trial % 2),
                           b_per_column=bool(trial % 3))
        assert_identical(qm.qlinear_matmul(*args, numerics="exact"), oracle.exact(*args), f"trial {trial}")


def test_exact_ties_round_half_to_even():
    """Scales that make acc * multiplier land exactly on .5: exact numerics must round to even."""
    a = np.arange(-8, 8, dtype=s8).reshape(16, 1)
    b = np.ones((1, 1), s8)
    y = qm.qlinear_matmul(a, f32(0.5), s8(0), b, f32(1), s8(0), f32(1), s8(0), numerics="exact")
    expected = [round(Fraction(int(v), 2)) for v in a.ravel()]  # Python rounds half to even
    assert y.ravel().tolist() == expected
    assert expected[:4] == [-4, -4, -3, -2]  # -3.5 -> -4, -2.5 -> -2 ...
    # multiplier 1/6 with acc = 3: float32 ORT gives a tie, the exact value 0.5 too; scale 3/24 exactness:
    a = np.full((1, 12), 1, s8)
    b = np.full((12, 1), 1, s8)
    y = qm.qlinear_matmul(a, f32(0.75), s8(0), b, f32(0.5), s8(0), f32(1.0), s8(0), numerics="exact")
    assert y.item() == 4  # 12 * 0.375 = 4.5 -> 4


def test_exact_tiny_and_huge_scales():
    a = np.array([[100, -100]], s8)
    b = np.array([[100], [50]], s8)
    args = (a, f32(1e-30), s8(0), b, f32(1e-30), s8(0), f32(1e-45), s8(0))  # 1e-45 is a float32 subnormal
    assert_identical(qm.qlinear_matmul(*args, numerics="exact"), oracle.exact(*args))
    args = (a, f32(3e38), s8(0), b, f32(3e38), s8(0), f32(1e-38), s8(0))
    assert qm.qlinear_matmul(*args, numerics="exact").item() == 127
    with pytest.raises(ValueError, match="^qlinear_matmul: a_scale \\* b_scale / y_scale overflows"):
        qm.qlinear_matmul(*args)


# --------------------------------------------------------------------------------------------------
# float8


@pytest.mark.parametrize("a_t", FLOAT8 + [u8])
@pytest.mark.parametrize("y_t", FLOAT8 + [s8])
def test_float8_path_against_oracle(a_t, y_t):
    rng = np.random.default_rng(5)
    b_t = FLOAT8[1] if a_t is u8 else a_t
    for a_shape, b_shape in [((3, 7), (7, 5)), ((2, 2, 16), (16, 3)), ((9,), (9, 4)), ((1, 200), (200, 1))]:
        a = _float8_or_int(rng, a_t, a_shape)
        b = _float8_or_int(rng, b_t, b_shape)
        zero = lambda t: np.zeros((), t)
        args = (a, f32(0.02), zero(a_t), b, f32(0.5), zero(b_t), f32(0.01), zero(y_t))
        maximum = float(ml_dtypes.finfo(y_t).max) if y_t in FLOAT8 else None
        expected = oracle.float8_path(*args, float8_max=maximum, pair_order=_core.float8_pair_order())
        for numerics in ("onnxruntime", "onnx-reference"):
            assert_identical(qm.qlinear_matmul(*args, numerics=numerics), expected, f"{a_shape} {numerics}")
        assert_identical(qm.qlinear_matmul(*args, numerics="exact"), _float8_exact(args), f"{a_shape} exact")


@pytest.mark.parametrize("isa", kernel_levels())
def test_float8_path_per_row_and_column_scales_zero_points_and_every_kernel_path(isa):
    """Scales per row of a and per column of b factor out of the sum; uint8 operands keep their zero
    points; enough rows and columns for the 6 x 16 and 12 x 32 tiles and their tails; every kernel
    path, native or emulated, each against the oracle in its table's order (a pair table's where
    the entry has one: every value here is pair-exact)."""
    before = qm.cpu_info()["isa"]
    qm.set_isa(isa)
    try:
        rng = np.random.default_rng(6)
        e4, e5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
        for a_t, b_t, y_t, (M, K, N) in [(e4, e4, e4, (13, 37, 35)), (u8, e5, s8, (7, 64, 17)),
                                         (e5, e4, u8, (6, 19, 16)), (e4, u8, e5, (1, 300, 3))]:
            a, b = _float8_or_int(rng, a_t, (M, K)), _float8_or_int(rng, b_t, (K, N))
            a_scale = rng.uniform(0.01, 0.05, M).astype(f32)
            b_scale = rng.uniform(0.1, 0.9, N).astype(f32)
            a_zp = np.full(M, 17 if a_t is u8 else 0, a_t)
            b_zp = np.full(N, 200 if b_t is u8 else 0, b_t)
            y_zp = np.zeros((), y_t)
            y_scale = f32(0.05)
            maximum = float(ml_dtypes.finfo(y_t).max) if y_t in FLOAT8 else None
            expected = oracle.float8_path(a, a_scale.reshape(M, 1), a_zp.reshape(M, 1), b, b_scale, b_zp, y_scale,
                                          y_zp, float8_max=maximum, pair_order=_core.float8_pair_order())
            y = qm.qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
            assert_identical(y, expected, f"{isa} {a_t.__name__} x {b_t.__name__} -> {y_t.__name__} {M}x{K}x{N}")
    finally:
        qm.set_isa(before)


def _float8_or_int(rng, dtype, shape):
    if dtype in FLOAT8:
        return rng.normal(0, 4, shape).astype(dtype)
    return random_values(rng, dtype, shape, "uniform")


def _float8_exact(args):
    """Independent exact oracle: every dequantized value as a Fraction, exact sums, one final rounding."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    fa = np.vectorize(lambda v: Fraction(float(v)), otypes=[object])((a2.astype(np.float64) - float(a_z)) * 1.0)
    fb = np.vectorize(lambda v: Fraction(float(v)), otypes=[object])((b2.astype(np.float64) - float(b_z)) * 1.0)
    x = np.matmul(fa * Fraction(float(a_s)), fb * Fraction(float(b_s)))
    values = x / Fraction(float(y_s))
    out_t = y_z.dtype
    if out_t in [np.dtype(t) for t in FLOAT8]:
        table = np.arange(256, dtype=np.uint8).view(out_t)
        finite = table[np.isfinite(table.astype(np.float64))]
        result = np.empty(values.shape, out_t)
        for idx in np.ndindex(*values.shape):
            v = values[idx] + Fraction(float(y_z))
            v = max(min(v, Fraction(float(ml_dtypes.finfo(out_t).max))), -Fraction(float(ml_dtypes.finfo(out_t).max)))
            dist = [abs(Fraction(float(c)) - v) for c in finite]
            best = min(dist)
            candidates = [c for c, d in zip(finite, dist) if d == best]
            even = [c for c in candidates if int(np.array(c).view(np.uint8)) % 2 == 0]
            result[idx] = (even or candidates)[0]
    else:
        info = np.iinfo(out_t)
        result = np.vectorize(lambda v: min(max(round(v) + int(y_z), info.min), info.max), otypes=[object])(values)
        result = result.astype(out_t)
    return result.reshape(np.matmul(np.zeros(a.shape), np.zeros(b.shape)).shape)


def test_float8_special_values():
    e4 = ml_dtypes.float8_e4m3fn
    a = np.array([[np.nan, 1.0], [448.0, 448.0]], e4)
    b = np.array([[1.0], [1.0]], e4)
    y = qm.qlinear_matmul(a, f32(1), e4(0), b, f32(1), e4(0), f32(0.5), e4(0))
    assert np.isnan(y[0, 0].astype(np.float32)) and y[1, 0].astype(np.float32) == 448.0  # 1792 saturates
    yi = qm.qlinear_matmul(a, f32(1), e4(0), b, f32(1), e4(0), f32(0.5), u8(3))
    assert yi.tolist() == [[3], [255]]  # NaN -> zero point; 1792 saturates
    with pytest.raises(ValueError, match="^qlinear_matmul: numerics='exact' needs finite operands"):
        qm.qlinear_matmul(a, f32(1), e4(0), b, f32(1), e4(0), f32(0.5), e4(0), numerics="exact")


# --------------------------------------------------------------------------------------------------
# the seed's worked examples (ONNX QLinearMatMul docs, opsets 10 and 21)

SEED_A = np.array([[208, 236, 0, 238], [3, 214, 255, 29]], u8)
SEED_B = np.array([[152, 51, 244], [60, 26, 255], [0, 127, 246], [127, 254, 247]], u8)
SEED_Y = np.array([[168, 115, 255], [1, 66, 151]], u8)


@pytest.mark.parametrize("numerics", ["onnxruntime", "onnx-reference", "exact"])
def test_seed_examples(numerics):
    s = lambda v: np.array([v], f32)
    y2 = qm.qlinear_matmul(SEED_A, s(0.0066), np.array([113], u8), SEED_B, s(0.00705), np.array([114], u8),
                           s(0.0107), np.array([118], u8), numerics=numerics)
    assert_identical(y2, SEED_Y)
    a3 = np.stack([SEED_A, SEED_A])
    b3 = np.stack([SEED_B, SEED_B])
    y3 = qm.qlinear_matmul(a3, s(0.0066), np.array([113], u8), b3, s(0.00705), np.array([114], u8),
                           s(0.0107), np.array([118], u8), numerics=numerics)
    assert_identical(y3, np.stack([SEED_Y, SEED_Y]))


# --------------------------------------------------------------------------------------------------
# inputs: layouts, read-only, never modified


def test_non_contiguous_fortran_readonly_inputs_unmodified():
    rng = np.random.default_rng(3)
    a_full = rng.integers(0, 256, (8, 20), dtype=u8)
    b = np.asfortranarray(rng.integers(-64, 64, (10, 6), dtype=s8))  # 7 bits: see _reduce_range
    a = a_full[::2, ::2]  # non-contiguous view
    b_s = np.full(6, 0.01, f32)
    b_z = rng.integers(-5, 5, 6, dtype=s8)
    params = [np.asarray(x) for x in (f32(0.02), u8(120), b_s, b_z, f32(0.5), u8(128))]
    for x in (a_full, b, *params):
        x.flags.writeable = False
    copies = [x.copy() for x in (a_full, b, *params)]
    args = (a, params[0], params[1], b, b_s, b_z, params[4], params[5])
    ours = qm.qlinear_matmul(*args)
    assert_identical(ours, oracle.onnxruntime(*args))
    assert_identical(ours, run_onnxruntime(np.ascontiguousarray(a), *args[1:3], np.ascontiguousarray(b), *args[4:]))
    for x, c in zip((a_full, b, *params), copies):
        assert np.array_equal(x, c)


# --------------------------------------------------------------------------------------------------
# bad input: clear errors that start with the function's name


def _good():
    return [np.zeros((2, 3), u8), f32(1), u8(0), np.zeros((3, 4), s8), f32(1), s8(0), f32(1), u8(0)]


@pytest.mark.parametrize("index, value, error, message", [
    (0, np.zeros((2, 3), np.int32), TypeError, "a dtype int32 is not supported"),
    (0, [[1, 2, 3]], TypeError, "a dtype int64 is not supported"),
    (3, np.zeros((3, 4), np.float32), TypeError, "b dtype float32 is not supported"),
    (2, s8(0), TypeError, "a_zero_point dtype int8 does not match a dtype uint8"),
    (5, u8(0), TypeError, "b_zero_point dtype uint8 does not match b dtype int8"),
    (7, 3, TypeError, "y_zero_point must be a numpy array or scalar"),
    (7, np.float32(0), TypeError, "y_zero_point dtype float32 is not supported"),
    (1, np.float64(1), TypeError, "a_scale dtype float64 is not supported"),
    (4, f16(1), TypeError, "the three scales must share one dtype"),
    (1, f32(0), ValueError, "a_scale must be nonzero"),
    (6, f32(np.inf), ValueError, "y_scale must be finite"),
    (4, f32(np.nan), ValueError, "b_scale must be finite"),
    (3, np.zeros((4, 4), s8), ValueError, "inner dimensions differ"),
    (0, np.zeros((), u8), ValueError, "a must have at least 1 dimension"),
    (2, np.zeros(2, u8), ValueError, "a_zero_point has shape \\(2,\\), expected its scale's shape"),
    (4, np.ones(3, f32), ValueError, "b_zero_point has shape \\(\\), expected its scale's shape \\(3,\\)"),
])
def test_bad_input_messages(index, value, error, message):
    args = _good()
    args[index] = value
    with pytest.raises(error, match="^qlinear_matmul: " + message):
        qm.qlinear_matmul(*args)


def test_bad_parameter_shapes_and_options():
    args = _good()
    args[1], args[2] = np.ones(3, f32), np.zeros(3, u8)  # per-row needs M=2 entries
    with pytest.raises(ValueError, match="^qlinear_matmul: a_scale/a_zero_point has shape \\(3,\\)"):
        qm.qlinear_matmul(*args)
    args = _good()
    args[4], args[5] = np.ones(3, f32), np.zeros(3, s8)  # per-column needs N=4 entries
    with pytest.raises(ValueError, match="^qlinear_matmul: b_scale/b_zero_point has shape \\(3,\\)"):
        qm.qlinear_matmul(*args)
    args = _good()
    args[6], args[7] = np.ones((3, 4), f32), np.zeros((3, 4), u8)
    with pytest.raises(ValueError, match="^qlinear_matmul: y_scale has shape \\(3, 4\\)"):
        qm.qlinear_matmul(*args)
    args = _good()
    args[0] = np.zeros((2, 2, 3), u8)
    args[3] = np.zeros((3, 3, 4), s8)
    with pytest.raises(ValueError, match="^qlinear_matmul: batch dimensions"):
        qm.qlinear_matmul(*args)
    with pytest.raises(ValueError, match="^qlinear_matmul: numerics must be one of"):
        qm.qlinear_matmul(*_good(), numerics="fast")


def test_python_float_scales_are_float32():
    args = _good()
    args[1], args[4], args[6] = 0.5, 0.25, 0.125
    assert qm.qlinear_matmul(*args).dtype == u8


def test_float8_output_step_and_operand_conversion_are_numpys_bit_for_bit(isa):
    """The float path's output step in C++ (_core.float8_output: d * (a_scale * b_scale) / y_scale
    + y_zp, then the conversion) against the same numpy expression, on every kernel level (the
    AVX-512 float8 entries run it 16 lanes at a time, the last partial 16 through copies), on d
    with NaN of both signs, infinities, zeros of both signs, subnormals, values far out of range;
    per-row, per-column, batched and broadcast parameters (zero strides) and a strided one (the
    scalar path), float16 and bfloat16 scales, a nonzero float8 zero point; and the C++ lookup of
    an 8-bit operand as float32 (64 K elements and more) against numpy's table lookup, every byte
    value."""
    from quantmatmul._dtypes import _TO_FLOAT32, FLOAT8_TYPES, to_float32

    rng = np.random.default_rng(21)
    B, M, N = 3, 37, 41
    d = (rng.standard_normal((B, M, N)) * 10.0 ** rng.integers(-30, 30, (B, M, N))).astype(f32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38], f32)
    d.flat[rng.choice(d.size, 200, replace=False)] = rng.choice(special, 200)
    for code, t in enumerate(FLOAT8_TYPES):
        for scale_t in (f32, np.float16, ml_dtypes.bfloat16):
            a_scale = rng.uniform(0.01, 2, (B, M, 1)).astype(scale_t)
            b_scale = rng.uniform(0.01, 2, (1, 1, N)).astype(scale_t)
            y_scale = np.full((1, 1, 1), 0.37, scale_t)
            zero = float(np.arange(256, dtype=u8).view(t).astype(f32)[3])  # a small nonzero value
            # A third of d aimed at the float8 type's rounding midpoints (within a few float32 ulps
            # after the scaling): there, an operation in another order or rounding shows.
            values = np.arange(256, dtype=u8).view(t).astype(np.float64)
            finite = np.sort(values[np.isfinite(values)])
            mids = (finite[:-1] + finite[1:]) / 2
            aim = rng.random((B, M, N)) < 0.33
            scale = a_scale.astype(np.float64) * b_scale.astype(np.float64) / y_scale.astype(np.float64)
            target = (rng.choice(mids, (B, M, N)) / scale).astype(f32)
            for _ in range(2):
                target = np.where(rng.random(target.shape) < 0.5, np.nextafter(target, f32(np.inf)), target)
            d = np.where(aim, target, d)
            strided = rng.choice([0, zero], (B, 1, 2 * N)).astype(t)[:, :, ::2]  # a column stride of 2
            for y_zp in (np.zeros((1, 1, 1), t), np.full((1, 1, 1), zero, t), rng.choice([0, zero], (B, 1, N)).astype(t),
                         strided):
                params = [np.broadcast_to(np.asarray(x, f32), (B, M, N)) for x in (a_scale, b_scale, y_scale, y_zp)]
                if y_zp is strided:
                    params[3] = np.broadcast_to(strided.astype(f32).repeat(2, axis=2)[:, :, ::2], (B, M, N))
                ours = _core.float8_output(d, *params, code)
                with np.errstate(over="ignore", invalid="ignore"):
                    v = d * (a_scale.astype(f32) * b_scale.astype(f32)) / y_scale.astype(f32) + y_zp.astype(f32)
                limit = float(ml_dtypes.finfo(t).max)
                expected = np.clip(v, -limit, limit).astype(t).view(u8)
                np.testing.assert_array_equal(ours, expected, err_msg=f"{t} {scale_t}")
    for t in FLOAT8_TYPES + (np.dtype(np.int8), np.dtype(u8)):
        q = rng.integers(0, 256, (70000,), dtype=u8).view(t).reshape(7, 10000)[:, ::-1]  # not contiguous
        q = np.concatenate([q.reshape(-1), np.arange(256, dtype=u8).view(t)])
        np.testing.assert_array_equal(to_float32(q).view(np.uint32), _TO_FLOAT32[q.dtype][q.view(u8)].view(np.uint32))


def test_float8_output_conversion_matches_ml_dtypes_bit_for_bit():
    """The C++ float32 -> float8 conversion of the float path against numpy.clip + ml_dtypes' astype:
    every float8 value, every midpoint between neighbours (ties to even) and its float32 neighbours,
    zeros, NaN, infinities, far out of range and random values over 14 decades."""
    from quantmatmul import _core
    from quantmatmul._dtypes import FLOAT8_TYPES

    rng = np.random.default_rng(12)
    for code, t in enumerate(FLOAT8_TYPES):
        values = np.arange(256, dtype=np.uint8).view(t).astype(f32)
        finite = np.sort(values[np.isfinite(values)])
        mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(f32)
        x = np.concatenate([finite, mids, np.nextafter(mids, f32(np.inf)), np.nextafter(mids, f32(-np.inf)),
                            (rng.standard_normal(50000) * 10.0 ** rng.integers(-8, 6, 50000)).astype(f32),
                            np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-40, -1e-40], f32)])
        limit = float(ml_dtypes.finfo(t).max)
        expected = np.clip(x, -limit, limit).astype(t).view(u8)
        np.testing.assert_array_equal(_core.float32_to_float8(x, code), expected, err_msg=str(t))


def test_float8_operands_with_nonzero_float8_zero_points():
    """A float8 zero point other than 0 (which no DequantizeLinear allows, but QLinearMatMul's types
    do) is subtracted from a and from b before the float32 products, on every kernel table: a - zp
    is then no longer a bfloat16 pair, so pair tables run their float32 FMA order, the oracle's."""
    rng = np.random.default_rng(21)
    e4 = ml_dtypes.float8_e4m3fn
    M, K, N = 9, 40, 20
    a, b = _float8_or_int(rng, e4, (M, K)), _float8_or_int(rng, e4, (K, N))
    a_zp, b_zp = np.array(448.0, e4), np.array(-1.125, e4)
    args = (a, f32(0.03), a_zp, b, f32(0.5), b_zp, f32(0.05), np.zeros((), e4))
    expected = oracle.float8_path(*args, float8_max=448.0)
    before = qm.cpu_info()["isa"]
    try:
        for level in kernel_levels():
            qm.set_isa(level)
            assert_identical(qm.qlinear_matmul(*args), expected, level)
            assert_identical(qm.QLinearMatMul(b, f32(0.5), b_zp)(a, f32(0.03), a_zp, f32(0.05), np.zeros((), e4)),
                             expected, level)
    finally:
        qm.set_isa(before)


@pytest.mark.parametrize("numerics", ["onnxruntime", "onnx-reference", "exact"])
def test_leading_dimensions_fold_into_rows_with_a_matrix_b(numerics):
    """a [..., M, K] with a matrix b and per-tensor a and y parameters runs as one product of all of a's
    rows (qlinear._run): every shape and value is numpy.matmul's, row by row the 2-D product's bits
    and the oracle's, the held weight's too, zero-size batches and float8 operands included."""
    rng = np.random.default_rng(77)
    b = rng.integers(-128, 128, (37, 19)).astype(np.int8)
    b_scale, b_zp = rng.uniform(0.01, 0.02, 19).astype(np.float32), rng.integers(-5, 5, 19).astype(np.int8)
    held = qm.QLinearMatMul(b, b_scale, b_zp)
    params = (np.float32(0.03), np.uint8(7), np.float32(0.4), np.uint8(120))
    for shape in [(2, 3, 5, 37), (4, 1, 37), (0, 6, 37), (3, 0, 37)]:
        a = rng.integers(0, 256, shape).astype(np.uint8)
        y = qm.qlinear_matmul(a, params[0], params[1], b, b_scale, b_zp, *params[2:], numerics=numerics)
        assert y.shape == shape[:-1] + (19,) and y.dtype == np.uint8
        rows = a.reshape(-1, 37)
        want = qm.qlinear_matmul(rows, params[0], params[1], b, b_scale, b_zp, *params[2:], numerics=numerics)
        assert np.array_equal(y.reshape(-1, 19), want)
        assert np.array_equal(held(a, *params, numerics=numerics), y)
        if rows.size:  # against the oracle, one 2-D product per matrix of a
            for i, matrix in enumerate(a.reshape(-1, shape[-2], 37)):
                mine = y.reshape(-1, shape[-2], 19)[i]
                model = {"onnxruntime": oracle.onnxruntime, "onnx-reference": oracle.onnx_reference}.get(
                    numerics, oracle.exact
                )
                theirs = model(matrix, params[0], params[1], b, b_scale, b_zp, *params[2:])
                assert np.array_equal(mine, theirs)
    # float8 (the float path): each matrix of a as its own 2-D product
    e4 = ml_dtypes.float8_e4m3fn
    a8 = rng.normal(size=(3, 4, 37)).astype(e4)
    b8 = rng.normal(size=(37, 19)).astype(e4)
    z8 = np.zeros((), e4)
    y8 = qm.qlinear_matmul(a8, np.float32(0.5), z8, b8, np.float32(0.25), z8, np.float32(2.0), z8, numerics=numerics)
    for i in range(3):
        one = qm.qlinear_matmul(
            a8[i], np.float32(0.5), z8, b8, np.float32(0.25), z8, np.float32(2.0), z8, numerics=numerics
        )
        assert y8[i].tobytes() == one.tobytes()
    # per-tensor parameters of rank 3 (valid for a 3-D a: they broadcast) keep the batch and its checks
    a = rng.integers(0, 256, (2, 3, 37)).astype(np.uint8)
    y = qm.qlinear_matmul(a, np.full((1, 1, 1), 0.03, np.float32), np.full((1, 1, 1), 7, np.uint8), b, b_scale, b_zp,
                          np.full((1, 1, 1), 0.4, np.float32), np.full((1, 1, 1), 120, np.uint8), numerics=numerics)
    want = qm.qlinear_matmul(a, *params[:2], b, b_scale, b_zp, *params[2:], numerics=numerics)
    assert np.array_equal(y, want)
    # a non-contiguous a (a transposed view) folds through a copy of its rows
    a = rng.integers(0, 256, (37, 5, 4)).astype(np.uint8).transpose(2, 1, 0)
    y = qm.qlinear_matmul(a, params[0], params[1], b, b_scale, b_zp, *params[2:], numerics=numerics)
    want = qm.qlinear_matmul(np.ascontiguousarray(a).reshape(-1, 37), params[0], params[1], b, b_scale, b_zp,
                             *params[2:], numerics=numerics)
    assert np.array_equal(y.reshape(-1, 19), want)


def test_output_zero_points_per_column_and_per_row_on_every_table(isa):
    """The AVX-512 epilogue forms its clamp bounds once for a row whose output zero points are one value and
    drops the column-sum multiply where za' is 1 (a folded bias); rows with zero points per column, per row
    or one per tensor give the portable table's bits on every table, with and without a's zero point."""
    import quantmatmul as qm

    rng = np.random.default_rng(6)
    M, K, N = 21, 40, 53  # columns off the 16 lanes
    a = rng.integers(0, 256, (M, K), np.uint8)
    b = rng.integers(-128, 128, (K, N), np.int8)
    cases = [np.uint8(7), rng.integers(0, 256, N).astype(np.uint8), rng.integers(0, 256, (M, 1)).astype(np.uint8)]
    for y_zp, a_zp in itertools.product(cases, (np.uint8(0), np.uint8(131))):
        y_scale = np.full(y_zp.shape, 0.9, np.float32)  # (y's scale and zero point share a shape)
        args = (a, np.float32(0.03), a_zp, b, np.float32(0.02), np.int8(0), y_scale, y_zp)
        got = qm.qlinear_matmul(*args)
        with kernel_entry("qgemm", "portable"):
            want = qm.qlinear_matmul(*args)
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 50


def test_a_zero_point_per_row_that_changes_between_row_blocks_on_every_table(isa):
    """A task's column terms (za' times b's column sums, less the bias) are formed once and reused by its row
    blocks that share za': a per-row zero point constant within blocks of 64 rows but different between them
    (and one that differs within a block, and b per call, so one task sweeps every block) gives the oracle's
    bits on every table."""
    rng = np.random.default_rng(8)
    M, K, N = 256, 64, 96  # (N > 64: not a small product)
    a = rng.integers(0, 256, (M, K), np.uint8)
    b = rng.integers(-128, 128, (K, N), np.int8)
    blocks = np.repeat(rng.integers(0, 256, M // 64), 64).astype(np.uint8).reshape(M, 1)
    mixed = blocks.copy()
    mixed[100:140] = rng.integers(0, 256, (40, 1))
    for a_zp in (blocks, mixed):
        args = (a, np.full((M, 1), 0.03, np.float32), a_zp, b, np.float32(0.02), np.int8(0), np.float32(0.25), np.uint8(128))
        got = qm.qlinear_matmul(*args)
        np.testing.assert_array_equal(got, oracle.onnxruntime(*args))
        assert len(np.unique(got)) > 50
