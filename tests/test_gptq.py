"""test_gptq.py: quantize_nbits(method="gptq"): against the float64 one-row-at-a-time reference, output error against rtn and mse, desc_act's g_idx in matmul_nbits and ONNX Runtime, dead inputs, bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from quantmatmul.matmul_nbits import dequantize_nbits, matmul_nbits
from quantmatmul.quantize_nbits import quantize_nbits
from quantmatmul.reference.gptq import gptq_reference

F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
# (act_order, desc_act): static groups (the default), rows in order, groups in activation order (g_idx)
MODES = {"static": (True, False), "in-order": (False, False), "desc-act": (True, True)}
TIE = 1e-3  # a code may differ from the reference only where w / scale + zp is this close to a rounding tie


def calibration(rng, K, n=2000, rank=8, noise=0.3, dead=()):
    """Inputs X [n, K] with a few dominant directions (Z M, M of the given rank, plus noise) and H = X^T X / n."""
    X = rng.standard_normal((n, rank)) @ (3 * rng.standard_normal((rank, K))) + noise * rng.standard_normal((n, K))
    X[:, list(dead)] = 0
    return X, X.T @ X / n


def gptq(W, H, bits=4, block_size=32, symmetric=False, mode="static", **kw):
    act_order, desc_act = MODES[mode]
    return quantize_nbits(
        W,
        bits=bits,
        block_size=block_size,
        symmetric=symmetric,
        method="gptq",
        hessian=H,
        act_order=act_order,
        desc_act=desc_act,
        **kw,
    )


def output_error(X, W, w):
    return np.linalg.norm(X @ W.astype(F64) - X @ w.dequantize().astype(F64))


# ---------------------------------------------------------------------------------------------------
# Against the reference (src/quantmatmul/reference/gptq.py)


def assert_matches_reference(w, ref, label):
    """Same codes except where a near-tie decides (GPTQ's columns n are independent: a flipped code
    changes the rest of its column only), same zero points and g_idx. Scales searched on the updated
    weights (float32 here, float64 there) agree to 1e-4 relative: the search's least-squares refit
    sum(x c) / sum(c^2) passes on the weights' float32 rounding (2e-5 at most seen, ~1 % of the
    scales differ at all); static scales come from W itself and are identical."""
    codes = w.codes().astype(np.int64)
    order = np.argsort(ref["perm"])  # the position of each row in the sweep
    differing = np.nonzero((codes != ref["codes"]).any(axis=0))[0]
    for n in differing:
        rows = np.nonzero(codes[:, n] != ref["codes"][:, n])[0]
        first = rows[np.argmin(order[rows])]
        v = ref["value"][first, n]
        assert abs(abs(v - np.floor(v)) - 0.5) < TIE, f"{label}: column {n} row {first} differs away from a tie ({v})"
    assert len(differing) <= max(1, w.N // 50), f"{label}: {len(differing)} of {w.N} columns differ"
    same = np.setdiff1d(np.arange(w.N), differing)
    np.testing.assert_array_equal(w.zero_point_values()[same], ref["zero_points"][same], err_msg=label)
    static = label.startswith("static")
    np.testing.assert_allclose(
        w.scales[same].astype(F64), ref["stored"][same].astype(F64), rtol=0 if static else 1e-4, err_msg=label
    )
    assert (w.g_idx is None) == (label.split()[0] != "desc-act")
    if w.g_idx is not None:
        np.testing.assert_array_equal(w.g_idx, ref["group"])
    return len(differing)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_matches_the_float64_reference(mode, bits):
    rng = np.random.default_rng(100 + bits)
    act_order, desc_act = MODES[mode]
    for symmetric in (False, True):
        for K, N, block_size in ((200, 24, 32), (96, 16, 16), (150, 12, 64)):  # K tails: 8, none, 22
            _, H = calibration(rng, K)
            W = rng.standard_normal((K, N)).astype(F32)
            w = gptq(W, H, bits, block_size, symmetric, mode)
            ref = gptq_reference(
                W, H, bits=bits, block_size=block_size, symmetric=symmetric, act_order=act_order, desc_act=desc_act
            )
            assert_matches_reference(w, ref, f"{mode} bits={bits} symmetric={symmetric} K={K} bs={block_size}")


@pytest.mark.parametrize("mode", MODES)
def test_blocks_larger_than_the_lazy_batch(mode):
    """block_size 256 > the 128-row lazy batch (dynamic groups widen the batch to a group), K = 600 (a tail of 88)."""
    rng = np.random.default_rng(8)
    act_order, desc_act = MODES[mode]
    _, H = calibration(rng, 600)
    W = rng.standard_normal((600, 8)).astype(F32)
    for symmetric in (False, True):
        w = gptq(W, H, 3, 256, symmetric, mode)
        ref = gptq_reference(W, H, bits=3, block_size=256, symmetric=symmetric, act_order=act_order, desc_act=desc_act)
        assert_matches_reference(w, ref, f"{mode} bits=3 symmetric={symmetric} K=600 bs=256")


def test_static_scales_are_the_mse_search_on_w():
    """Static groups: the block scales and zero points are quantize_nbits(W, method="mse")'s."""
    rng = np.random.default_rng(1)
    _, H = calibration(rng, 130)
    W = rng.standard_normal((130, 20)).astype(F32)
    for symmetric in (False, True):
        w = gptq(W, H, 4, 32, symmetric)
        m = quantize_nbits(W, bits=4, block_size=32, symmetric=symmetric, method="mse")
        np.testing.assert_array_equal(w.scales, m.scales)
        np.testing.assert_array_equal(w.zero_point_values(), m.zero_point_values())
        assert w.g_idx is None and w.method == "gptq" and w.symmetric == symmetric


# ---------------------------------------------------------------------------------------------------
# Output error on a layer whose inputs have a few dominant directions


@pytest.mark.parametrize(("bits", "block_size"), [(4, 32), (3, 64), (2, 32), (8, 128)])
def test_output_error_below_rtn_and_mse(bits, block_size):
    rng = np.random.default_rng(bits)
    X, H = calibration(rng, 256, n=4096)
    W = rng.standard_normal((256, 96)).astype(F32)
    for symmetric in (False, True):
        rtn = output_error(X, W, quantize_nbits(W, bits=bits, block_size=block_size, symmetric=symmetric))
        mse = output_error(X, W, quantize_nbits(W, bits=bits, block_size=block_size, symmetric=symmetric, method="mse"))
        errors = {mode: output_error(X, W, gptq(W, H, bits, block_size, symmetric, mode)) for mode in MODES}
        label = f"bits={bits} bs={block_size} symmetric={symmetric}: rtn {rtn:.4g} mse {mse:.4g} gptq {errors}"
        for e in errors.values():
            assert e < 0.8 * min(rtn, mse), label
        # groups in activation order (g_idx) do about as well as the static groups
        assert 0.7 < errors["desc-act"] / errors["static"] < 1.3, label


def test_float16_and_bfloat16_weights():
    rng = np.random.default_rng(2)
    X, H = calibration(rng, 160)
    for dtype in (F16, BF16):
        W = rng.standard_normal((160, 24)).astype(dtype)
        for mode in MODES:
            w = gptq(W, H, 4, 32, False, mode)
            assert w.scales.dtype == dtype
            assert output_error(X, W, w) < 0.8 * output_error(X, W, quantize_nbits(W, bits=4, block_size=32))
            A = rng.standard_normal((3, 160)).astype(dtype) if dtype == F16 else None
            if A is not None:
                y = matmul_nbits(A, *w.tensors(), **w.attributes())
                np.testing.assert_allclose(y.astype(F32), A.astype(F32) @ w.dequantize(), rtol=2e-2, atol=5e-2)


# ---------------------------------------------------------------------------------------------------
# desc_act: g_idx


def test_desc_act_layout_and_matmul_nbits():
    rng = np.random.default_rng(3)
    K, N, bs = 200, 20, 32
    X, H = calibration(rng, K)
    W = rng.standard_normal((K, N)).astype(F32)
    for bits in (2, 4, 5, 8):
        for symmetric in (False, True):
            w = gptq(W, H, bits, bs, symmetric, "desc-act")
            assert w.g_idx.dtype == np.int32 and w.g_idx.shape == (K,) and not w.g_idx.flags.writeable
            counts = np.bincount(w.g_idx, minlength=w.k_blocks)
            assert counts.tolist() == [bs] * (K // bs) + [K % bs]  # groups of block_size rows, the last short
            # group g: the rows of positions g*bs.. in order of decreasing diag(H)
            order = np.argsort(-np.diag(H), kind="stable")
            np.testing.assert_array_equal(w.g_idx[order], np.arange(K) // bs)
            assert w.tensors()[3] is w.g_idx
            W_hat = w.dequantize()
            np.testing.assert_array_equal(dequantize_nbits(*w.tensors(), **w.attributes()), W_hat)
            A = rng.standard_normal((5, K)).astype(F32)
            y = matmul_nbits(A, *w.tensors(), **w.attributes())
            np.testing.assert_allclose(y, A @ W_hat, rtol=1e-5, atol=1e-5 * np.abs(A @ W_hat).max())
            # the scale and zero point of row k are those of block g_idx[k]
            codes = w.codes().astype(F32)
            zp = w.zero_point_values().astype(F32)[:, w.g_idx].T
            np.testing.assert_array_equal(W_hat, (codes - zp) * w.scales.astype(F32)[:, w.g_idx].T)


ort = pytest.importorskip("onnxruntime")
from peer_deviations import deviation  # noqa: E402

from quantmatmul.peers import run_matmul_nbits_onnxruntime  # noqa: E402


def test_onnxruntime_runs_gptq_weights():
    """Static groups: the plain layout, any width ORT has; desc_act at 4 bits: g_idx, symmetric (the
    default zero point) or with the zero points given as floats; uint8 zero points with g_idx are
    ignored by ORT (deviation ort-nbits-g-idx-uint8-zp)."""
    rng = np.random.default_rng(4)
    K, N = 100, 24
    X, H = calibration(rng, K)
    W = rng.standard_normal((K, N)).astype(F32)
    A = X[:7].astype(F32)

    def close(y, expected, label):
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max(), err_msg=label)

    for bits in (2, 4, 8):
        for symmetric in (False, True):
            w = gptq(W, H, bits, 32, symmetric)
            close(run_matmul_nbits_onnxruntime(A, *w.tensors(), **w.attributes()), A @ w.dequantize(), f"{bits}")
    ws = gptq(W, H, 4, 32, True, "desc-act")
    close(run_matmul_nbits_onnxruntime(A, *ws.tensors(), **ws.attributes()), A @ ws.dequantize(), "symmetric")
    wa = gptq(W, H, 4, 32, False, "desc-act")
    float_zp = wa.zero_point_values().astype(F32)
    close(
        run_matmul_nbits_onnxruntime(A, wa.B, wa.scales, float_zp, wa.g_idx, **wa.attributes()),
        A @ wa.dequantize(),
        "float zero points",
    )
    y = run_matmul_nbits_onnxruntime(A, *wa.tensors(), **wa.attributes())
    expected = A @ wa.dequantize()
    wrong = not np.allclose(y, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    if deviation("ort-nbits-g-idx-uint8-zp", wrong):
        as_if_8 = dequantize_nbits(wa.B, wa.scales, None, wa.g_idx, **wa.attributes())
        close(y, A @ as_if_8, "ORT applies the default zero point 8")


# ---------------------------------------------------------------------------------------------------
# Dead inputs, invariances, inputs never modified


@pytest.mark.parametrize("mode", MODES)
def test_dead_inputs(mode):
    """An input that is 0 in every sample (diag H = 0): its W row is zeroed first, so it is quantized
    to its zero point and dequantizes to exact zeros; the rest is as if W had that row zero."""
    rng = np.random.default_rng(5)
    dead = [0, 7, 40, 41, 99]
    X, H = calibration(rng, 100, dead=dead)
    assert (np.diag(H)[dead] == 0).all()
    W = rng.standard_normal((100, 16)).astype(F32)
    zeroed = W.copy()
    zeroed[dead] = 0
    for symmetric in (False, True):
        w = gptq(W, H, 4, 32, symmetric, mode)
        assert not w.dequantize()[dead].any()
        block = np.arange(100) // 32 if w.g_idx is None else w.g_idx
        np.testing.assert_array_equal(w.codes()[dead], w.zero_point_values().T[block[dead]])
        z = gptq(zeroed, H, 4, 32, symmetric, mode)
        for a, b in zip(w.tensors(), z.tensors()):
            np.testing.assert_array_equal(a, b)
    # every input dead: H = 0, the result of a zero W
    w = gptq(W, np.zeros((100, 100)), 4, 32, False, mode)
    assert not w.dequantize().any()


def test_hessian_scale_dtype_and_defaults():
    """A positive multiple of H, H in float32 (its values), and the explicit defaults give the same result."""
    rng = np.random.default_rng(6)
    _, H = calibration(rng, 96)
    H = H.astype(F32).astype(F64)  # values float32 holds exactly
    W = rng.standard_normal((96, 10)).astype(F32)
    base = quantize_nbits(W, method="gptq", hessian=H)
    for other in (
        quantize_nbits(W, method="gptq", hessian=H * 8),
        quantize_nbits(W, method="gptq", hessian=H.astype(F32)),
        quantize_nbits(W, method="gptq", hessian=H, damp=0.01, act_order=True, desc_act=False),
    ):
        for a, b in zip(base.tensors(), other.tensors()):
            np.testing.assert_array_equal(a, b)
    more = quantize_nbits(W, method="gptq", hessian=H, damp=0.5)
    assert not np.array_equal(more.B, base.B)


@pytest.mark.parametrize("mode", MODES)
def test_inputs_unmodified(mode):
    rng = np.random.default_rng(7)
    _, H = calibration(rng, 70, dead=[3])
    for wdtype in (F32, F16, F64):
        for hdtype in (F32, F64):
            W = rng.standard_normal((70, 9)).astype(wdtype)
            Hc = H.astype(hdtype)
            before_w, before_h = W.copy(), Hc.copy()
            w = gptq(W, Hc, 4, 16, False, mode)
            np.testing.assert_array_equal(W.view(np.uint8), before_w.view(np.uint8))
            np.testing.assert_array_equal(Hc.view(np.uint8), before_h.view(np.uint8))
            v = gptq(np.asfortranarray(W), np.asfortranarray(Hc), 4, 16, False, mode)
            np.testing.assert_array_equal(v.B, w.B)


# ---------------------------------------------------------------------------------------------------
# Bad input


def _bad_hessians():
    K = 32
    H = np.eye(K)
    nan = H.copy()
    nan[1, 2] = nan[2, 1] = np.nan
    asym = H.copy()
    asym[0, 5] = 0.5
    negative = H.copy()
    negative[4, 4] = -1
    infinite = H.copy()
    infinite[0, 0] = np.inf
    indefinite = 2 * np.ones((K, K)) - np.eye(K)  # diagonal 1, eigenvalues 2K - 1 and -1
    return [
        (
            np.eye(K + 1),
            ValueError,
            r"hessian must be the \[K, K\] = \[32, 32\] matrix X\^T X / n .* got shape \(33, 33\)",
        ),
        (np.ones((K, K + 1)), ValueError, r"hessian must be the \[K, K\] .* got shape \(32, 33\)"),
        (np.ones(K), ValueError, r"hessian must be the \[K, K\] .* got shape \(32,\)"),
        (nan, ValueError, r"hessian\[1, 2\] = nan is not finite"),
        (infinite, ValueError, r"hessian\[0, 0\] = inf is not finite"),
        (np.eye(K, dtype=np.float16), TypeError, "hessian dtype float16 is not supported, expected float32 or float64"),
        (np.eye(K, dtype=np.int64), TypeError, "hessian dtype int64 is not supported"),
        (np.eye(K, dtype=np.complex128), TypeError, "hessian dtype complex128 is not supported"),
        (np.eye(K, dtype=int).tolist(), TypeError, "hessian must be a floating-point array"),
        (asym, ValueError, r"hessian is not symmetric: hessian\[0, 5\] = 0.5, hessian\[5, 0\] = 0.0"),
        (negative, ValueError, r"hessian\[4, 4\] = -1.0 < 0; X\^T X / n is positive semidefinite"),
    ], indefinite


@pytest.mark.parametrize("case", range(11))
def test_bad_hessian(case):
    H, error, match = _bad_hessians()[0][case]
    W = np.ones((32, 2), np.float32)
    with pytest.raises(error, match=f"^quantize_nbits: {match}"):
        quantize_nbits(W, method="gptq", hessian=H)


def test_hessian_not_positive_definite():
    _, indefinite = _bad_hessians()
    with pytest.raises(ValueError, match="^quantize_nbits: hessian plus damping is not positive definite"):
        quantize_nbits(np.ones((32, 2), np.float32), method="gptq", hessian=indefinite, damp=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "gptq"}, ValueError, r"method 'gptq' needs hessian=, the \[K, K\] matrix X\^T X / n"),
        ({"hessian": np.eye(32)}, ValueError, "hessian is only used by method 'gptq', got method 'rtn'"),
        (
            {"method": "mse", "hessian": np.eye(32)},
            ValueError,
            "hessian is only used by method 'gptq', got method 'mse'",
        ),
        ({"desc_act": True}, ValueError, "desc_act is only used by method 'gptq', got method 'rtn'"),
        (
            {"method": "hqq", "damp": 0.1, "act_order": False},
            ValueError,
            "damp, act_order are only used by method 'gptq', got method 'hqq'",
        ),
        (
            {"method": "gptq", "hessian": np.eye(32), "damp": -0.01},
            ValueError,
            r"damp must be a finite number >= 0 \(a fraction of the mean of diag\(hessian\)\), got -0.01",
        ),
        ({"method": "gptq", "hessian": np.eye(32), "damp": np.nan}, ValueError, "damp must be a finite number >= 0"),
        ({"method": "gptq", "hessian": np.eye(32), "damp": "0.1"}, TypeError, "damp must be a real number, got str"),
        ({"method": "gptq", "hessian": np.eye(32), "damp": True}, TypeError, "damp must be a real number, got bool"),
        ({"method": "gptq", "hessian": np.eye(32), "desc_act": 1}, TypeError, "desc_act must be a bool, got int"),
        ({"method": "gptq", "hessian": np.eye(32), "act_order": "no"}, TypeError, "act_order must be a bool, got str"),
        (
            {"method": "gptq", "hessian": np.eye(32), "desc_act": True, "act_order": False},
            ValueError,
            "desc_act=True forms the groups in activation order and needs act_order=True",
        ),
        ({"method": "awq"}, ValueError, "method must be one of 'rtn', 'mse', 'hqq', 'gptq', got 'awq'"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=f"^quantize_nbits: {match}"):
        quantize_nbits(np.ones((32, 2), np.float32), **kwargs)


def test_weights_are_still_checked():
    W = np.ones((32, 2), np.float32)
    W[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"^quantize_nbits: W\[3, 1\] = nan is not finite"):
        quantize_nbits(W, method="gptq", hessian=np.eye(32))
    with pytest.raises(ValueError, match=r"^quantize_nbits: hessian must be the \[K, K\] = \[16, 16\]"):
        quantize_nbits(np.ones((16, 2), np.float32), method="gptq", hessian=np.eye(32))
