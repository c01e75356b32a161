"""test_nbits_bf16.py: MatMulNBits level 3 on the avx512bf16 and amxbf16 entries (vdpbf16ps / tdpbf16ps over bfloat16 pairs, more than 8 rows): bit for bit against a numpy model of each one's documented order, within the level-3 bound, and the entries' choice."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from conftest import kernel_entry, kernel_levels
from test_float8_pairs import pair_model
from test_matmul_nbits import BF16, F32, Case, assert_within, tight_tolerance

import quantmatmul as qm
from quantmatmul.matmul_nbits import matmul_nbits
from quantmatmul.quantize_nbits import quantize_nbits


def nbits_entry(level, hidden=()):
    return kernel_entry("nbits", level, hidden)


# The bfloat16 entries, their level's feature that they need beyond the plain entry's, and their
# order of additions at level 3 (docs/quantization.md).
BF16_TABLES = {"avx512bf16": ("avx512_bf16", "odd first"), "amxbf16": ("amx_bf16", "tiles of 32 k")}
LEVELS = {"avx512_vnni": "avx512bf16", "amx": "amxbf16"}


def _entries():
    """(entry, level, hidden): the avx512bf16 and amxbf16 MatMulNBits entries where this machine runs
    them (natively or emulated), and the entry the same level runs with their feature hidden."""
    found = {}
    for level in kernel_levels():
        bf16 = LEVELS.get(level.removesuffix("-emulated"))
        if bf16 is None:
            continue
        for hidden in ((), (BF16_TABLES[bf16][0],)):
            with nbits_entry(level, hidden) as entry:
                found.setdefault(entry, (level, hidden))
    return [(entry, *where) for entry, where in found.items()]


def _order(entry):
    return BF16_TABLES[entry.removesuffix("-emulated")][1]


ENTRIES = _entries()
BF16_ENTRIES = [e for e in ENTRIES if e[0].removesuffix("-emulated") in BF16_TABLES]
pytestmark = pytest.mark.skipif(not BF16_ENTRIES, reason="no bfloat16 MatMulNBits entry (native or emulated)")


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


# Rows around the 12-row groups and 48-row blocks (9 is the first on the pair path); K odd and
# even, around the 128-pair chunks; columns around the 16-column panels and 32-column tasks (64 up
# to 12 rows).
SHAPES = [(9, 64, 16), (10, 100, 70), (13, 64, 16), (25, 255, 33), (48, 257, 70), (61, 512, 17), (14, 33, 40)]


@pytest.mark.parametrize("entry, level, hidden", BF16_ENTRIES, ids=[e[0] for e in BF16_ENTRIES])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_level3_prefill_is_the_pair_order_bit_for_bit(entry, level, hidden, bits):
    """Level 3, more than 8 rows: A and W rounded to bfloat16 (W as dequantize_nbits computes it),
    each output from +0 in the entry's order (vdpbf16ps: over k pairs, the odd-indexed product
    first; tdpbf16ps: per 32 k, even and odd sums apart, then added), then + bias."""
    rng = np.random.default_rng(bits)
    for i, (M, K, N) in enumerate(SHAPES):
        block_size = [16, 32, 64, 128, 256][i % 5]
        W = rng.standard_normal((K, N)).astype(np.float32)
        q = quantize_nbits(W, bits=bits, block_size=block_size, symmetric=i % 2 == 1, method="hqq" if i == 2 else "rtn")
        A = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-8, 8, (M, K)))).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32) if i % 2 == 0 else None
        with nbits_entry(level, hidden) as running:
            assert running == entry
            Y = matmul_nbits(A, *q.tensors(), **q.attributes(), bias=bias, accuracy_level=3)
        model = pair_model(_bf16(A), _bf16(q.dequantize()), _order(entry))
        if bias is not None:
            model = model + bias
        assert np.array_equal(Y.view(np.uint32), model.view(np.uint32)), (bits, M, K, N, block_size)


@pytest.mark.parametrize("entry, level, hidden", BF16_ENTRIES, ids=[e[0] for e in BF16_ENTRIES])
def test_level3_pair_panels_with_non_finite_scales(entry, level, hidden):
    """4-bit codes in blocks of 32 or more take a path of their own into the pair panels
    (nbits_pairs4_avx512.cpp), per task of 32 columns; a task whose scales or float zero points are
    not all finite takes the general one. Both in one call: a NaN and an infinite scale in the first
    task's columns, the second task's finite; integer and float zero points, K odd."""
    rng = np.random.default_rng(41)
    M, K, N = 20, 97, 40
    for zero_points in ("integer", "float"):
        q = quantize_nbits(
            rng.standard_normal((K, N)).astype(np.float32),
            bits=4,
            block_size=32,
            method="hqq" if zero_points == "float" else "rtn",
        )
        B, scales, zps, _ = q.tensors()
        scales = scales.copy()
        scales[3, 1] = np.uint32(0x7FFFFFFF).view(np.float32)  # a NaN that rounding by integer addition makes -0
        scales[7, 0] = np.inf
        A = rng.standard_normal((M, K)).astype(np.float32)
        with nbits_entry(level, hidden) as running:
            assert running == entry
            Y = matmul_nbits(A, B, scales, zps, **q.attributes(), accuracy_level=3)
        with np.errstate(invalid="ignore"):
            W = dataclasses.replace(q, scales=scales).dequantize()
            model = pair_model(_bf16(A), _bf16(W), _order(entry))
        assert np.array_equal(np.isnan(Y), np.isnan(model)) and np.isnan(Y[:, [3, 7]]).any()
        finite = ~np.isnan(model)
        assert np.array_equal(Y[finite].view(np.uint32), model[finite].view(np.uint32)), zero_points


@pytest.mark.parametrize("entry, level, hidden", BF16_ENTRIES, ids=[e[0] for e in BF16_ENTRIES])
def test_level3_within_the_bound_and_other_paths_are_the_avx512_entry(entry, level, hidden):
    """Every width, zero-point form, g_idx form, bias and A dtype at level 3 with more than 8 rows
    stays within the documented bound and the tight tolerance; denormal inputs (which vdpbf16ps
    reads as zero) stay within the bound. The paths the entry does not replace (levels 0-2 and 4,
    8 rows or fewer) give the avx512_vnni entry's bits."""
    rng = np.random.default_rng(30)
    plain = [e for e in ENTRIES if e not in BF16_ENTRIES and e[1] == level]
    for i, bits in enumerate([2, 3, 4, 5, 6, 7, 8]):
        case = Case(
            rng,
            bits,
            [16, 32, 64, 128][i % 4],
            K=[100, 257, 64, 512][i % 4],
            N=37,
            batch=(20,),
            zp=["none", "packed", "float"][i % 3],
            g=[None, "random", None, "trivial"][i % 4],
            bias=i % 2 == 0,
            dtype=[F32, BF16][i % 2],
        )
        if i == 2:  # denormal and tiny A: read as zero by the hardware
            case.A[:5] = (case.A[:5].astype(np.float64) * 2.0**-130).astype(case.dtype)
        with nbits_entry(level, hidden):
            Y = case.run(3)
            small = case.run(3, A=case.A[:8])
            others = [case.run(lv) for lv in (0, 2, 4)]
        assert_within(Y, case.exact(), case.bound(3), f"{entry} {case}")
        if i != 2:
            y, tol = tight_tolerance(case, 3)
            assert_within(Y, y, tol, f"{entry} tight {case}")
        for plain_entry, plain_level, plain_hidden in plain:
            with nbits_entry(plain_level, plain_hidden):
                assert np.array_equal(
                    small.view(np.uint16 if case.dtype == BF16 else np.uint32),
                    case.run(3, A=case.A[:8]).view(np.uint16 if case.dtype == BF16 else np.uint32),
                )
                for lv, theirs in zip((0, 2, 4), others):
                    mine = case.run(lv)
                    view = np.uint16 if case.dtype == BF16 else np.uint32
                    assert np.array_equal(theirs.view(view), mine.view(view)), (plain_entry, lv, case)


def test_the_entry_is_chosen_where_the_cpu_has_the_bf16_instructions():
    """At levels avx512_vnni and amx the MatMulNBits family has two entries each; the one needing
    AVX512-BF16 (AMX-BF16) too wins where it runs, else the plain one."""
    for level in kernel_levels():
        bf16 = LEVELS.get(level.removesuffix("-emulated"))
        if bf16 is None:
            continue
        emulated = level.endswith("-emulated")
        suffix = "-emulated" if emulated else ""
        feature = BF16_TABLES[bf16][0]
        with nbits_entry(level) as entry:
            has = emulated or qm.cpu_info()["features"][feature]
            assert entry == (bf16 if has else level.removesuffix("-emulated")) + suffix
        with nbits_entry(level, [feature]) as entry:
            assert entry == level.removesuffix("-emulated") + suffix
    assert qm.cpu_info()["self_test"] is None
