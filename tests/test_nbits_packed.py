"""test_nbits_packed.py: MatMulNBits on a weight packed once for the kernel entry (the "quads x16" layout: level 4 on the avx2, avx512_vnni and amx entries, levels 0/1 on every x86 entry): the same bits as the codes read as they are, on every path; levels 0/1 in their documented float32 order; packing follows set_isa."""

import copy
import pickle

import numpy as np
import pytest
from conftest import kernel_entry
from test_matmul_nbits import BITS, ZP_FORMS, Case, assert_within, fma_f32, tight_tolerance

import quantmatmul
from quantmatmul import MatMulNBits, _core, matmul_nbits
from quantmatmul.reference import matmul_nbits as oracle

pytestmark = pytest.mark.skipif("avx2" not in quantmatmul.available_isas(), reason="no AVX2 entry on this CPU")

# The entries whose level-4 kernels read the layout: avx2, and the AVX-512 VNNI kernels (the
# avx512_vnni entry; the amx entry runs them below 16 rows), native where the CPU has them, else
# emulated. (The avx512bf16 and amxbf16 entries run the same level-4 kernels.)
_HERE = quantmatmul.available_isas() + quantmatmul.emulated_isas()
ENTRIES = [
    (level, hidden)
    for level, hidden in [
        ("avx2", ()),
        ("avx512_vnni", ("avx512_bf16",)),
        ("avx512_vnni-emulated", ("avx512_bf16",)),
        ("amx", ("amx_bf16",)),
        ("amx-emulated", ("amx_bf16",)),
    ]
    if level in _HERE
]


def _held(case, **kw):
    return MatMulNBits(case.B, case.scales, case.zero_points, case.g_idx, case.bias, **case.kw, **kw)


def _same_bits(y, expected, what):
    assert np.array_equal(y.view(np.uint32), expected.view(np.uint32)), what


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("entry", ENTRIES, ids=[level for level, _ in ENTRIES])
@pytest.mark.parametrize("bits", BITS)
def test_packed_equals_unpacked_bit_for_bit(bits, entry, level):
    """Every width x block sizes 16..512 x rows 1-15 (the packed few-row kernels: passes of 4 rows
    and their tails, both float32 orders; AVX2's 8-bit codes from 8 rows on take the GEMM; the VNNI
    kernel's 8-bit codes from 8 rows the GEMM's integers) and 16, 21 (AVX2's GEMM and the AMX tiles
    with their panels taken from the packed codes; VNNI's few-row kernel still, against its GEMM on
    the codes) x every zero-point form, K from 1 to 19 blocks (whole groups of 8 blocks and blocks
    left over, the float32 order's two parts), N from 1 to 41 (panels of 16 and a column tail;
    tasks of 16 and 32 columns): the held weight (packed) gives the bits of matmul_nbits (codes
    read as they are), within the tight tolerance of the exact product of the level's operands.
    Level 0 likewise (every x86 entry packs at levels 0/1: the few-row kernels read the packed
    weight or panels built from the codes; from 13 rows the prefill dequantizes either)."""
    rng = np.random.default_rng(6100 + bits + level)
    isa, hidden = entry
    with kernel_entry("nbits", isa, hidden) as name:
        assert name == isa
        layout = _core.nbits_weight_layout(level)
        for block_size in (16, 32, 64, 128, 512):
            for M in (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 21):
                zp = ZP_FORMS[int(rng.integers(0, len(ZP_FORMS)))]
                K = block_size * int(rng.integers(1, 20)) - int(rng.integers(0, block_size // 2 + 1))
                case = Case(
                    rng,
                    bits,
                    block_size,
                    K=K,
                    N=int(rng.integers(1, 42)),
                    batch=(M,),
                    zp=zp,
                    bias=bool(rng.integers(0, 2)),
                )
                held = _held(case, accuracy_level=level)
                assert (held._packed is not None and held._packed.layout == "quads x16") == (layout is not None)
                y = held(case.A)
                _same_bits(y, case.run(level), f"{case} packed vs unpacked, level {level}")
                y_eff, tol = tight_tolerance(case, level)
                assert_within(y, y_eff, tol, f"{case} tight")


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("entry", ENTRIES, ids=[level for level, _ in ENTRIES])
@pytest.mark.parametrize("bits", [2, 4, 7, 8])
def test_packed_extreme_codes_and_nonfinite_rows(bits, entry, level):
    """Codes at their maximum against qa = +-127 (8-bit: |c - 128| * 127 pair sums near 2^15, and
    the + 128 * sum qa that makes them sum qa * c), a row with a NaN block and a row of infinities
    (level 4: scale NaN, qa 0): the unpacked kernels' bits, NaN where they give NaN."""
    rng = np.random.default_rng(6200 + bits + level)
    for block_size in (16, 32, 256):
        K, N = 11 * block_size, 19
        B = np.full((N, K // block_size, block_size * bits // 8), 255, np.uint8)
        scales = rng.uniform(0.5, 2.0, (N, K // block_size)).astype(np.float32)
        for M in (1, 4, 6, 9):
            A = np.ones((M, K), np.float32)
            A[1::2] = -1.0
            A[0, block_size : 2 * block_size] = np.nan
            if M > 2:
                A[2] = np.inf
            with kernel_entry("nbits", *entry):
                held = MatMulNBits(B, scales, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
                assert (held._packed is not None) == (_core.nbits_weight_layout(level) is not None)
                y = held(A)
                expected = matmul_nbits(A, B, scales, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=level)
            assert np.isnan(y[0]).all()
            _same_bits(y, expected, f"bits {bits} block {block_size} M {M}")


@pytest.mark.parametrize("entry", ENTRIES, ids=[level for level, _ in ENTRIES])
def test_packed_gemm_rows_beyond_the_few_row_kernel(entry):
    """Level 4 in the few-row kernel's passes of up to 8 rows (VNNI, 2- and 4-bit storage: every row
    tail 2-7 past whole passes) and where a packed weight leaves it for the GEMM on its panels (AVX2 from
    16 rows, AVX-512 VNNI from 256; 8-bit codes from 8 on AVX2, from 24 on VNNI; AMX tiles from 16):
    the bits of the codes read
    as they are, every zero-point form, 2-, 4- and 8-bit codes, short K (the row counts are large)."""
    rng = np.random.default_rng(6150)
    isa, hidden = entry
    with kernel_entry("nbits", isa, hidden):
        for bits in (2, 4, 8):
            for M in (10, 11, 12, 14, 16, 24, 255, 256, 300):
                zp = ZP_FORMS[int(rng.integers(0, len(ZP_FORMS)))]
                block_size = (16, 32, 64)[int(rng.integers(0, 3))]
                K = block_size * int(rng.integers(1, 4)) - int(rng.integers(0, block_size // 2 + 1))
                case = Case(rng, bits, block_size, K=K, N=int(rng.integers(1, 42)), batch=(M,), zp=zp, bias=True)
                _same_bits(_held(case, accuracy_level=4)(case.A), case.run(4), f"{isa} {case} M {M}")


@pytest.mark.parametrize("zp", ZP_FORMS)
def test_packing_follows_the_entry(zp):
    """Packed for the entry in use when constructed, and then held only packed (the codes, scales
    and zero points dropped: the packed form holds them); after set_isa to an entry without the
    layout (portable) the codes, scales and zero points come back from the packed form, bit for
    bit, and the result is that entry's; back at avx2 it is packed again."""
    rng = np.random.default_rng(6300)
    case = Case(rng, 4, 32, K=200, N=30, batch=(3,), zp=zp, bias=True)
    reference = MatMulNBits(case.B, case.scales, case.zero_points, None, case.bias, **case.kw, accuracy_level=4)
    with kernel_entry("nbits", "portable"):
        given = reference._for_kernels()  # held as given: the codes, float32 scales and the kernels' zero points
    with kernel_entry("nbits", "avx2"):
        held = _held(case, accuracy_level=4)
        arrays, layout = held._held
        assert arrays.codes is None and arrays.scales is None and arrays.zero_points is None
        assert layout == "quads x16" and held.nbytes == arrays.packed.nbytes + case.bias.nbytes
        _same_bits(held(case.A), case.run(4), "avx2")
    with kernel_entry("nbits", "portable") as entry:
        assert entry == "portable" and _core.nbits_weight_layout(4) is None
        y = held(case.A)
        arrays, layout = held._held
        assert arrays.packed is None and layout is None
        assert np.array_equal(arrays.codes, case.B.reshape(case.N, -1))
        for name in ("scales", "zero_points"):
            back, before = getattr(arrays, name), getattr(given, name)
            assert back.dtype == before.dtype and np.array_equal(back.view(np.uint8), before.view(np.uint8)), name
        _same_bits(y, case.run(4), "portable, held vs function")
    with kernel_entry("nbits", "avx2"):
        y = held(case.A)
        assert held._packed is not None and held._held[0].codes is None
        _same_bits(y, case.run(4), "avx2 again")


@pytest.mark.parametrize("bits", BITS)
def test_unpack_restores_the_codes(bits):
    """The packed form holds every code, those past K included (whatever they hold): unpacking
    gives the codes back byte for byte; the inputs are not modified."""
    rng = np.random.default_rng(6500 + bits)
    for block_size in (16, 32, 128):
        N, kb = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        B = rng.integers(0, 256, (N, kb * block_size * bits // 8), dtype=np.uint8)
        before = B.copy()
        scales = rng.uniform(0.5, 2.0, (N, kb)).astype(np.float32)
        zero_points = rng.integers(0, 2**bits, (N, kb)).astype(np.uint8)
        K = kb * block_size - int(rng.integers(0, block_size))
        with kernel_entry("nbits", "avx2"):
            packed = _core.pack_nbits_weight(B, K, bits, block_size, scales, zero_points, 4)
        assert packed.layout == "quads x16"
        assert np.array_equal(_core.unpack_nbits_weight(packed), B) and np.array_equal(B, before)


def test_codes_are_needed_where_the_kernels_do_not_read_the_packed_weight():
    """Without the codes, a call under an entry of another layout (or none) runs on the entry that
    packed the weight (another thread's set_isa may come between a MatMulNBits' choice of its
    weight and the call), and where no entry reads it (levels 2/3) is refused with a clear error,
    never run on absent codes; with the packed form (read by the entry in use) the codes, scales
    and zero points may all be absent; codes without their scales are refused."""
    rng = np.random.default_rng(6600)
    case = Case(rng, 4, 32, K=64, N=16, batch=(2,))
    B = case.B.reshape(case.N, -1)
    scales = case.scales.reshape(case.N, -1).astype(np.float32)
    zero_points = np.full(scales.shape, 8, np.uint8)
    with kernel_entry("nbits", "avx2"):
        packed = _core.pack_nbits_weight(B, case.K, 4, 32, scales, zero_points, 4)
        y = _core.matmul_nbits_int8(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)
        _same_bits(y, _core.matmul_nbits_int8(case.A, B, case.K, 4, 32, scales, zero_points, None), "no codes")
        y = _core.matmul_nbits_f32(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)
        _same_bits(y, _core.matmul_nbits_f32(case.A, B, case.K, 4, 32, scales, zero_points, None), "no codes, f32")
        y = _core.matmul_nbits_int8(case.A, None, case.K, 4, 32, None, None, None, packed=packed)  # as MatMulNBits
        _same_bits(y, _core.matmul_nbits_int8(case.A, B, case.K, 4, 32, scales, zero_points, None), "packed only")
        with pytest.raises(ValueError, match="matmul_nbits: the codes come with their scales and zero points"):
            _core.matmul_nbits_int8(case.A, B, case.K, 4, 32, None, None, None)
        for operands in (1, 2):  # levels 2/3: their kernels read the codes
            with pytest.raises(ValueError, match="matmul_nbits: the codes are needed"):
                _core.matmul_nbits_f32(case.A, None, case.K, 4, 32, scales, zero_points, None, operands, packed=packed)
        on_avx2 = [
            f(case.A, B, case.K, 4, 32, scales, zero_points, None)
            for f in (_core.matmul_nbits_int8, _core.matmul_nbits_f32)
        ]
    with kernel_entry("nbits", "portable"):  # no layout: the avx2 entry that packed it runs the call
        y = _core.matmul_nbits_int8(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)
        _same_bits(y, on_avx2[0], "packed under avx2, level 4 under portable")
        y = _core.matmul_nbits_f32(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)
        _same_bits(y, on_avx2[1], "packed under avx2, level 0 under portable")
        with pytest.raises(ValueError, match="matmul_nbits: the codes are needed"):
            _core.matmul_nbits_f32(case.A, None, case.K, 4, 32, scales, zero_points, None, 2, packed=packed)


def test_weights_the_layout_does_not_take():
    """No packing for g_idx (level 4 runs through the float kernels there), for block sizes above
    4096 (the int32 block sums could overflow), or at levels 2/3 (their rounding reads the codes);
    those weights keep their codes and run as before. Levels 0/1 pack on every x86 entry (the AVX-512
    ones since nbits_packed_f32_avx512.cpp)."""
    rng = np.random.default_rng(6400)
    with kernel_entry("nbits", "avx2"):
        g = Case(rng, 4, 32, K=96, N=9, batch=(2,), g="random")
        held = _held(g, accuracy_level=4)
        assert held._packed is None and held._held[0].codes is not None
        _same_bits(held(g.A), g.run(4), "g_idx")
        big = Case(rng, 4, 8192, K=8192, N=3, batch=(2,))
        held = _held(big, accuracy_level=4)
        assert held._packed is None
        _same_bits(held(big.A), big.run(4), "block 8192")
        for level in (2, 3):
            rounded = Case(rng, 4, 32, K=64, N=8, batch=(1,))
            held = _held(rounded, accuracy_level=level)
            assert held._packed is None
            _same_bits(held(rounded.A), rounded.run(level), f"level {level}")
        assert _held(Case(rng, 4, 4096, K=4096, N=3, batch=(1,)), accuracy_level=4)._packed is not None
        for level in (0, 1):
            assert _held(Case(rng, 4, 32, K=64, N=8, batch=(1,)), accuracy_level=level)._packed is not None
    for isa, hidden in ENTRIES:
        if isa != "avx2":
            with kernel_entry("nbits", isa, hidden):
                assert _core.nbits_weight_layout(0) == "quads x16" and _core.nbits_weight_layout(4) == "quads x16"


def test_pickle_and_deepcopy_give_the_same_results():
    """A held weight (packed, codes, scales and zero points dropped) pickles and deep-copies with its
    codes, scales and zero points; the copy packs them again for the kernels in use, also under
    another entry, with the original's bits."""
    rng = np.random.default_rng(6700)
    case = Case(rng, 4, 32, K=160, N=40, batch=(3,), zp="packed", bias=True)
    with kernel_entry("nbits", "avx2"):
        held = _held(case, accuracy_level=4)
        expected = held(case.A)
        for clone in (pickle.loads(pickle.dumps(held)), copy.deepcopy(held)):
            assert clone._held[0].packed is None and clone._held[1] is None  # the arrays, packed on first use
            _same_bits(clone(case.A), expected, "copy")
            assert clone._packed is not None and clone._packed is not held._packed and clone._held[0].codes is None
    with kernel_entry("nbits", "portable"):
        _same_bits(pickle.loads(pickle.dumps(held))(case.A), case.run(4), "copy under portable")


def _levels01_model(case):
    """The documented float32 order of levels 0/1 on AVX2 with up to 12 rows (docs/matmul_nbits.md):
    per output and block b, dot = an FMA chain over the block's k in order from +0 (codes past K meet
    a = +0); y = fma(-asum_b, s_b * z_b, fma(dot, s_b, y)) over the blocks in order from +0, asum_b
    the block's float32 sum of A in order of k from +0 and s_b * z_b one float32 product; + bias."""
    f32 = np.float32
    d = oracle.Decoded(case.B, case.scales, case.zero_points, None, **case.kw)
    bs, kb = case.block_size, case.k_blocks
    A = case.A.reshape(-1, case.K).astype(f32)
    M = A.shape[0]
    s = d.s_blocks.astype(f32)  # [N, kb]
    sz = s * d.z_blocks.astype(f32)
    q = d.q.astype(f32)  # [N, K]
    y = np.zeros((M, case.N), f32)
    for b in range(kb):
        ks = range(b * bs, min(case.K, (b + 1) * bs))
        dot = np.zeros((M, case.N), f32)
        asum = np.zeros(M, f32)
        for k in ks:
            dot = fma_f32(A[:, k, None], q[None, :, k], dot)
            asum = asum + A[:, k]
        y = fma_f32(dot, s[None, :, b], y)
        y = fma_f32(-asum[:, None], sz[None, :, b], y)
    if case.bias is not None:
        y = y + case.bias.astype(f32)
    return y


# The entries whose levels 0/1 read the layout: avx2, and every AVX-512 one (nbits_packed_f32_avx512.cpp:
# avx512_vnni, amx, and with BF16 features shown their avx512bf16 / amxbf16 entries, which run the same
# level-0/1 code), native where the CPU has them, else emulated.
F32_ENTRIES = ENTRIES + [
    (level, ()) for level in ("avx512_vnni", "avx512_vnni-emulated", "amx", "amx-emulated") if level in _HERE
]


@pytest.mark.parametrize(
    "entry",
    F32_ENTRIES,
    ids=[f"{level}{'-bf16' if not hidden and level != 'avx2' else ''}" for level, hidden in F32_ENTRIES],
)
@pytest.mark.parametrize("bits", BITS)
def test_levels01_few_rows_follow_the_documented_order(bits, entry):
    """Levels 0/1 with up to 12 rows on every x86 entry, bit for bit against a numpy model of the
    documented order, on the held (packed) weight and on the codes (matmul_nbits: panels of the
    layout built per call): every zero-point form, blocks of 16 to 256, K with a partial last
    block, N with a column tail (AVX-512: passes of four panels at 1-2 rows, two at 3-4, and the
    panels left over one at a time), one row to 12 (passes of 4), bias or none."""
    rng = np.random.default_rng(6800 + bits)
    isa, hidden = entry
    with kernel_entry("nbits", isa, hidden) as name:
        assert _core.nbits_weight_layout(0) == "quads x16", name
        for i, block_size in enumerate((16, 32, 64, 256, 32, 16, 128, 32)):
            M = (1, 2, 3, 4, 5, 12, 6, 9)[i]
            K = block_size * int(rng.integers(1, 6)) - int(rng.integers(0, block_size // 2 + 1))
            case = Case(
                rng, bits, block_size, K=K, N=int(rng.integers(1, 70)), batch=(M,), zp=ZP_FORMS[i % 3], bias=bool(i % 2)
            )
            model = _levels01_model(case)
            for level in (0, 1):
                held = _held(case, accuracy_level=level)
                assert held._packed is not None
                _same_bits(held(case.A), model, f"{case} held, level {level}")
                _same_bits(case.run(level), model, f"{case} codes, level {level}")
