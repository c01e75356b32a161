"""test_properties.py: hypothesis property tests of QLinearMatMul's invariants across numerics, layouts and types."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import quantmatmul as qm

INT8 = [np.dtype(np.uint8), np.dtype(np.int8)]
NUMERICS = ["onnxruntime", "onnx-reference", "exact"]


@st.composite
def problems(draw, max_k=64):
    a_t, b_t, y_t = (draw(st.sampled_from(INT8)) for _ in range(3))
    M, N = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    K = draw(st.integers(0, max_k))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def values(dtype, shape):
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)

    scale = lambda: np.float32(draw(st.floats(0.0009765625, 1.0, width=32)))
    a, b = values(a_t, (M, K)), values(b_t, (K, N))
    a_s, b_s = scale(), scale()
    y_s = np.float32(a_s * b_s * max(K, 1) ** 0.5 * 64 / 40 * draw(st.floats(0.25, 4.0)))
    return [a, a_s, values(a_t, ()), b, b_s, values(b_t, ()), y_s, values(y_t, ())]


@settings(max_examples=150, deadline=None)
@given(problems())
def test_numerics_agree_within_one(args):
    """Without int32 wrap (K is small), the three numerics differ only at rounding boundaries: by at most 1."""
    exact = qm.qlinear_matmul(*args, numerics="exact").astype(np.int32)
    for numerics in ("onnxruntime", "onnx-reference"):
        other = qm.qlinear_matmul(*args, numerics=numerics).astype(np.int32)
        assert np.abs(other - exact).max(initial=0) <= 1


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from(NUMERICS))
def test_transpose_symmetry(args, numerics):
    """(a @ b)^T == b^T @ a^T with the a and b parameters swapped: the multiplier a_s * b_s commutes."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    y = qm.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics)
    yt = qm.qlinear_matmul(b.T, b_s, b_z, a.T, a_s, a_z, y_s, y_z, numerics=numerics)
    assert np.array_equal(y.T, yt)


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from(NUMERICS), st.integers(0, 2**32 - 1))
def test_row_permutation_and_batching(args, numerics, seed):
    """Permuting rows of a permutes rows of y; a batch of problems equals the problems one by one."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    perm = np.random.default_rng(seed).permutation(a.shape[0])
    y = qm.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics)
    assert np.array_equal(qm.qlinear_matmul(a[perm], a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics), y[perm])
    a3 = np.stack([a, a[perm], a])
    y3 = qm.qlinear_matmul(a3, a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics)
    assert np.array_equal(y3, np.stack([y, y[perm], y]))


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from(NUMERICS))
def test_uniform_per_column_and_per_row_equal_per_tensor(args, numerics):
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    M, N = a.shape[0], b.shape[1]
    y = qm.qlinear_matmul(*args, numerics=numerics)
    per_column = qm.qlinear_matmul(a, a_s, a_z, b, np.full(N, b_s), np.full(N, b_z), y_s, y_z, numerics=numerics)
    per_row = qm.qlinear_matmul(a, np.full((M, 1), a_s), np.full((M, 1), a_z), b, b_s, b_z, y_s, y_z, numerics=numerics)
    per_output = qm.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, np.full((M, N), y_s), np.full((M, N), y_z), numerics=numerics)
    assert np.array_equal(per_column, y) and np.array_equal(per_row, y) and np.array_equal(per_output, y)


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from(NUMERICS))
def test_per_row_parameters_act_row_by_row(args, numerics):
    """A per-row a_scale/a_zero_point gives, in each row, the per-tensor result of that row's parameters."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    M = a.shape[0]
    rng = np.random.default_rng(M)
    scales = (a_s * rng.uniform(0.5, 2.0, M)).astype(np.float32)
    info = np.iinfo(a.dtype)
    zps = rng.integers(info.min, int(info.max) + 1, M).astype(a.dtype)
    y = qm.qlinear_matmul(a, scales, zps, b, b_s, b_z, y_s, y_z, numerics=numerics)
    for m in range(M):
        row = qm.qlinear_matmul(a[m : m + 1], scales[m], zps[m], b, b_s, b_z, y_s, y_z, numerics=numerics)
        assert np.array_equal(y[m : m + 1], row)


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from(NUMERICS))
def test_vector_operands_follow_matmul(args, numerics):
    """1-D a is a 1-row matrix with the row axis dropped; 1-D b a 1-column matrix with the column axis dropped."""
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    y = qm.qlinear_matmul(a, a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics)
    assert np.array_equal(qm.qlinear_matmul(a[0], a_s, a_z, b, b_s, b_z, y_s, y_z, numerics=numerics), y[0])
    assert np.array_equal(qm.qlinear_matmul(a, a_s, a_z, b[:, 0], b_s, b_z, y_s, y_z, numerics=numerics), y[:, 0])
    dot = qm.qlinear_matmul(a[0], a_s, a_z, b[:, 0], b_s, b_z, y_s, y_z, numerics=numerics)
    assert dot.shape == () and dot == y[0, 0]
