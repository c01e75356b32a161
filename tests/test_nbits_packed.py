"""test_nbits_packed.py: MatMulNBits level 4 on a weight packed once for the kernel entry (the "quads x16" layout of the avx2, avx512_vnni and amx entries): the same bits as the codes read as they are, on every path; packing follows set_isa."""

import copy
import pickle

import numpy as np
import pytest
from conftest import kernel_entry
from test_matmul_nbits import BITS, ZP_FORMS, Case, assert_within, tight_tolerance

import quantmatmul
from quantmatmul import MatMulNBits, _core, matmul_nbits

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


@pytest.mark.parametrize("entry", ENTRIES, ids=[level for level, _ in ENTRIES])
@pytest.mark.parametrize("bits", BITS)
def test_packed_equals_unpacked_bit_for_bit(bits, entry):
    """Every width x block sizes 16..512 x rows 1-15 (AVX2's packed few-row kernel: passes of 4 rows
    and their tails, both float32 orders; 8-bit codes from 8 rows on take the GEMM; the VNNI
    few-row kernel below 8 rows, its GEMM from 8) and 16, 21 (the GEMMs, and the AMX tiles, with
    their panels taken from the packed codes) x every zero-point form, K from 1 to 19 blocks (whole
    groups of 8 blocks and blocks left over, the float32 order's two parts), N from 1 to 41 (panels
    of 16 and a column tail; tasks of 16 and 32 columns): the
    held weight (packed) gives the bits of matmul_nbits (codes read as they are), within the tight
    tolerance of the exact product of the level's operands."""
    rng = np.random.default_rng(6100 + bits)
    level, hidden = entry
    with kernel_entry("nbits", level, hidden) as name:
        assert name == level
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
                held = _held(case, accuracy_level=4)
                assert held._packed is not None and held._packed.layout == "quads x16"
                y = held(case.A)
                _same_bits(y, case.run(4), f"{case} packed vs unpacked")
                y_eff, tol = tight_tolerance(case, 4)
                assert_within(y, y_eff, tol, f"{case} tight")


@pytest.mark.parametrize("entry", ENTRIES, ids=[level for level, _ in ENTRIES])
@pytest.mark.parametrize("bits", [2, 4, 7, 8])
def test_packed_extreme_codes_and_nonfinite_rows(bits, entry):
    """Codes at their maximum against qa = +-127 (8-bit: |c - 128| * 127 pair sums near 2^15, and
    the + 128 * sum qa that makes them sum qa * c), a row with a NaN block and a row of infinities
    (scale NaN, qa 0): the unpacked kernels' bits, NaN where they give NaN."""
    rng = np.random.default_rng(6200 + bits)
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
                held = MatMulNBits(B, scales, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=4)
                assert held._packed is not None
                y = held(A)
                expected = matmul_nbits(A, B, scales, K=K, N=N, bits=bits, block_size=block_size, accuracy_level=4)
            assert np.isnan(y[0]).all()
            _same_bits(y, expected, f"bits {bits} block {block_size} M {M}")


def test_packing_follows_the_entry():
    """Packed for the entry in use when constructed, and then held only packed (the codes dropped);
    after set_isa to an entry without the layout (portable) the codes come back from the packed
    form, bit for bit, and the result is that entry's; back at avx2 it is packed again."""
    rng = np.random.default_rng(6300)
    case = Case(rng, 4, 32, K=200, N=30, batch=(3,), zp="packed", bias=True)
    with kernel_entry("nbits", "avx2"):
        held = _held(case, accuracy_level=4)
        codes, packed, layout = held._held
        assert codes is None and layout == "quads x16" and held.nbytes >= packed.nbytes > case.B.nbytes
        assert held.nbytes < 2 * packed.nbytes  # codes not held twice
        _same_bits(held(case.A), case.run(4), "avx2")
    with kernel_entry("nbits", "portable") as entry:
        assert entry == "portable" and _core.nbits_int8_layout() is None
        y = held(case.A)
        codes, packed, layout = held._held
        assert packed is None and layout is None
        assert np.array_equal(codes, case.B.reshape(case.N, -1))
        _same_bits(y, case.run(4), "portable, held vs function")
    with kernel_entry("nbits", "avx2"):
        y = held(case.A)
        assert held._packed is not None and held._held[0] is None
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
            packed = _core.pack_nbits_int8(B, K, bits, block_size, scales, zero_points)
        assert packed.layout == "quads x16"
        assert np.array_equal(_core.unpack_nbits_int8(packed), B) and np.array_equal(B, before)


def test_codes_are_needed_where_the_kernels_do_not_read_the_packed_weight():
    """Without the codes, a call under an entry of another layout (or none) is refused with a clear
    error, never run on absent codes."""
    rng = np.random.default_rng(6600)
    case = Case(rng, 4, 32, K=64, N=16, batch=(2,))
    B = case.B.reshape(case.N, -1)
    scales = case.scales.reshape(case.N, -1).astype(np.float32)
    zero_points = np.full(scales.shape, 8, np.uint8)
    with kernel_entry("nbits", "avx2"):
        packed = _core.pack_nbits_int8(B, case.K, 4, 32, scales, zero_points)
        y = _core.matmul_nbits_int8(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)
        _same_bits(y, _core.matmul_nbits_int8(case.A, B, case.K, 4, 32, scales, zero_points, None), "no codes")
    with kernel_entry("nbits", "portable"):
        with pytest.raises(ValueError, match="matmul_nbits: the codes are needed"):
            _core.matmul_nbits_int8(case.A, None, case.K, 4, 32, scales, zero_points, None, packed=packed)


def test_weights_the_layout_does_not_take():
    """No packing for g_idx (level 4 runs through the float kernels there), for block sizes above
    4096 (the int32 block sums could overflow), or at levels 0-3; those weights keep their codes and
    run as before."""
    rng = np.random.default_rng(6400)
    with kernel_entry("nbits", "avx2"):
        g = Case(rng, 4, 32, K=96, N=9, batch=(2,), g="random")
        held = _held(g, accuracy_level=4)
        assert held._packed is None and held._held[0] is not None
        _same_bits(held(g.A), g.run(4), "g_idx")
        big = Case(rng, 4, 8192, K=8192, N=3, batch=(2,))
        held = _held(big, accuracy_level=4)
        assert held._packed is None
        _same_bits(held(big.A), big.run(4), "block 8192")
        level0 = Case(rng, 4, 32, K=64, N=8, batch=(1,))
        held = _held(level0, accuracy_level=0)
        assert held._packed is None
        _same_bits(held(level0.A), level0.run(0), "level 0")
        assert _held(Case(rng, 4, 4096, K=4096, N=3, batch=(1,)), accuracy_level=4)._packed is not None


def test_pickle_and_deepcopy_give_the_same_results():
    """A held weight (packed, codes dropped) pickles and deep-copies with its codes; the copy packs
    them again for the kernels in use, also under another entry, with the original's bits."""
    rng = np.random.default_rng(6700)
    case = Case(rng, 4, 32, K=160, N=40, batch=(3,), zp="packed", bias=True)
    with kernel_entry("nbits", "avx2"):
        held = _held(case, accuracy_level=4)
        expected = held(case.A)
        for clone in (pickle.loads(pickle.dumps(held)), copy.deepcopy(held)):
            assert clone._held[1] is None or clone._held[1] is not held._held[1]
            _same_bits(clone(case.A), expected, "copy")
            assert clone._packed is not None and clone._held[0] is None
    with kernel_entry("nbits", "portable"):
        _same_bits(pickle.loads(pickle.dumps(held))(case.A), case.run(4), "copy under portable")
