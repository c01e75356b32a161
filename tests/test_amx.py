"""test_amx.py: the AMX-INT8 int8 GEMM entry (layout kLayoutTiles), emulated (amx-emulated) on any AVX2 machine and natively where the CPU has AMX, against the oracles bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import quantmatmul as qm
from quantmatmul.reference import qlinear_matmul as oracle

u8, s8, f32 = np.uint8, np.int8, np.float32
COMBOS = [(x, y, z) for x in (u8, s8) for y in (u8, s8) for z in (u8, s8)]
TILES_LAYOUT = 3  # kLayoutTiles (csrc/qgemm.h)

AMX_ISAS = [isa for isa in ("amx-emulated", "amx") if isa in qm.emulated_isas() + qm.available_isas()]

# Around the entry's sizes: 32-row groups (AMX for 16 rows or more, of which 16 and 32 are stored
# straight from the tiles and the rest through a buffer; vpdpbusd below 16, in steps of 8), 32-column
# panels, k-groups of 64 (k-quads inside), and the driver's 2^15-deep int32 chunks.
SHAPES = [
    (1, 1, 1),
    (1, 5, 3),
    (15, 64, 32),
    (16, 64, 32),
    (17, 65, 33),
    (32, 128, 32),
    (33, 130, 70),
    (64, 200, 100),
    (2, 70001, 3),
]


@pytest.fixture(params=AMX_ISAS or [pytest.param(None, marks=pytest.mark.skip(reason="no AMX entry built"))])
def amx_isa(request):
    """Selects an AMX entry (emulated, and native where the CPU has AMX); restores the level before."""
    before = qm.cpu_info()["isa"]
    qm.set_isa(request.param)
    kernels = qm.cpu_info()["kernels"]
    assert kernels["qgemm"] == request.param and kernels["qgemm_layout"].startswith("int8 tiles")
    yield request.param
    qm.set_isa(before)


def random_problem(rng, combo, M, K, N, per_column=False, extreme=False, batch=()):
    """Random operands (or only each type's extremes), zero points near the middle of the range
    (the extremes too with `extreme`), and a y_scale that spreads the accumulators over the output."""
    a_t, b_t, y_t = combo

    def values(t, shape, zero_point=False):
        info = np.iinfo(t)
        if extreme:
            return rng.choice(np.array([info.min, info.max], t), shape)
        if zero_point:  # far from the middle, (a - za)(b - zb) has a mean no output range can hold
            middle = (int(info.min) + int(info.max) + 1) // 2
            return rng.integers(middle - 30, middle + 31, shape).astype(t)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(t)

    b_shape = (N,) if per_column else ()
    a, a_zp = values(a_t, batch + (M, K)), values(a_t, (), True)
    b, b_zp = values(b_t, (K, N)), values(b_t, b_shape, True)
    a_s, b_s = f32(rng.uniform(0.001, 0.05)), rng.uniform(0.001, 0.05, b_shape).astype(f32)
    acc = np.matmul(a.astype(np.int64) - int(a_zp), b.astype(np.int64) - b_zp.astype(np.int64))
    span = max(int(acc.max()) - int(acc.min()), 1) if acc.size else 1
    y_s = f32(float(a_s) * float(np.max(b_s)) * span / 300)
    return a, a_s, a_zp, b, b_s, b_zp, y_s, values(y_t, (), True)


def check_all_numerics(args, context, exact=True, spread=False):
    ours = qm.qlinear_matmul(*args)
    assert np.array_equal(ours, oracle.onnxruntime(*args)), context
    if spread and ours.size >= 16:  # not saturated: the comparison sees the accumulators
        assert np.unique(ours).size > min(ours.size // 4, 40), context
    assert np.array_equal(qm.qlinear_matmul(*args, numerics="onnx-reference"), oracle.onnx_reference(*args)), context
    if exact:  # the fractions oracle is slow
        assert np.array_equal(qm.qlinear_matmul(*args, numerics="exact"), oracle.exact(*args)), context


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "".join(np.dtype(t).char for t in c))
def test_matches_the_oracles(amx_isa, combo):
    rng = np.random.default_rng(sum(map(ord, amx_isa)) + 7 * COMBOS.index(combo))
    for M, K, N in SHAPES:
        # The deep shape (a slow oracle) once, with random values; the others also with extremes and per-column b.
        for variant in range(1 if K > 10_000 else 2):
            args = random_problem(rng, combo, M, K, N, per_column=variant == 1, extreme=variant == 1)
            check_all_numerics(
                args,
                f"{amx_isa} {M}x{K}x{N} variant {variant}",
                exact=M * K * N < 100_000,
                spread=variant == 0 and K > 1,
            )


def test_deep_k_through_the_tiles(amx_isa):
    """K = 70001: k-groups past one 2^15-deep int32 chunk, through the tiles (32 rows, stored straight,
    and 20 rows, through the buffer), with the extreme values that make the int32 sums wrap."""
    K = 70001
    rng = np.random.default_rng(3)
    for M in (32, 20):
        a = rng.choice(np.array([0, 255], u8), (M, K))
        b = rng.choice(np.array([-128, 127], s8), (K, 17))
        args = (a, f32(1), u8(3), b, f32(1), s8(-5), f32(2.0**20), s8(7))
        check_all_numerics(args, f"{amx_isa} {M}x{K}x17", exact=False)
        exact = qm.qlinear_matmul(*args, numerics="exact")
        acc = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 5)
        assert np.array_equal(exact, np.clip(7 + np.round(acc / 2.0**20), -128, 127).astype(s8))


@pytest.mark.parametrize("a_batch", [(3,), (2, 1)], ids=["batch3", "batch2x1"])
def test_batched_a(amx_isa, a_batch):
    """Several matrices of a, each packed at its own place in the tiles layout (32-row groups x 16 int32 per k-group)."""
    rng = np.random.default_rng(11)
    for M, K, N in [(20, 70, 40), (40, 130, 33), (5, 64, 64)]:
        args = random_problem(rng, (u8, s8, u8), M, K, N, batch=a_batch)
        b3 = np.stack([args[3], args[3][::-1].copy(), args[3] // 2])  # b batched too: [3, K, N]
        check_all_numerics(args, f"{amx_isa} {a_batch} {M}x{K}x{N}", exact=False, spread=True)
        batched = (args[0], args[1], args[2], b3, args[4], args[5], args[6], args[7])
        check_all_numerics(batched, f"{amx_isa} {a_batch} {M}x{K}x{N}, b [3, K, N]", exact=False)


@pytest.mark.parametrize("combo", [(u8, u8, u8), (s8, s8, s8), (u8, s8, s8)], ids=["uuu", "sss", "uss"])
def test_constant_weight_packed_for_another_layout(amx_isa, combo):
    """QLinearMatMul packed under avx2 (int16 pairs) re-packs for the tiles, and back: the same bits."""
    rng = np.random.default_rng(5)
    for M, K, N in [(1, 5, 3), (17, 65, 33), (33, 200, 70)]:
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = random_problem(rng, combo, M, K, N, per_column=True)
        expected = oracle.onnxruntime(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp)
        qm.set_isa("avx2")
        w = qm.QLinearMatMul(b, b_s, b_zp)
        assert np.array_equal(w(a, a_s, a_zp, y_s, y_zp), expected)
        qm.set_isa(amx_isa)
        assert np.array_equal(w(a, a_s, a_zp, y_s, y_zp), expected)
        assert w._packed.layout == TILES_LAYOUT  # re-packed for the entry in use
        for numerics, reference in (("onnx-reference", oracle.onnx_reference), ("exact", oracle.exact)):
            assert np.array_equal(
                w(a, a_s, a_zp, y_s, y_zp, numerics=numerics), reference(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp)
            ), numerics
        w_tiles = qm.QLinearMatMul(b, b_s, b_zp)  # packed for the tiles ...
        qm.set_isa("avx2")
        assert np.array_equal(w_tiles(a, a_s, a_zp, y_s, y_zp), expected)  # ... and re-packed back
        qm.set_isa(amx_isa)
