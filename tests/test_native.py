"""test_native.py: the native core: every kernel path this machine has, threads, concurrency, and the QLinearMatMul constant-weight class."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import quantmatmul as qm
from quantmatmul import _core
from quantmatmul.reference import qlinear_matmul as oracle

u8, s8, f32 = np.uint8, np.int8, np.float32
COMBOS = [(x, y, z) for x in (u8, s8) for y in (u8, s8) for z in (u8, s8)]
from conftest import TESTED_ISAS, kernel_levels  # the `isa` fixture (conftest.py) records each level it runs


def random_problem(rng, combo, M, K, N, per_column=False, extreme=False):
    a_t, b_t, y_t = combo

    def values(t, shape):
        info = np.iinfo(t)
        if extreme:
            return rng.choice(np.array([info.min, info.max], t), shape)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(t)

    b_shape = (N,) if per_column else ()
    a_s, b_s = f32(rng.uniform(0.001, 0.05)), rng.uniform(0.001, 0.05, b_shape).astype(f32)
    y_s = f32(float(a_s) * float(np.max(b_s)) * np.sqrt(max(K, 1)) * 3600 / 60)
    return (values(a_t, (M, K)), a_s, values(a_t, ()), values(b_t, (K, N)), b_s, values(b_t, b_shape), y_s,
            values(y_t, ()))


# Shapes around the kernel's tile sizes (4 rows, 16 columns, k in pairs, 2^15-deep chunks).
SHAPES = [(1, 1, 1), (1, 2, 16), (3, 3, 15), (4, 16, 16), (5, 17, 17), (9, 33, 31), (33, 64, 48), (1, 4096, 70),
          (70, 255, 33), (130, 130, 130), (2, 70001, 3)]


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "".join(np.dtype(t).char for t in c))
def test_every_path_matches_the_oracles(isa, combo):
    rng = np.random.default_rng(sum(map(ord, isa)) + 7 * COMBOS.index(combo))
    for M, K, N in SHAPES:
        for variant in range(2):
            args = random_problem(rng, combo, M, K, N, per_column=variant == 1, extreme=variant == 1 and K < 1000)
            context = f"{isa} {M}x{K}x{N} variant {variant}"
            ours = qm.qlinear_matmul(*args)
            assert np.array_equal(ours, oracle.onnxruntime(*args)), context
            assert np.array_equal(qm.qlinear_matmul(*args, numerics="onnx-reference"), oracle.onnx_reference(*args)), context
            if K * M * N < 100_000:  # the fractions oracle is slow
                assert np.array_equal(qm.qlinear_matmul(*args, numerics="exact"), oracle.exact(*args)), context


def test_b_per_call_narrower_than_a_panel_per_thread(isa):
    """b given per call, with fewer column panels than the threads its work is worth (about one per
    2 million multiply-adds): tasks of fewer panels, then runs of row blocks that each pack their
    column block again; batched (a's matrices over one b, and b's over one a) and per-column. Every
    thread count gives the oracle's bits."""
    rng = np.random.default_rng(sum(map(ord, isa)))
    before = qm.get_num_threads()
    try:
        for M, K, N in [(600, 512, 40), (3000, 512, 8), (97, 129, 70)]:  # the first two worth 6 threads
            args = list(random_problem(rng, (u8, s8, u8), M, K, N, per_column=N % 2 == 0))
            batched = [args, [np.stack([args[0]] * 3), *args[1:]], [*args[:3], np.stack([args[3]] * 3), *args[4:]]]
            for problem in batched:
                expected = oracle.onnxruntime(*problem)
                for threads in (1, 3, 7):
                    qm.set_num_threads(threads)
                    assert np.array_equal(qm.qlinear_matmul(*problem), expected), (isa, M, K, N, threads)
    finally:
        qm.set_num_threads(before)


def test_uint8_a_read_in_place_and_row_sums_skipped(isa):
    """uint8 a x int8 b is stored as given on the VNNI layout: A is read in place where K is a
    multiple of 4 and a's data 4-byte aligned (else packed), and A's row sums are skipped where every
    b zero point is 0. Each case against the oracle: b zero point 0 (per tensor, per column) and one
    column's nonzero; a misaligned (a view one byte into its buffer); K not a multiple of 4;
    batched a (in place, matrices M * K bytes apart) over one b and over batched b."""
    rng = np.random.default_rng(sum(map(ord, isa)) + 3)
    for M, K, N in [(9, 64, 40), (37, 260, 33), (1, 4096, 70), (33, 130, 17)]:
        a_s, b_s, y_s = f32(0.02), rng.uniform(0.001, 0.01, N).astype(f32), f32(0.02 * 0.01 * np.sqrt(K) * 60)
        a = rng.integers(0, 256, (M, K), dtype=u8)
        b = rng.integers(-128, 128, (K, N), dtype=s8)
        one_nonzero = np.zeros(N, s8)
        one_nonzero[N // 2] = 3
        misaligned = np.empty(M * K + 1, u8)[1:].reshape(M, K)
        misaligned[...] = a
        for a_in in (a, misaligned, np.stack([a, a[::-1]])):
            for b_in, b_zp, b_scale in [(b, s8(0), f32(0.004)), (b, np.zeros(N, s8), b_s), (b, one_nonzero, b_s),
                                        (np.stack([b, -b]), s8(0), f32(0.004))]:
                args = (a_in, a_s, u8(131), b_in, b_scale, b_zp, y_s, u8(128))
                context = (isa, M, K, N, a_in.ndim, a_in.ctypes.data % 4, b_in.ndim, np.ndim(b_zp))
                assert np.array_equal(qm.qlinear_matmul(*args), oracle.onnxruntime(*args)), context
                assert np.array_equal(qm.QLinearMatMul(b_in, b_scale, b_zp)(a_in, a_s, u8(131), y_s, u8(128)),
                                      oracle.onnxruntime(*args)), context


def test_small_products_read_in_place_match_the_oracles(isa):
    """Products of at most 2^16 multiply-adds a matrix with K <= 128 and N <= 64 and b per call take the
    entry's small-product kernels (a and b read in place, no packing: vpdpbusd on AVX-512 with the
    zero-point terms in the kernel, vpmaddwd on AVX2 with the zero points subtracted first). Their edges
    against the oracle: K odd, 1, below 16 (the partial loads: through the rows below, 9 x 6 x 10) and
    128 (and 129, past the limit: the packed path), N across the 16- and 8-column strips up to 64 (and
    65), rows not a multiple of 4 or 8, and more than a block's (130 x 128 x 64: 128 rows a block);
    every signedness with operands and zero points at the types'
    ends; a zero point per row of a and per column of b; batches through the per-tensor path
    (attention's products); and the same b as a constant weight (packed) gives the same bits."""
    rng = np.random.default_rng(sum(map(ord, isa)) + 11)
    shapes = [(1, 1, 1), (3, 2, 15), (4, 31, 16), (5, 127, 17), (7, 128, 64), (13, 33, 63), (6, 129, 8), (2, 64, 65),
              (17, 16, 33), (9, 6, 10), (130, 128, 64)]
    for (M, K, N), combo in zip(shapes * 2, COMBOS * 3):
        a_t, b_t, y_t = combo
        for extreme in (False, True):
            a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = random_problem(rng, combo, M, K, N, per_column=True, extreme=extreme)
            per_row_zp = random_problem(rng, combo, M, 1, 1, extreme=extreme)[0]  # [M, 1]
            cases = [
                (a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp),
                (a, np.full((M, 1), a_s, f32), per_row_zp, b, b_s, b_zp, y_s, y_zp),
                (np.stack([a, a[::-1]]), a_s, a_zp, np.stack([b, b[::-1]]), b_s[0], b_zp[0], y_s, y_zp),
            ]
            for args in cases:
                context = (isa, M, K, N, combo, extreme, np.ndim(args[2]), args[0].ndim)
                expected = oracle.onnxruntime(*args)
                assert np.array_equal(qm.qlinear_matmul(*args), expected), context
                if args[0].ndim == 2:
                    packed = qm.QLinearMatMul(args[3], args[4], args[5])
                    assert np.array_equal(packed(*args[:3], *args[6:]), expected), context


def test_deep_k_wraps_identically_on_every_path(isa):
    """K = 70001 > 2^16 pairs: the kernels' int32 chunks must fold into the same wrapped/exact sums."""
    K = 70001
    a = np.full((3, K), 255, u8)
    b = np.full((K, 17), 255, u8)
    args = (a, f32(1), u8(0), b, f32(1), u8(1), f32(2.0**26), u8(100))
    assert np.array_equal(qm.qlinear_matmul(*args), oracle.onnxruntime(*args))
    exact = qm.qlinear_matmul(*args, numerics="exact")
    assert int(exact[0, 0]) == min(255, 100 + round(K * 255 * 254 / 2**26))


def test_every_entry_passes_its_self_test_emulated_ones_too():
    """The known-answer self-tests (csrc/dispatch.cpp) run natively only before an entry's first
    use; here every entry that runs on this machine goes through them, the emulated builds too, so
    that each self-test's model (the pair orders above all) is checked against its kernel on any
    CPU, not first on the hardware that has the instructions."""
    results = dict(_core.run_self_tests())
    assert all(why == "" for why in results.values()), {k: v for k, v in results.items() if v}
    # Every entry this machine runs was tested: kernel_entries() lists them all.
    runnable = [e for e in _core.kernel_entries() if "not supported here" not in e and "failed" not in e]
    expected = {e.replace(" (emulated)", "-emulated") for e in runnable}
    assert set(results) == expected
    assert {"qgemm:portable", "nbits:portable", "float8:portable"} <= set(results)


def test_isa_report_and_settings():
    info = qm.cpu_info()
    assert info["isa"] in info["available_isas"] and info["available_isas"][0] == "portable"
    assert info["best_isa"] == info["available_isas"][-1]
    assert set(info["features"]) >= {"avx2", "avx512_vnni", "amx_int8", "brand"}
    assert set(info["kernels"]) == {"qgemm", "qgemm_layout", "nbits", "float8"}
    assert info["self_test"] is None, info["self_test"]  # no native entry failed its known-answer test
    with pytest.raises(ValueError, match="^set_isa: isa must be one of"):
        qm.set_isa("sse9")
    every = {"portable", "avx2", "avx512_vnni", "amx", "avx512_vnni-emulated", "amx-emulated"}
    for unavailable in every - set(qm.available_isas()) - set(qm.emulated_isas()):
        with pytest.raises(ValueError, match=f"^set_isa: {unavailable} is not available here"):
            qm.set_isa(unavailable)


def test_each_family_reports_its_entry_per_level(isa):
    """A level runs each family's entry of that level where it has one, else its best one below;
    emulated entries run only when asked for by name."""
    kernels, levels = qm.cpu_info()["kernels"], _core.kernel_levels()
    level = isa.removesuffix("-emulated")
    order = ["portable", "avx2", "avx512_vnni", "amx"]
    for family in ("qgemm", "nbits", "float8"):
        name = kernels[family]  # the entry's name: its level, or what it uses (float8's "avx512f")
        assert order.index(levels[family]) <= order.index(level), (family, name, levels[family])
        assert name.endswith("-emulated") == (levels[family] == level and isa.endswith("-emulated")), (family, name)
    entries = qm.cpu_info()["entries"]
    assert f"qgemm:{kernels['qgemm'].replace('-emulated', ' (emulated)')}" in entries


def _f32_gemm(a, b, a_index=None, b_index=None):
    """The float8 path's float32 GEMM as the driver runs it (csrc/qlinear_matmul.cpp), its bits as uint32."""
    a_index = np.zeros(1, np.int64) if a_index is None else a_index
    b_index = np.zeros(1, np.int64) if b_index is None else b_index
    out = np.empty((len(a_index), a.shape[1], b.shape[2]), np.float32)
    _core.matmul_f32_sequential(a, a_index, b, b_index, out)
    return out.view(np.uint32)


def test_float_path_gemm_is_one_fma_per_k_in_order(isa):
    """The float8 path's float32 GEMM, bit for bit against fma in order of k (oracle, exact rationals),
    on float32 data whose products are not exact: an unfused multiply-add, another order or a
    different tiling of the sum would show. Shapes cover the 6 x 16 (AVX2) and 12 x 32 (AVX-512)
    tiles and their row and column tails."""
    from quantmatmul.reference.qlinear_matmul import _fma_f32

    rng = np.random.default_rng(11)
    for M, K, N in [(7, 41, 19), (13, 9, 33), (1, 64, 5), (14, 30, 35)]:
        a = rng.standard_normal((1, M, K)).astype(np.float32)
        b = rng.standard_normal((1, K, N)).astype(np.float32)
        out = _f32_gemm(a, b).view(np.float32)
        for m in range(M):
            for n in range(N):
                acc = 0.0
                for k in range(K):
                    acc = _fma_f32(float(a[0, m, k]), float(b[0, k, n]), acc)
                assert out[0, m, n] == np.float32(acc), (isa, M, K, N, m, n)


def test_the_float8_family_runs_its_avx512_entries_at_the_avx512_level():
    """The float8 family's AVX-512F and AVX512-BF16 entries sit at level avx512_vnni: under
    avx512_vnni-emulated the family runs the emulated build of kernels/float8_avx512bf16.cpp (so the
    `isa` fixture's avx512_vnni-emulated runs of the float8 tests exercise it: its pair table for
    pair-exact values, its float32 table, kernels/float8_avx512.inc's, for the rest), with
    avx512_bf16 hidden the one of kernels/float8_avx512.cpp; natively the BF16 entry where the CPU
    has AVX512-BF16, else the AVX-512F one (tests/test_float8_pairs.py tests the choice)."""
    before = qm.cpu_info()["isa"]
    try:
        if "avx512_vnni-emulated" in qm.emulated_isas():
            qm.set_isa("avx512_vnni-emulated")
            assert qm.cpu_info()["kernels"]["float8"] == "avx512bf16-emulated"
            assert _core.kernel_levels()["float8"] == "avx512_vnni"
            _core.hide_features(["avx512_bf16"])
            assert qm.cpu_info()["kernels"]["float8"] == "avx512f-emulated"
            assert _core.kernel_levels()["float8"] == "avx512_vnni"
        if "avx512_vnni" in qm.available_isas() and "float8:avx512f" in qm.cpu_info()["entries"]:
            qm.set_isa("avx512_vnni")
            _core.hide_features([])
            bf16 = qm.cpu_info()["features"]["avx512_bf16"] and "float8:avx512bf16" in qm.cpu_info()["entries"]
            assert qm.cpu_info()["kernels"]["float8"] == ("avx512bf16" if bf16 else "avx512f")
    finally:
        _core.hide_features([])
        qm.set_isa(before)
    entries = qm.cpu_info()["entries"]
    assert {"float8:avx512f (emulated)", "float8:avx512bf16 (emulated)"} <= set(entries) or not qm.emulated_isas()


def _portable_f32_gemm(*args):
    before = qm.cpu_info()["isa"]
    try:
        qm.set_isa("portable")
        return _f32_gemm(*args)
    finally:
        qm.set_isa(before)


def test_float_path_tile_edges_match_the_portable_entry(isa):
    """Every row count of a 12-row tile and its tail (1 .. 13), column counts around the 16-column
    panels and 32-column panel pairs (1 .. 70), K around the k chunks (0 .. 300): bit for bit the
    portable entry's std::fma in order of k."""
    rng = np.random.default_rng(5)
    for K in (0, 1, 2, 127, 128, 129, 255, 256, 257, 300):
        b = rng.standard_normal((1, K, 70)).astype(np.float32)
        a = rng.standard_normal((1, 13, K)).astype(np.float32)
        for N in (1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 70):
            bn = np.ascontiguousarray(b[:, :, :N])
            for M in range(1, 14):
                am = np.ascontiguousarray(a[:, :M])
                got, want = _f32_gemm(am, bn), _portable_f32_gemm(am, bn)
                assert np.array_equal(got, want), (isa, M, K, N)
                if K == 0:
                    assert not got.any()  # +0, not -0


def test_float_path_threads_and_task_blocks_do_not_change_bits(isa):
    """The driver splits the float GEMM into (matrix, column block, row block) tasks; 1, 2, 3 or 5
    threads, shapes of several row blocks (48 rows) and column blocks (about 512 KB of b panels: 4 at
    K = 1500, 2 at K = 4200), batched with repeated a and b: the same bits as the portable entry on
    one thread."""
    rng = np.random.default_rng(9)
    before = qm.get_num_threads()
    cases = [(100, 1500, 150, [0, 1, 0], [1, 1, 0]), (61, 4200, 70, [0], [0]), (49, 64, 1100, [0], [0])]
    try:
        for M, K, N, a_index, b_index in cases:
            a = rng.standard_normal((max(a_index) + 1, M, K)).astype(np.float32)
            b = rng.standard_normal((max(b_index) + 1, K, N)).astype(np.float32)
            args = (a, b, np.array(a_index, np.int64), np.array(b_index, np.int64))
            qm.set_num_threads(1)
            want = _portable_f32_gemm(*args)
            for n in (1, 2, 3, 5):
                qm.set_num_threads(n)
                assert np.array_equal(_f32_gemm(*args), want), (isa, M, K, N, n)
    finally:
        qm.set_num_threads(before)


def _weight(rng, b_t, K, N):
    info = np.iinfo(b_t)
    b = rng.integers(info.min, int(info.max) + 1, (K, N)).astype(b_t)
    return b, rng.uniform(0.001, 0.02, N).astype(f32), rng.integers(info.min, int(info.max) + 1, N).astype(b_t)


def test_a_weight_packed_under_one_table_runs_under_every_other():
    """QLinearMatMul packs b in the layout of the int8 entry in use; after set_isa to an entry that
    reads another layout, it packs again from its kept b: the same bits as a weight built under the
    new entry, never a product of mismatched layouts."""
    rng = np.random.default_rng(11)
    before = qm.cpu_info()["isa"]
    try:
        for b_t in (u8, s8):
            b, b_scale, b_zp = _weight(rng, b_t, 70, 45)
            a = rng.integers(0, 256, (9, 70)).astype(u8)
            call = (a, f32(0.02), u8(3), f32(0.05), u8(128))
            expected = oracle.onnxruntime(a, f32(0.02), u8(3), b, b_scale, b_zp, f32(0.05), u8(128))
            for built in kernel_levels():
                qm.set_isa(built)
                w = qm.QLinearMatMul(b, b_scale, b_zp)
                for used in kernel_levels():
                    qm.set_isa(used)
                    fresh = qm.QLinearMatMul(b, b_scale, b_zp)
                    assert np.array_equal(w(*call), fresh(*call)), (built, used)
                    assert np.array_equal(w(*call), expected), (built, used)
    finally:
        qm.set_isa(before)


def test_the_core_runs_a_weight_packed_in_another_layout_on_its_packer():
    """Below the Python wrapper, a packed b records its layout and the entry that packed it: under
    an entry of another layout (another thread's set_isa between QLinearMatMul's check of its
    weight and the call: the fuzzing of the fourteenth session raised "pack it again" there), the
    call runs on the entry that packed b, the same bits as every entry gives."""
    layouts = {}
    before = qm.cpu_info()["isa"]
    try:
        for level in kernel_levels():
            qm.set_isa(level)
            layouts.setdefault(_core.qgemm_layout(), level)
        if len(layouts) < 2:
            pytest.skip("this build runs a single int8 layout here")
        rng = np.random.default_rng(12)
        a, b = rng.integers(0, 256, (21, 70)).astype(u8), rng.integers(-128, 128, (1, 70, 45)).astype(s8)
        expected = oracle.onnxruntime(a, f32(0.02), u8(3), b[0], f32(0.01), s8(0), f32(0.05), u8(128))
        for (layout, level_a), (_, level_b) in zip(layouts.items(), list(layouts.items())[1:] + list(layouts.items())[:1]):
            qm.set_isa(level_a)
            packed = _core.pack_b(b, True)
            assert packed.layout == layout
            qm.set_isa(level_b)
            multiplier = np.full(1, f32(0.02) * f32(0.01) / f32(0.05), f32)
            y = _core.qlinear_matmul_2d_onnxruntime(a, False, 3, packed, True, np.zeros(1, np.int32), multiplier, 128,
                                                    False)
            assert np.array_equal(y, expected), (level_a, level_b)
    finally:
        qm.set_isa(before)


def test_a_matmul_nbits_weight_runs_under_every_table():
    """MatMulNBits keeps its codes in ONNX Runtime's layout, or at level 4 packed for the x86
    entries' layout (restored for an entry without it): built under one level and run under
    another, it gives the bits of the entry in use."""
    rng = np.random.default_rng(12)
    W = rng.normal(size=(256, 40)).astype(f32)
    A = rng.normal(size=(3, 256)).astype(f32)
    before = qm.cpu_info()["isa"]
    try:
        for level in (0, 4):
            for built in kernel_levels():
                qm.set_isa(built)
                held = qm.MatMulNBits.from_float(W, bits=4, block_size=32, accuracy_level=level)
                for used in kernel_levels():
                    qm.set_isa(used)
                    fresh = qm.MatMulNBits.from_float(W, bits=4, block_size=32, accuracy_level=level)
                    assert np.array_equal(held(A), fresh(A)), (built, used, level)
    finally:
        qm.set_isa(before)


def _run_python(code, **env):
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


def test_environment_variables():
    done = _run_python("import quantmatmul as q; i = q.cpu_info(); print(i['isa'], q.get_num_threads())",
                       QUANTMATMUL_ISA="portable", QUANTMATMUL_NUM_THREADS="3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["portable", "3"]
    bad = _run_python("import quantmatmul", QUANTMATMUL_ISA="neon")
    assert bad.returncode != 0 and "QUANTMATMUL_ISA='neon' is not one of" in bad.stderr
    for threads in ("0", "-2", "two", "1.5"):  # the pool would ignore it: say so instead
        bad = _run_python("import quantmatmul", QUANTMATMUL_NUM_THREADS=threads)
        assert bad.returncode != 0 and f"QUANTMATMUL_NUM_THREADS={threads!r} is not a positive integer" in bad.stderr


def test_a_requested_level_is_selected_before_the_levels_above_it_run():
    # QUANTMATMUL_ISA=portable: no native entry is self-tested (the trace would name it); with no
    # level requested, every native level this CPU runs is.
    quiet = _run_python("import quantmatmul", QUANTMATMUL_ISA="portable", QUANTMATMUL_TRACE_SELF_TEST="1")
    assert quiet.returncode == 0, quiet.stderr
    assert "self-test" not in quiet.stderr
    env = {k: v for k, v in os.environ.items() if k != "QUANTMATMUL_ISA"}
    done = subprocess.run([sys.executable, "-c", "import quantmatmul"], capture_output=True, text=True, timeout=120,
                          env=env | {"QUANTMATMUL_TRACE_SELF_TEST": "1"})
    assert done.returncode == 0, done.stderr
    native = [level for level in qm.available_isas() if level != "portable"]
    tested = {line.split(":")[2] for line in done.stderr.splitlines() if line.startswith("quantmatmul: self-test")}
    for level in native:  # every native level has an int8 GEMM entry named after it
        assert level in tested, (level, done.stderr)
    if "avx512_vnni" in native:
        below = _run_python("import quantmatmul", QUANTMATMUL_ISA="avx2", QUANTMATMUL_TRACE_SELF_TEST="1")
        assert below.returncode == 0 and "avx512" not in below.stderr and "amx" not in below.stderr, below.stderr


def test_thread_counts_do_not_change_results():
    rng = np.random.default_rng(1)
    args = random_problem(rng, (u8, s8, u8), 77, 300, 190, per_column=True)
    before = qm.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 5):
            qm.set_num_threads(n)
            assert qm.get_num_threads() == n
            results.append(qm.qlinear_matmul(*args))
        assert all(np.array_equal(r, results[0]) for r in results)
        with pytest.raises(ValueError, match="^set_num_threads: n must be a positive integer"):
            qm.set_num_threads(0)
    finally:
        qm.set_num_threads(before)


def test_concurrent_calls_from_python_threads():
    """The GIL is released in the kernels; concurrent calls must each get their own right answer."""
    rng = np.random.default_rng(2)
    problems = [random_problem(rng, COMBOS[i % 8], 40 + i, 200 + 3 * i, 50 + i, per_column=bool(i % 2)) for i in range(8)]
    expected = [oracle.onnxruntime(*p) for p in problems]
    weights = [qm.QLinearMatMul(p[3], p[4], p[5]) for p in problems]
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                p = problems[i]
                assert np.array_equal(qm.qlinear_matmul(*p), expected[i])
                assert np.array_equal(weights[i](p[0], p[1], p[2], p[6], p[7]), expected[i])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_back_to_back_jobs_on_more_threads_than_cores():
    """Jobs of a few hundred microseconds, one after another from several Python threads, on more
    pool threads than this machine has cores: helpers wake late and find their job over (the
    caller waits for running tasks only) or join the next one; every result is the one-thread
    result."""
    rng = np.random.default_rng(3)
    weights = [qm.MatMulNBits.from_float(rng.normal(size=(1024, 2048)).astype(f32), bits=b, block_size=32,
                                         accuracy_level=level) for b, level in ((4, 4), (8, 4), (4, 0))]
    inputs = [rng.normal(size=(m, 1024)).astype(f32) for m in (1, 3)]
    before = qm.get_num_threads()
    try:
        qm.set_num_threads(1)
        expected = [[w(a) for a in inputs] for w in weights]
        qm.set_num_threads(6)
        errors = []

        def worker(seed):
            try:
                order = np.random.default_rng(seed).integers(0, len(weights) * len(inputs), 40)
                for i in order:
                    w, a = divmod(int(i), len(inputs))
                    assert np.array_equal(weights[w](inputs[a]), expected[w][a]), (w, a)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
    finally:
        qm.set_num_threads(before)


def _call_while_the_thread_count_changes(caller, callers, counts, pause=0.0):
    """caller(seed) on `callers` Python threads at once (seeds 0, 1, ...) while another thread cycles
    set_num_threads through counts (sleeping `pause` s between changes); fails with the first error
    a caller raised."""
    errors, stop = [], threading.Event()

    def guarded(seed):
        try:
            caller(seed)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    def changer():
        n = 0
        while not stop.is_set():
            qm.set_num_threads(counts[n % len(counts)])
            n += 1
            if pause:
                time.sleep(pause)

    threads = [threading.Thread(target=guarded, args=(s,)) for s in range(callers)]
    switch = threading.Thread(target=changer)
    for t in [*threads, switch]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    switch.join()
    assert not errors, errors[0]


def test_calls_of_several_jobs_keep_helpers_awake_only_while_they_run():
    """A call made of serial steps and several jobs (MatMulNBits level 4 with A quantized in parts,
    level 3 with A rounded and reordered in parts, QLinearMatMul with an int8 A packed first) keeps
    its helpers awake between its jobs (a ParallelRegion: they spin for the next job instead of
    sleeping). From several Python threads at once, on more pool threads than cores, with the
    thread count changed meanwhile: every result is the one-thread result; and once the calls are
    over no helper spins: the process uses almost no CPU time while the caller sleeps."""
    rng = np.random.default_rng(5)
    K, N = 640, 256
    weight = qm.MatMulNBits.from_float(rng.normal(size=(K, N)).astype(f32), bits=4, block_size=32, accuracy_level=4)
    level3 = qm.MatMulNBits.from_float(rng.normal(size=(K, N)).astype(f32), bits=4, block_size=32, accuracy_level=3)
    b = rng.integers(0, 256, (K, N)).astype(np.uint8)
    qweight = qm.QLinearMatMul(b, f32(0.01), np.uint8(131))
    a_f = [rng.normal(size=(m, K)).astype(f32) for m in (1, 13, 300)]  # 300 x 640: A in parts
    a_q = [rng.integers(-128, 128, (m, K)).astype(np.int8) for m in (1, 40, 300)]
    calls = [lambda a=a: weight(a) for a in a_f] + [lambda a=a: level3(a) for a in a_f]
    calls += [lambda a=a: qweight(a, f32(0.02), np.int8(3), f32(0.5), np.uint8(128)) for a in a_q]
    before = qm.get_num_threads()
    try:
        qm.set_num_threads(1)
        expected = [call() for call in calls]
        qm.set_num_threads(5)

        def caller(seed):
            for i in np.random.default_rng(seed).integers(0, len(calls), 40):
                assert np.array_equal(calls[int(i)](), expected[int(i)]), int(i)

        _call_while_the_thread_count_changes(caller, callers=3, counts=(2, 3, 4, 5), pause=0.001)
        # Past any helper's last spin (at most 100 us per wait) and numpy's BLAS threads' (they spin
        # some 0.1 s after a product of an earlier test), a sleep of the caller costs no CPU time: a
        # helper spinning on would use about all of it.
        time.sleep(0.2)
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(0.3)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert cpu < 0.3 * wall, (cpu, wall)
    finally:
        qm.set_num_threads(before)


# --------------------------------------------------------------------------------------------------
# QLinearMatMul: constant weights


@pytest.mark.parametrize("numerics", ["onnxruntime", "onnx-reference", "exact"])
def test_constant_weight_equals_function(numerics):
    rng = np.random.default_rng(3)
    for combo in COMBOS:
        a, a_s, a_z, b, b_s, b_z, y_s, y_z = random_problem(rng, combo, 13, 40, 21, per_column=True)
        w = qm.QLinearMatMul(b, b_s, b_z)
        for a_in in (a, a[0], np.stack([a, a[::-1]])):
            expected = qm.qlinear_matmul(a_in, a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics)
            assert np.array_equal(w(a_in, a_s, a_z, y_s, y_z, numerics=numerics), expected)


def test_constant_weight_batched_vector_and_float8_b():
    rng = np.random.default_rng(4)
    b3 = rng.integers(-128, 128, (3, 20, 9), dtype=s8)
    a = rng.integers(0, 256, (2, 3, 5, 20), dtype=u8)
    args = (f32(0.02), u8(128), f32(0.5), u8(10))
    w = qm.QLinearMatMul(b3, f32(0.01), s8(0))
    assert np.array_equal(w(a, *args), qm.qlinear_matmul(a, args[0], args[1], b3, f32(0.01), s8(0), args[2], args[3]))
    bv = rng.integers(-128, 128, 20, dtype=s8)
    wv = qm.QLinearMatMul(bv, f32(0.01), s8(3))
    assert np.array_equal(wv(a, *args), qm.qlinear_matmul(a, args[0], args[1], bv, f32(0.01), s8(3), args[2], args[3]))
    e4 = ml_dtypes.float8_e4m3fn
    bf = rng.normal(size=(20, 4)).astype(e4)
    wf = qm.QLinearMatMul(bf, f32(0.5), e4(0))
    assert np.array_equal(wf(a, *args).view(u8),
                          qm.qlinear_matmul(a, args[0], args[1], bf, f32(0.5), e4(0), args[2], args[3]).view(u8))


def test_constant_weight_is_a_private_copy_and_compact():
    rng = np.random.default_rng(5)
    b = rng.integers(-128, 128, (4096, 512), dtype=s8)
    w = qm.QLinearMatMul(b, f32(0.01), s8(0))
    assert w.nbytes <= 1.25 * b.nbytes
    a = rng.integers(0, 256, (2, 4096), dtype=u8)
    before = w(a, f32(0.01), u8(128), f32(1.0), u8(128))
    b[:] = 0  # the caller's array changes; the packed weight must not
    assert np.array_equal(w(a, f32(0.01), u8(128), f32(1.0), u8(128)), before)
    assert "QLinearMatMul(b: int8 (4096, 512)" in repr(w)


def test_constant_weight_errors_name_the_class():
    b = np.zeros((4, 3), s8)
    with pytest.raises(TypeError, match="^QLinearMatMul: b dtype float32 is not supported"):
        qm.QLinearMatMul(b.astype(f32), f32(1), s8(0))
    with pytest.raises(TypeError, match="^QLinearMatMul: b_zero_point dtype uint8 does not match b dtype int8"):
        qm.QLinearMatMul(b, f32(1), u8(0))
    with pytest.raises(ValueError, match="^QLinearMatMul: b_scale must be nonzero"):
        qm.QLinearMatMul(b, f32(0), s8(0))
    w = qm.QLinearMatMul(b, f32(1), s8(0))
    with pytest.raises(ValueError, match="^QLinearMatMul: inner dimensions differ"):
        w(np.zeros((2, 5), u8), f32(1), u8(0), f32(1), u8(0))
    with pytest.raises(TypeError, match="^QLinearMatMul: the three scales must share one dtype"):
        w(np.zeros((2, 4), u8), np.float16(1), u8(0), np.float16(1), u8(0))
    with pytest.raises(ValueError, match="^QLinearMatMul: numerics must be one of"):
        w(np.zeros((2, 4), u8), f32(1), u8(0), f32(1), u8(0), numerics="fast")


def test_report_which_paths_ran():
    """Runs last in this module: every path this machine supports was exercised above."""
    assert TESTED_ISAS >= set(kernel_levels()), f"tested {sorted(TESTED_ISAS)} of {kernel_levels()}"
    print(f"\nkernel paths tested on {qm.cpu_info()['features']['brand']}: {sorted(TESTED_ISAS)}")


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "".join(np.dtype(t).char for t in c))
def test_fast_path_equals_general_path(combo):
    """2-D calls take a short path; a batch of one takes the general one: identical results."""
    rng = np.random.default_rng(6 + COMBOS.index(combo))
    for M, K, N in [(1, 16, 16), (7, 33, 20), (64, 256, 48)]:
        for per_column in (False, True):
            a, a_s, a_z, b, b_s, b_z, y_s, y_z = random_problem(rng, combo, M, K, N, per_column=per_column)
            fast = qm.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, y_s, y_z)
            general = qm.qlinear_matmul(a[None], a_s, a_z, b, b_s, b_z, y_s, y_z)[0]
            assert fast.flags.c_contiguous and fast.dtype == y_z.dtype and fast.shape == (M, N)
            assert np.array_equal(fast, general) and np.array_equal(fast, oracle.onnxruntime(a, a_s, a_z, b, b_s, b_z, y_s, y_z))
            w = qm.QLinearMatMul(b, b_s, b_z)
            assert np.array_equal(w(a, a_s, a_z, y_s, y_z), fast)


def test_fast_path_multiplier_is_float32_arithmetic():
    """The fast path forms f32(f32(a_s * b_s) / y_s) with doubles; it must equal numpy's float32 ops bit for bit."""
    from quantmatmul.qlinear import _f32

    rng = np.random.default_rng(9)
    bits = rng.integers(0, 2**32, (200_000, 3), dtype=np.uint64).astype(np.uint32)
    s = bits.view(np.float32).reshape(-1, 3)
    s = s[np.all(np.isfinite(s) & (s != 0), axis=1)]
    with np.errstate(all="ignore"):
        expected = (s[:, 0] * s[:, 1]) / s[:, 2]
    ours = np.array([_f32(_f32(float(x) * float(y)) / float(z)) for x, y, z in s], np.float64)
    assert np.array_equal(ours.astype(np.float32).view(np.uint32), expected.view(np.uint32))  # overflows too
    # Rounding at the top of the range: below the midpoint between FLT_MAX and 2^128 to FLT_MAX, from it to inf.
    top = float(np.finfo(np.float32).max)
    midpoint = top + 2.0**103
    assert _f32(np.nextafter(midpoint, 0)) == top and _f32(-np.nextafter(midpoint, 0)) == -top
    assert _f32(midpoint) == np.inf and _f32(-midpoint) == -np.inf and _f32(1e300) == np.inf


# Weak definitions a kernel object may have: the exception personality's data reference, the same
# bytes in every object.
WEAK_ALLOWED = {"DW.ref.__gxx_personality_v0"}


def _kernel_objects():
    """The kernel objects (path, build name, source) of the extension last built beside the tests,
    or a skip where there is no build tree (an installed wheel)."""
    import glob

    # The build tree of the extension last built (make test-asan's sits beside it: its instrumented
    # objects define ASan's ODR indicators, and it may be the newer one).
    modules = glob.glob(os.path.join(os.path.dirname(__file__), "..", "build", "*", "_core*.so"))
    modules = [m for m in modules if not os.path.basename(os.path.dirname(m)).startswith("asan-")]
    if not modules:
        pytest.skip("no build tree beside the tests (installed from a wheel)")
    tree = os.path.dirname(max(modules, key=os.path.getmtime))
    objects = glob.glob(os.path.join(tree, "CMakeFiles", "qmm_kernels_*.dir", "**", "*.o"), recursive=True)
    if not objects:
        pytest.skip("no build tree beside the tests (installed from a wheel)")
    repo = os.path.join(os.path.dirname(__file__), "..")
    found = []
    for obj in objects:
        source = obj.split(".dir" + os.sep, 1)[1].removesuffix(".o")
        if os.path.exists(os.path.join(repo, source)):  # else an object left from a source since removed
            found.append((obj, obj.split(os.sep + "qmm_kernels_")[1].split(".dir" + os.sep)[0], source))
    return found


def test_kernel_objects_define_no_shared_symbols():
    """Kernel files compiled with wide instructions (-mavx2, -mavx512*, AMX) must not define inline
    functions, templates or STL instantiations with external linkage: the linker could keep their
    wide copy for the portable code too, and an older CPU would die on an illegal instruction. A
    kernel object's global symbols are its build's register function (qmm::qmm_kernels_NAME) and
    functions in its build's own namespace (qmm::NAME, shared by the files of one build); it has no
    weak ones beyond WEAK_ALLOWED."""
    import shutil

    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    for obj, build, _ in _kernel_objects():
        own = (f"_ZN3qmm{len('qmm_kernels_' + build)}qmm_kernels_{build}Ev", f"_ZN3qmm{len(build)}{build}")
        out = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True, check=True).stdout
        symbols = [line.split()[1:] for line in out.splitlines() if len(line.split()) == 3]
        weak = [name for kind, name in symbols if kind in "WVu" and name not in WEAK_ALLOWED]
        strong = [name for kind, name in symbols if kind in "TDRBi" and not name.startswith(own)]
        assert not weak and not strong, f"{obj}: shared with the rest of the library: {weak + strong}"


def test_few_row_kernels_keep_their_prefetches():
    """The level-4 few-row kernels on the quads x16 layout prefetch a large weight's panel ahead
    (QuadsPrefetch, csrc/kernels/nbits_avx2_common.h), levels 2/3's AVX-512 decode its codes. A compiler may drop an out-of-line function
    whose only effect is a prefetch (GCC 12 did, silently: the kernels kept their results and lost
    their speed), so each such object must still hold prefetch instructions."""
    import shutil

    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    wanted = {"nbits_packed_avx2.cpp": "prefetcht0",  # QuadsPrefetchL1
              "nbits_packed_avx512vnni.cpp": "prefetcht1",  # QuadsPrefetchL2
              "nbits_f32_avx512.cpp": "prefetcht1"}  # levels 2/3's lookup-table decode
    few_row = [(obj, source) for obj, _, source in _kernel_objects() if source.endswith(tuple(wanted))]
    assert {s.rsplit("/", 1)[-1] for _, s in few_row} >= set(wanted), "a few-row kernel object is missing"
    for obj, source in few_row:
        out = subprocess.run(["objdump", "-d", obj], capture_output=True, text=True, check=True).stdout
        want = wanted[source.rsplit("/", 1)[-1]]
        assert want in out, f"{source}: no {want} left in {obj}"


def test_broadcast_parameters_change_between_calls(isa):
    """The ONNX Runtime epilogue copies a per-tensor or per-column parameter once per call and
    column block, not per row (csrc/qlinear_matmul.cpp, RowOf): back-to-back calls whose scales and
    zero points change, whatever addresses their arrays get, each give their own result, on every
    thread count."""
    rng = np.random.default_rng(12)
    before = qm.get_num_threads()
    try:
        for threads in (1, 3):
            qm.set_num_threads(threads)
            b, b_scale, b_zp = _weight(rng, s8, 96, 80)
            w = qm.QLinearMatMul(b, b_scale, b_zp)
            a = rng.integers(0, 256, (40, 96)).astype(u8)
            for _ in range(12):
                a_zp, y_zp = u8(rng.integers(0, 256)), u8(rng.integers(0, 256))
                a_s, y_s = f32(rng.uniform(0.01, 0.05)), f32(rng.uniform(0.02, 0.2))
                expected = oracle.onnxruntime(a, a_s, a_zp, b, b_scale, b_zp, y_s, y_zp)
                assert np.array_equal(w(a, a_s, a_zp, y_s, y_zp), expected)
    finally:
        qm.set_num_threads(before)


@pytest.mark.parametrize("M, N", [(1, 16), (300, 40), (1000, 70), (70, 1000)])
def test_constant_b_tasks_over_row_runs(isa, M, N):
    """A constant b's tasks are (column block, run of row blocks): all rows in one run when there are
    enough column blocks, else M cut into runs (few columns, many rows); every split gives the
    oracle's bits, with per-row a zero points and per-column b parameters."""
    rng = np.random.default_rng(M + N)
    before = qm.get_num_threads()
    try:
        for threads in (2, 5):
            qm.set_num_threads(threads)
            K = 72
            b, b_scale, b_zp = _weight(rng, u8, K, N)
            a = rng.integers(-128, 128, (M, K)).astype(s8)
            a_zp = rng.integers(-128, 128, (M, 1)).astype(s8)
            a_s = rng.uniform(0.01, 0.03, (M, 1)).astype(f32)
            expected = oracle.onnxruntime(a, a_s, a_zp, b, b_scale, b_zp, f32(0.7), u8(7))
            assert np.array_equal(qm.QLinearMatMul(b, b_scale, b_zp)(a, a_s, a_zp, f32(0.7), u8(7)), expected)
    finally:
        qm.set_num_threads(before)


BLOCKINGS = [dict(task_rows=1), dict(task_rows=40, task_panel_bytes=1), dict(k_block=1),
             dict(k_block=200, task_panel_bytes=3000, tasks_per_thread=1), dict(task_rows=1000, tasks_per_thread=64),
             dict(task_rows=24, task_panel_bytes=1 << 30, k_block=1 << 20)]


def test_no_blocking_changes_a_bit(isa):
    """The driver's blocking (_core.set_qgemm_blocking: rows per task rounded to the layout's row
    groups, bytes of packed b per task down to one panel, k per kernel call down to one k-group, tasks
    per thread) decides only who computes what, never a bit: every setting gives the oracle's bits,
    constant and per-call b, batched, per-row a and per-column b parameters, K with and without a
    tail of the layout's k-groups, all three numerics, 1 and 3 threads; the defaults come back."""
    rng = np.random.default_rng(sum(map(ord, isa)) + 11)
    before, default = qm.get_num_threads(), _core.qgemm_blocking()
    try:
        for M, K, N in [(70, 300, 70), (5, 1030, 33), (33, 128, 100)]:
            b, b_scale, b_zp = _weight(rng, s8, K, N)
            a = rng.integers(0, 256, (2, M, K)).astype(u8)
            a_zp = rng.integers(0, 256, (M, 1)).astype(u8)
            a_s = rng.uniform(0.01, 0.03, (M, 1)).astype(f32)
            y_s = f32(0.01 * np.sqrt(K))
            args = (a, a_s, a_zp, b, b_scale, b_zp, y_s, u8(7))
            expected = {"onnxruntime": oracle.onnxruntime(*args), "onnx-reference": oracle.onnx_reference(*args)}
            if M * K * N < 200_000:
                expected["exact"] = oracle.exact(*args)
            weight = qm.QLinearMatMul(b, b_scale, b_zp)
            for blocking in BLOCKINGS:
                _core.set_qgemm_blocking(**blocking)
                for threads in (1, 3):
                    qm.set_num_threads(threads)
                    context = (isa, M, K, N, blocking, threads)
                    for numerics, y in expected.items():
                        assert np.array_equal(qm.qlinear_matmul(*args, numerics=numerics), y), (*context, numerics)
                    assert np.array_equal(weight(a, a_s, a_zp, y_s, u8(7)), expected["onnxruntime"]), context
                _core.set_qgemm_blocking()
        assert _core.qgemm_blocking() == default
        for bad in (dict(k_block=-1), dict(task_rows=2**62)):
            with pytest.raises(ValueError, match=r"^set_qgemm_blocking: expected fields in \[0, 2\*\*40\]"):
                _core.set_qgemm_blocking(**bad)
    finally:
        _core.set_qgemm_blocking()
        qm.set_num_threads(before)


def test_jobs_that_want_fewer_helpers_than_the_pool_holds():
    """A job wakes only the helpers it wants (each worker sleeps on its own condition variable): on
    a pool grown to 6, jobs for 1 to 6 threads, the count changed between and during them from
    another Python thread, leave some workers unwoken for many jobs; each must join the next job
    that wants it, and every result is the one-thread result."""
    rng = np.random.default_rng(4)
    weight = qm.MatMulNBits.from_float(rng.normal(size=(512, 1024)).astype(f32), bits=4, block_size=32,
                                       accuracy_level=4)
    inputs = [rng.normal(size=(m, 512)).astype(f32) for m in (1, 2, 17)]
    before = qm.get_num_threads()
    try:
        qm.set_num_threads(1)
        expected = [weight(a) for a in inputs]
        qm.set_num_threads(6)
        weight(inputs[2])  # all six threads exist

        def caller(seed):
            for i in np.random.default_rng(seed).integers(0, len(inputs), 60):
                assert np.array_equal(weight(inputs[int(i)]), expected[int(i)]), int(i)

        _call_while_the_thread_count_changes(caller, callers=2, counts=(1, 2, 3, 4, 5, 6))
    finally:
        qm.set_num_threads(before)
