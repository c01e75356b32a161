"""test_float8_pairs.py: the float8 path's bfloat16 pair tables (AVX512-BF16 vdpbf16ps), bit for bit against a numpy model of their documented order, and how the driver and selection choose them."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from conftest import kernel_entry, kernel_levels

import quantmatmul as qm
from quantmatmul import _core
from quantmatmul.reference import qlinear_matmul as oracle

f32, f64 = np.float32, np.float64
FLOAT8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz]


def float8_entry(level, hidden=()):
    return kernel_entry("float8", level, hidden)


def float8_entries():
    """Every float8 entry this machine runs (natively or emulated), as (entry, level, hidden
    features): each level of the `isa` fixture, with and without AVX512-BF16 or AMX-BF16."""
    found = {}
    for level in kernel_levels():
        for hidden in ((), ("avx512_bf16",), ("amx_bf16",)):
            with float8_entry(level, hidden) as entry:
                found.setdefault(entry, (level, hidden))
    return [(entry, *where) for entry, where in found.items()]


PAIR_ENTRIES = []
for _entry, _level, _hidden in float8_entries():
    with float8_entry(_level, _hidden):
        if _core.float8_pair_order() is not None:
            PAIR_ENTRIES.append((_entry, _level, _hidden))


def _add_f32(acc, p):
    """float32 acc + p, p exact in float64, rounded once to float32 (nearest even), elementwise: the
    float64 sum s and its error e (TwoSum: s + e is exact); s rounds to the right float32 unless
    it sits exactly halfway between two of them while e moves the exact sum off the midpoint."""
    a = acc.astype(f64)
    s = a + p
    bv = s - a
    e = (a - (s - bv)) + (p - bv)
    r = s.astype(f32)
    r64 = r.astype(f64)
    other = np.nextafter(r, np.where(s > r64, np.inf, -np.inf).astype(f32))  # the neighbour on s's side
    tie = (s != r64) & ((r64 + other.astype(f64)) / 2 == s) & (e != 0)
    return np.where(tie, np.where(e > 0, np.maximum(r, other), np.minimum(r, other)), r)


def pair_model(ca, cb, order):
    """The pair table's sum, [M, K] x [K, N] float32 (pair-exact values: exact products), vectorized:
    +0, then per pair of k (2j, 2j + 1) the two products added one at a time, rounded each time
    ("odd first", "even first"); or per chunk of 32 k ("tiles of 32 k"), the even-k products
    summed from +0 in order, the odd-k ones likewise, and their sum added."""
    ca, cb = ca.astype(f64), cb.astype(f64)
    K = ca.shape[1]
    acc = np.zeros((ca.shape[0], cb.shape[1]), f32)
    if order == "tiles of 32 k":
        for k0 in range(0, K, 32):
            sums = [np.zeros_like(acc), np.zeros_like(acc)]
            for k in range(k0, min(k0 + 32, K)):
                sums[k % 2] = _add_f32(sums[k % 2], ca[:, k, None] * cb[None, k, :])
            acc = _add_f32(acc, _add_f32(sums[0], sums[1].astype(f64)).astype(f64))
        return acc
    assert order in ("odd first", "even first"), order
    first = 1 if order == "odd first" else 0
    for j in range(0, K, 2):
        for k in (j + first, j + 1 - first):
            if k < K:
                acc = _add_f32(acc, ca[:, k, None] * cb[None, k, :])
    return acc


def in_order_model(ca, cb):
    acc = np.zeros((ca.shape[0], cb.shape[1]), f32)
    for k in range(ca.shape[1]):
        acc = _add_f32(acc, ca[:, k, None].astype(f64) * cb[None, k, :].astype(f64))
    return acc


def gemm_bits(ca, cb):
    """The float8 path's GEMM as the driver runs it, [M, K] x [K, N] float32 -> bits."""
    index = np.zeros(1, np.int64)
    out = np.empty((1, ca.shape[0], cb.shape[1]), f32)
    _core.matmul_f32_sequential(ca[None], index, cb[None], index, out)
    return out[0].view(np.uint32)


def wide_float8(rng, dtype, shape):
    """float8 values over most of the type's exponent range (both signs, zeros, subnormals): partial
    sums then need more than 24 bits and round, so that the order of the additions shows."""
    info = ml_dtypes.finfo(dtype)
    lo, hi = np.log2(float(info.smallest_subnormal)), np.log2(float(info.max))
    x = np.exp2(rng.uniform(lo, hi, shape)) * rng.choice([-1.0, 1.0], shape)
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(dtype)


def test_the_model_is_the_exact_fma_chain():
    """The vectorized models against the reference's exact scalar sums (Fractions, one rounding)."""
    rng = np.random.default_rng(1)
    ca = wide_float8(rng, FLOAT8[0], (3, 71)).astype(f32)
    cb = wide_float8(rng, FLOAT8[2], (71, 4)).astype(f32)
    for order in ("odd first", "even first", "tiles of 32 k", None):
        model = in_order_model(ca, cb) if order is None else pair_model(ca, cb, order)
        exact = [[oracle.float8_sum(ca[m], cb[:, n], order) for n in range(4)] for m in range(3)]
        assert np.array_equal(model.view(np.uint32), np.array(exact, f32).view(np.uint32)), order


# Shapes: K odd and even, 1 and 2, around the 128-pair k chunks (K = 255 .. 259); rows around the
# 12-row groups and the 48-row blocks; columns around the 16-column panels and 32-column pairs.
SHAPES = [(1, 1, 1), (1, 2, 16), (13, 37, 35), (12, 4, 32), (5, 255, 17), (3, 257, 33), (49, 6, 3), (2, 259, 70)]


@pytest.mark.parametrize("entry, level, hidden", PAIR_ENTRIES, ids=[e[0] for e in PAIR_ENTRIES])
@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda t: t.__name__)
def test_pair_table_is_its_documented_order_bit_for_bit(entry, level, hidden, dtype):
    """Every float8 type, with integer operands and integer zero points on the other side (the float
    path's c = q - zp, all pair-exact): the table's bits are the model's, and the in-order table's
    are not (on these wide-range values some outputs differ: the test can fail)."""
    rng = np.random.default_rng(FLOAT8.index(dtype))
    differs = 0
    with float8_entry(level, hidden) as running:
        assert running == entry
        order = _core.float8_pair_order()
        for i, (M, K, N) in enumerate(SHAPES):
            ca = wide_float8(rng, dtype, (M, K)).astype(f32)
            if i % 2:  # uint8 or int8 operand minus its zero point: integers |c| <= 255
                cb = (rng.integers(0, 256, (K, N)) - rng.integers(0, 256, (1, N))).astype(f32)
            else:
                cb = wide_float8(rng, FLOAT8[(FLOAT8.index(dtype) + i) % 4], (K, N)).astype(f32)
            assert oracle.pair_exact(ca).all() and oracle.pair_exact(cb).all()
            ours = gemm_bits(ca, cb)
            assert np.array_equal(ours, pair_model(ca, cb, order).view(np.uint32)), (entry, M, K, N)
            differs += int(np.sum(ours != in_order_model(ca, cb).view(np.uint32)))
            within_the_bound(ours.view(f32), ca, cb)
    assert differs > 0


def within_the_bound(d, ca, cb):
    """docs/quantization.md: |d - sum p| <= gamma(K - 1) * sum |p|, u = 2^-24, for every order of
    the recursive sum (the exact sum: math.fsum of the exact float64 products, off by 2^-53 at most)."""
    K = ca.shape[1]
    u = 2.0**-24
    gamma = (K - 1) * u / (1 - (K - 1) * u)
    for m in range(ca.shape[0]):
        for n in range(cb.shape[1]):
            p = ca[m].astype(f64) * cb[:, n].astype(f64)
            exact, size = math.fsum(p), math.fsum(np.abs(p))
            assert abs(float(d[m, n]) - exact) <= gamma * size * (1 + 2.0**-50), (m, n)


# Per pair order: a row and a column of e4m3fn values, K = 4, whose sum rounds differently in the
# table's order and in order of k; then those two sums. ulp(2^16) = 2^-7 in float32.
# "odd first": products 2^16, 0, 2^-8, 1.5 * 2^-8. In order, 2^16 + 2^-8 ties to 2^16, then
#   + 1.5 * 2^-8 gives 2^16 + 2^-7; odd first (k = 1, 0, 3, 2), 2^16 + 1.5 * 2^-8 gives
#   2^16 + 2^-7, then + 2^-8 ties up to 2^16 + 2^-6.
# "tiles of 32 k": products 2^16, 2^-8, 2^-9, 2^-9. In order, 2^16 + 2^-8 ties to 2^16 and the
#   2^-9s vanish: 2^16; the even sum 2^16 + 2^-9 is 2^16, the odd sum 2^-8 + 2^-9 = 1.5 * 2^-8,
#   and 2^16 + 1.5 * 2^-8 rounds to 2^16 + 2^-7.
ORDER_CASES = {
    "odd first": ([256.0, 0.0, 0.0625, 0.09375], [256.0, 0.0, 0.0625, 0.0625], 2.0**16 + 2.0**-6, 2.0**16 + 2.0**-7),
    "tiles of 32 k": ([256.0, 0.0625, 0.0625, 0.0625], [256.0, 0.0625, 2.0**-5, 2.0**-5], 2.0**16 + 2.0**-7, 2.0**16),
}


@pytest.mark.parametrize("entry, level, hidden", PAIR_ENTRIES, ids=[e[0] for e in PAIR_ENTRIES])
def test_pair_table_differs_from_the_in_order_sum(entry, level, hidden):
    """K = 4 products chosen so that the table's order and the in-order sum round differently
    (ORDER_CASES), checked against the scalar oracle too. Threads and batch do not change a bit."""
    with float8_entry(level, hidden):
        order = _core.float8_pair_order()
        row, col, table_value, in_order_value = ORDER_CASES[order]
        a, b = np.array([row], f32), np.array(col, f32).reshape(4, 1)
        assert oracle.float8_sum(a[0], b[:, 0], order) == table_value
        assert oracle.float8_sum(a[0], b[:, 0], None) == in_order_value
        assert gemm_bits(a, b)[0, 0] == np.array(table_value, f32).view(np.uint32)
        with float8_entry("portable"):
            assert gemm_bits(a, b)[0, 0] == np.array(in_order_value, f32).view(np.uint32)
        rng = np.random.default_rng(3)
        ca = wide_float8(rng, FLOAT8[0], (2, 50, 60)).astype(f32)
        cb = wide_float8(rng, FLOAT8[2], (3, 60, 40)).astype(f32)
        a_index, b_index = np.array([0, 1, 1], np.int64), np.array([2, 0, 1], np.int64)
        runs = []
        for threads in (1, 2, 3):
            before = qm.get_num_threads()
            qm.set_num_threads(threads)
            try:
                out = np.empty((3, 50, 40), f32)
                _core.matmul_f32_sequential(ca, a_index, cb, b_index, out)
            finally:
                qm.set_num_threads(before)
            runs.append(out.view(np.uint32))
        for t in range(3):
            expected = pair_model(ca[a_index[t]], cb[b_index[t]], order).view(np.uint32)
            assert all(np.array_equal(r[t], expected) for r in runs)


@pytest.mark.parametrize("entry, level, hidden", PAIR_ENTRIES, ids=[e[0] for e in PAIR_ENTRIES])
def test_values_that_are_not_pair_exact_take_the_in_order_table(entry, level, hidden):
    """One value anywhere in a or b that is not pair-exact (a float32 value, a float8 difference
    with a nonzero zero point, NaN, infinity, a value below 2^-48 or from 2^48) sends the whole
    call to the entry's float32 table: one FMA per k in order, the portable entry's bits."""
    rng = np.random.default_rng(4)
    M, K, N = 13, 41, 35
    base_a = wide_float8(rng, FLOAT8[0], (M, K)).astype(f32)
    base_b = wide_float8(rng, FLOAT8[2], (K, N)).astype(f32)
    e4 = ml_dtypes.float8_e4m3fn
    nonzero_zp = np.array(448.0, e4).astype(f32) - np.array(2.0**-9, e4).astype(f32)
    spoilers = [f32(1.0 + 2.0**-10), nonzero_zp, f32(np.nan), f32(np.inf), f32(2.0**-49), f32(2.0**48), f32(2.0**-130)]
    for value in spoilers:
        assert not oracle.pair_exact(np.array([value])).all()
        for side in ("a", "b"):
            a, b = base_a.copy(), base_b.copy()
            (a if side == "a" else b).flat[7] = value
            with float8_entry(level, hidden):
                ours = gemm_bits(a, b)
            with float8_entry("portable"):
                expected = gemm_bits(a, b)
            assert np.array_equal(ours, expected), (value, side)
    # The bounds themselves are pair-exact: 2^-48 and the largest bfloat16 below 2^48
    assert oracle.pair_exact(np.array([2.0**-48, -(2.0**48 - 2.0**40), 0.0, -0.0], f32)).all()


@pytest.mark.parametrize("entry, level, hidden", PAIR_ENTRIES, ids=[e[0] for e in PAIR_ENTRIES])
def test_qlinear_matmul_float8_on_the_pair_table_against_the_oracle(entry, level, hidden):
    """The whole float path (zero points, per-row and per-column scales, float8 and integer
    outputs) on the pair table: the oracle with the table's order; "exact" numerics unchanged."""
    rng = np.random.default_rng(8)
    e4, e5, u8 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.uint8
    with float8_entry(level, hidden):
        order = _core.float8_pair_order()
        for a_t, b_t, y_t, (M, K, N) in [
            (e4, e4, e4, (13, 37, 35)),
            (u8, e5, np.int8, (7, 64, 17)),
            (e5, u8, e5, (6, 20, 16)),
        ]:
            a = wide_float8(rng, a_t, (M, K)) if a_t is not u8 else rng.integers(0, 256, (M, K)).astype(u8)
            b = wide_float8(rng, b_t, (K, N)) if b_t is not u8 else rng.integers(0, 256, (K, N)).astype(u8)
            a_scale, b_scale = rng.uniform(0.01, 0.05, M).astype(f32), rng.uniform(0.1, 0.9, N).astype(f32)
            a_zp = np.full(M, 17 if a_t is u8 else 0, a_t)
            b_zp = np.full(N, 200 if b_t is u8 else 0, b_t)
            y_scale, y_zp = f32(0.05), np.zeros((), y_t)
            maximum = float(ml_dtypes.finfo(y_t).max) if y_t in (e4, e5) else None
            args = (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
            expected = oracle.float8_path(
                a,
                a_scale.reshape(M, 1),
                a_zp.reshape(M, 1),
                b,
                b_scale,
                b_zp,
                y_scale,
                y_zp,
                float8_max=maximum,
                pair_order=order,
            )
            y = qm.qlinear_matmul(*args)
            assert np.array_equal(y.view(np.uint8), expected.view(np.uint8)), (a_t, b_t, y_t)
            exact = qm.qlinear_matmul(*args, numerics="exact")
        with float8_entry("portable"):
            assert np.array_equal(qm.qlinear_matmul(*args, numerics="exact").view(np.uint8), exact.view(np.uint8))


def test_selection_prefers_the_bf16_entry_where_the_cpu_has_it():
    """At level avx512_vnni the float8 family has two entries; the one needing AVX512-BF16 too wins
    where it runs (emulated: where it is asked for and not hidden), whatever order the builds
    register in; with avx512_bf16 hidden, the avx512f entry runs. At level amx the AMX-BF16 entry
    runs where the CPU has AMX-BF16; without it, the best AVX-512 one."""
    entries = qm.cpu_info()["entries"]
    features = qm.cpu_info()["features"]
    if "avx512_vnni" in qm.available_isas():
        best_native = "avx512bf16" if features["avx512_bf16"] and "float8:avx512bf16" in entries else "avx512f"
    else:
        best_native = "avx2" if "avx2" in qm.available_isas() else "portable"
    if "avx512_vnni-emulated" in qm.emulated_isas() and "float8:avx512bf16 (emulated)" in entries:
        with float8_entry("avx512_vnni-emulated") as entry:
            assert entry == "avx512bf16-emulated" and _core.float8_pair_order() == "odd first"
        with float8_entry("avx512_vnni-emulated", ["avx512_bf16"]) as entry:
            assert entry == "avx512f-emulated" and _core.float8_pair_order() is None
    if "avx512_vnni" in qm.available_isas():
        with float8_entry("avx512_vnni") as entry:
            assert entry == best_native
        with float8_entry("avx512_vnni", ["avx512_bf16"]) as entry:
            assert entry == "avx512f"
    if "amx-emulated" in qm.emulated_isas() and "float8:amx (emulated)" in entries:
        with float8_entry("amx-emulated") as entry:
            assert entry == "amx-emulated" and _core.float8_pair_order() == "tiles of 32 k"
        with float8_entry("amx-emulated", ["amx_bf16"]) as entry:
            # No emulated entry of level amx is left: the best native one below it runs.
            assert entry == best_native
    if "amx" in qm.available_isas():
        amx_bf16 = features["amx_bf16"] and "float8:amx" in entries
        with float8_entry("amx") as entry:
            assert entry == ("amx" if amx_bf16 else "avx512bf16" if features["avx512_bf16"] else "avx512f")
        with float8_entry("amx", ["amx_bf16"]) as entry:
            assert entry == ("avx512bf16" if features["avx512_bf16"] else "avx512f")
    with pytest.raises(ValueError, match="unknown feature"):
        _core.hide_features(["sse9"])
    assert qm.cpu_info()["self_test"] is None


@pytest.mark.parametrize("entry, level, hidden", float8_entries(), ids=[e[0] for e in float8_entries()])
def test_every_float8_entry_float32_table_is_the_portable_one(entry, level, hidden):
    """Every float8 entry's float32 table (the avx512f entry's, the avx512bf16 entry's copy of the
    same tile, ...) on float32 values (never pair-exact): bit for bit the portable entry's FMA
    chain in order of k, rows and columns around the tiles, K around the 128-step chunks."""
    rng = np.random.default_rng(12)
    for M, K, N in [(13, 129, 33), (1, 2, 70), (25, 7, 17)]:
        ca = rng.standard_normal((M, K)).astype(f32)
        cb = rng.standard_normal((K, N)).astype(f32)
        with float8_entry(level, hidden) as running:
            assert running == entry
            ours = gemm_bits(ca, cb)
        with float8_entry("portable"):
            assert np.array_equal(ours, gemm_bits(ca, cb)), (entry, M, K, N)


@pytest.mark.parametrize("entry, level, hidden", float8_entries(), ids=[e[0] for e in float8_entries()])
def test_constant_float8_weight_is_packed_once_and_follows_the_entry(entry, level, hidden):
    """QLinearMatMul packs a float8 b once (float32 panels, and bfloat16 pairs where the entry has a
    pair table), packs it again when the float8 entry changes, and gives the bits of the per-call
    path under every entry, whichever entry it was first packed for; batched and 1-D b too. A
    PackedF32 handed to the core under another entry than its own is still run in the current
    entry's order (pairs derived from its panels)."""
    rng = np.random.default_rng(13)
    e4, e5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    a = wide_float8(rng, e4, (2, 19, 37))
    args = (f32(0.03), np.zeros((), e4), f32(0.7), np.zeros((), e5))
    for b in (wide_float8(rng, e5, (37, 35)), wide_float8(rng, e4, (2, 37, 18)), wide_float8(rng, e4, 37)):
        with float8_entry("portable"):
            w = qm.QLinearMatMul(b, f32(0.25), np.zeros((), b.dtype))
            assert w._packed.entry == "portable"
        with float8_entry(level, hidden):
            expected = qm.qlinear_matmul(a, args[0], args[1], b, f32(0.25), np.zeros((), b.dtype), *args[2:])
            y = w(a, *args)
            assert w._packed.entry == entry
            assert np.array_equal(y.view(np.uint8), expected.view(np.uint8)), (entry, b.shape)
    ca, cb = wide_float8(rng, e4, (7, 33)).astype(f32), wide_float8(rng, e5, (33, 20)).astype(f32)
    index = np.zeros(1, np.int64)
    with float8_entry("portable"):
        stale = _core.pack_f32(cb[None])
    with float8_entry(level, hidden):
        out = np.empty((1, 7, 20), f32)
        _core.matmul_f32_sequential(ca[None], index, stale, index, out)
        order = _core.float8_pair_order()
        model = in_order_model(ca, cb) if order is None else pair_model(ca, cb, order)
        assert np.array_equal(out[0].view(np.uint32), model.view(np.uint32)), entry
        assert np.array_equal(out[0].view(np.uint32), gemm_bits(ca, cb))


@pytest.mark.parametrize("entry, level, hidden", PAIR_ENTRIES, ids=[e[0] for e in PAIR_ENTRIES])
def test_buffers_kept_between_calls_on_several_threads(entry, level, hidden):
    """A float8 a goes to C++ as codes, looked up into a buffer the calling thread keeps: calls that
    grow and shrink it, on 3 threads whose tasks all read it, give the oracle's bits (with the
    table's order) every time."""
    rng = np.random.default_rng(9)
    e4 = ml_dtypes.float8_e4m3fn
    before = qm.get_num_threads()
    try:
        qm.set_num_threads(3)
        with float8_entry(level, hidden):
            order = _core.float8_pair_order()
            for M, K, N in [(8, 40, 24), (40, 96, 40), (5, 33, 17), (40, 96, 40)]:
                a, b = wide_float8(rng, e4, (M, K)), wide_float8(rng, e4, (K, N))
                zero = np.zeros((), e4)
                args = (a, f32(0.03), zero, b, f32(0.5), zero, f32(0.05), zero)
                expected = oracle.float8_path(*args, float8_max=448.0, pair_order=order)
                assert np.array_equal(qm.qlinear_matmul(*args).view(np.uint8), expected.view(np.uint8))
                w = qm.QLinearMatMul(b, f32(0.5), zero)
                assert np.array_equal(w(a, f32(0.03), zero, f32(0.05), zero).view(np.uint8), expected.view(np.uint8))
    finally:
        qm.set_num_threads(before)
