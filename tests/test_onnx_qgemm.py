"""test_onnx_qgemm.py: com.microsoft QGemm in InferenceSession against ONNX Runtime's kernel bit for bit (transposes, alpha, every C shape, 8-bit and float32 outputs, per-column b), quantize_static's QOperator Gemm models, bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_quantizer import float_model, quantize_static_model

import quantmatmul.onnx as qo
from quantmatmul import peers
from quantmatmul.onnx._qgemm import QGemmCall, qgemm, qgemm_weight

F32, U8, S8 = np.float32, np.uint8, np.int8
SATURATES = peers.onnxruntime_u8s8_saturates()  # ORT's u8·s8 AVX2 kernel without VNNI (onnxruntime#16105)
ELEM = {np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8, np.dtype(F32): TensorProto.FLOAT}
ORT_TYPES = [(U8, U8), (U8, S8), (S8, S8)]  # the A x B combinations ONNX Runtime registers


def qgemm_model(arrays: dict, *, constant_b: bool, alpha=None, trans_a=0, trans_b=0, out_type=U8, out_shape=None):
    """One QGemm node; every array in `arrays` an initializer except A (and B unless constant_b)."""
    names = ["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "C", "y_scale", "y_zero_point"]
    inputs = [n if n in arrays else "" for n in names]
    while inputs and not inputs[-1]:
        inputs.pop()
    fed = ["A"] + ([] if constant_b else ["B"])
    attrs = {"transA": trans_a, "transB": trans_b}
    if alpha is not None:
        attrs["alpha"] = alpha
    node = helper.make_node("QGemm", inputs, ["Y"], domain="com.microsoft", name="qgemm", **attrs)
    graph = helper.make_graph(
        [node],
        "qgemm",
        [helper.make_tensor_value_info(n, ELEM[arrays[n].dtype], arrays[n].shape) for n in fed],
        [helper.make_tensor_value_info("Y", ELEM[np.dtype(out_type)], out_shape)],
        [numpy_helper.from_array(v, k) for k, v in arrays.items() if k not in fed],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8), {n: arrays[n] for n in fed}


def random_arrays(rng, a_type, b_type, M, K, N, *, trans_a, trans_b, per_column, c_shape, y_type, alpha=1.0):
    def ints(dtype, shape):
        info = np.iinfo(dtype)
        lo, hi = (-64, 64) if (SATURATES and dtype == S8 and a_type == U8) else (info.min, info.max + 1)
        return rng.integers(lo, hi, shape).astype(dtype)

    arrays = {
        "A": ints(a_type, (K, M) if trans_a else (M, K)),
        "a_scale": np.array(rng.uniform(0.01, 0.1), F32),
        "a_zero_point": np.array(rng.integers(0, 40) * (1 if a_type == U8 else -1), a_type),
        "B": ints(b_type, (N, K) if trans_b else (K, N)),
    }
    n = (N,) if per_column else ()
    arrays["b_scale"] = rng.uniform(0.005, 0.05, n).astype(F32)
    arrays["b_zero_point"] = (rng.integers(0, 20, n) if b_type == U8 else np.zeros(n, int)).astype(b_type)
    if c_shape is not None:
        arrays["C"] = rng.integers(-50000, 50000, c_shape).astype(np.int32)
    if y_type is not None:  # a scale that spreads the outputs over the type's range
        names = ["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "C"]
        real = qgemm(*[arrays.get(n) for n in names], alpha=alpha, trans_a=trans_a, trans_b=trans_b)
        arrays["y_scale"] = np.array(np.abs(real).max() / 100 + 1e-3, F32)
        arrays["y_zero_point"] = np.array(100 if y_type == U8 else -3, y_type)
    return arrays


def run_both(model, feed):
    ours = qo.InferenceSession(model).run(None, feed)[0]
    theirs = peers.session(model).run(None, feed)[0]
    return ours, theirs


C_SHAPES = [None, (), (1,), "N", ("1", "N"), ("M", "1"), ("M", "N")]


@pytest.mark.parametrize("types", ORT_TYPES, ids=["u8u8", "u8s8", "s8s8"])
@pytest.mark.parametrize("c_shape", C_SHAPES, ids=lambda c: "noC" if c is None else "C" + str(c))
def test_qgemm_is_onnxruntime_bit_for_bit(types, c_shape):
    a_type, b_type = types
    rng = np.random.default_rng(len(str(c_shape)) * 7 + a_type(0).itemsize)
    M, K, N = 7, 45, 19
    dims = {"M": M, "N": N, "1": 1}
    shape = None if c_shape is None else (() if c_shape == () else tuple(dims.get(d, d) for d in c_shape))
    if c_shape == "N":
        shape = (N,)
    for trans_a, trans_b, per_column, alpha, y_type, constant_b in [
        (0, 0, False, None, a_type, True),
        (1, 1, True, 0.7, a_type, True),
        (0, 1, True, 1.0, None, False),  # float32 output
        (1, 0, False, 1.3, None, True),
    ]:
        arrays = random_arrays(
            rng,
            a_type,
            b_type,
            M,
            K,
            N,
            trans_a=trans_a,
            trans_b=trans_b,
            per_column=per_column,
            c_shape=shape,
            y_type=y_type,
            alpha=1.0 if alpha is None else alpha,
        )
        out_type = y_type if y_type is not None else F32
        model, feed = qgemm_model(
            arrays,
            constant_b=constant_b,
            alpha=alpha,
            trans_a=trans_a,
            trans_b=trans_b,
            out_type=out_type,
            out_shape=[M, N],
        )
        ours, theirs = run_both(model, feed)
        assert ours.dtype == theirs.dtype and ours.shape == (M, N)
        assert ours.tobytes() == theirs.tobytes(), (trans_a, trans_b, per_column, alpha, y_type)
        if y_type is not None:  # the output is not all saturated: the test sees the rounding
            info = np.iinfo(y_type)
            assert ((ours > info.min) & (ours < info.max)).mean() > 0.3


def test_qgemm_bias_wraps_like_int32():
    """C near int32's top plus a positive sum wraps around (the kernel adds into C in int32)."""
    M, K, N = 2, 8, 3
    arrays = {
        "A": np.full((M, K), 200, U8),
        "a_scale": np.array(1.0, F32),
        "a_zero_point": np.array(0, U8),
        "B": np.full((K, N), 100, U8),
        "b_scale": np.array(1.0, F32),
        "b_zero_point": np.array(0, U8),
        "C": np.array([2**31 - 1000, -(2**31), 5], np.int32),
    }
    model, feed = qgemm_model(arrays, constant_b=True, out_type=F32, out_shape=[M, N])
    ours, theirs = run_both(model, feed)
    assert ours.tobytes() == theirs.tobytes()
    want = (np.int64(200 * 100 * K) + arrays["C"].astype(np.int64) + 2**31) % 2**32 - 2**31
    assert np.array_equal(ours[0], want.astype(F32))


@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_static_gemm_models_run_as_onnxruntime(activation, per_channel, tmp_path):
    """Gemm (transB=1 with a bias, then a plain one) through quantize_static's QOperator format: QGemm nodes."""
    from onnxruntime.quantization import QuantFormat, QuantType

    rng = np.random.default_rng(3)
    weights = {
        "W": rng.normal(size=(32, 64)).astype(F32),
        "C": rng.normal(size=(32,)).astype(F32),
        "W2": (rng.normal(size=(32, 16)) / 4).astype(F32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "W", "C"], ["h"], transB=1, name="g1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "W2"], ["y"], name="g2"),
    ]
    model = quantize_static_model(
        float_model(nodes, 64, 16, weights),
        tmp_path,
        seed=3,
        quant_format=QuantFormat.QOperator,
        per_channel=per_channel,
        activation_type=getattr(QuantType, activation),
        weight_type=QuantType.QInt8,
        reduce_range=SATURATES,
    )
    assert [n.op_type for n in model.graph.node].count("QGemm") == 2
    feed = {"x": rng.normal(size=(9, 64)).astype(F32)}
    ours, theirs = run_both(model, feed)
    assert ours.tobytes() == theirs.tobytes()
    # compare(): each QGemm on ONNX Runtime's own inputs, bit for bit
    report = qo.compare(model, feed)
    assert report.ok, str(report)
    assert [r["op_type"] for r in report.rows] == ["QuantizeLinear", "QGemm", "QGemm", "DequantizeLinear"]
    assert all(r["differing"] == 0 for r in report.rows)


def test_qgemm_bad_input():
    rng = np.random.default_rng(0)
    good = random_arrays(rng, U8, S8, 3, 8, 4, trans_a=False, trans_b=False, per_column=False, c_shape=(4,), y_type=U8)
    cases = [
        ({"A": good["A"][None]}, ValueError, "QGemm: A must be a matrix"),
        ({"B": good["B"][:5]}, ValueError, "QGemm: A' is 3x8 and B' 5x4: inner dimensions differ"),
        ({"C": good["C"].astype(np.int64)}, TypeError, "QGemm: C must be int32"),
        ({"C": np.zeros((2, 4), np.int32)}, ValueError, "QGemm: C has shape \\(2, 4\\), which does not broadcast"),
        ({"y_zero_point": None}, ValueError, "QGemm: y_scale and y_zero_point come together"),
        ({"b_scale": np.ones(3, F32)}, ValueError, "QGemm: b_scale must be one value or one per column"),
        ({"a_scale": np.array(1.0, np.float64)}, TypeError, "QGemm: a_scale must be float32"),
        ({"A": good["A"].astype(np.int16)}, TypeError, "QGemm: A must be int8 or uint8"),
        ({"a_zero_point": np.zeros(3, U8)}, ValueError, "QGemm: a_zero_point must be per tensor"),
    ]
    for change, error, message in cases:
        args = {**good, **change}
        with pytest.raises(error, match="^" + message):
            qgemm(
                args["A"],
                args["a_scale"],
                args["a_zero_point"],
                args["B"],
                args["b_scale"],
                args["b_zero_point"],
                args["C"],
                args["y_scale"],
                args["y_zero_point"],
            )
    # through the session: the node is named
    model, feed = qgemm_model({**good, "C": good["C"].astype(np.int64)}, constant_b=False, out_shape=[3, 4])
    with pytest.raises(TypeError, match="^InferenceSession.run: node 'qgemm' \\(QGemm\\): QGemm: C must be int32"):
        qo.InferenceSession(model).run(None, feed)
    # a constant B that is not a matrix: when the session is made
    model, _ = qgemm_model({**good, "B": good["B"][None]}, constant_b=True, out_shape=[3, 4])
    with pytest.raises(ValueError, match="^InferenceSession: node 'qgemm' \\(QGemm\\): QGemm: B must be a matrix"):
        qo.InferenceSession(model)


# ---------------------------------------------------------------------------------------------------
# QDQ Gemm groups fused into QGemm (InferenceSession's fuse_qdq), as ONNX Runtime's optimizer fuses them


def qdq_gemm_model(*, quantized_output=True, bias_scale_factor=1.0, beta=None, trans_b=1, per_column=True, seed=4):
    """x -> Q -> DQ -> Gemm(DQ(W int8 [N, K] when trans_b), DQ(bias int32)) [-> Q -> y_q -> DQ] -> y."""
    rng = np.random.default_rng(seed)
    M, K, N = 6, 40, 12
    w_shape = (N, K) if trans_b else (K, N)
    a_s, n = F32(0.03), (N,) if per_column else ()
    w_s = rng.uniform(0.01, 0.02, n).astype(F32)
    inits = {
        "a_s": np.array(a_s),
        "a_z": np.array(7, U8),
        "W": rng.integers(-127, 128, w_shape).astype(S8),
        "w_s": w_s,
        "w_z": np.zeros(n, S8),
        "bias": rng.integers(-3000, 3000, (N,)).astype(np.int32),
        "bias_s": (a_s * w_s * F32(bias_scale_factor)).astype(F32),
        "y_s": np.array(0.25, F32),
        "y_z": np.array(120, U8),
    }
    if SATURATES:
        inits["W"] //= 2
    gemm_attrs = {"transB": trans_b, **({"beta": beta} if beta is not None else {})}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_s", "a_z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "a_s", "a_z"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["W", "w_s", "w_z"], ["w_dq"], axis=0 if trans_b else 1),
        helper.make_node("DequantizeLinear", ["bias", "bias_s"], ["bias_dq"], axis=0),
        helper.make_node("Gemm", ["x_dq", "w_dq", "bias_dq"], ["h"], name="gemm", **gemm_attrs),
    ]
    if quantized_output:
        nodes += [
            helper.make_node("QuantizeLinear", ["h", "y_s", "y_z"], ["y_q"]),
            helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["h"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "qdq_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    return model, {"x": rng.normal(size=(M, K)).astype(F32) * 2}


@pytest.mark.parametrize("quantized_output", [True, False], ids=["quantized", "float"])
@pytest.mark.parametrize("per_column", [True, False])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_qdq_gemm_fuses_into_qgemm_as_onnxruntime(quantized_output, per_column, trans_b):
    model, feed = qdq_gemm_model(quantized_output=quantized_output, per_column=per_column, trans_b=trans_b)
    session = qo.InferenceSession(model)
    assert session.fused == ["gemm"]
    ops = [node.op_type for node in session._evaluator.rt_nodes_]
    assert (
        "Gemm" not in ops and ops.count("QGemm") == 1 and ops.count("DequantizeLinear") == int(quantized_output)
    )  # y's only
    (ours,) = session.run(None, feed)
    (theirs,) = peers.session(model).run(None, feed)
    assert ours.tobytes() == theirs.tobytes()
    (written,) = qo.InferenceSession(model, fuse_qdq=False).run(None, feed)
    assert np.allclose(written, ours, rtol=1e-4, atol=0.26)  # float32 sums; a step of y's scale (0.25)


def test_qdq_gemm_groups_that_stay_as_written():
    for label, kwargs in {
        "bias at another scale": dict(bias_scale_factor=2.0),
        "beta scaling the bias": dict(beta=0.5),
    }.items():
        model, feed = qdq_gemm_model(**kwargs)
        session = qo.InferenceSession(model)
        assert session.fused == [] and "Gemm" in [n.op_type for n in session._evaluator.rt_nodes_], label
        (ours,) = session.run(None, feed)
        assert ours.tobytes() == qo.InferenceSession(model, fuse_qdq=False).run(None, feed)[0].tobytes(), label


def test_a_column_bias_with_per_row_zero_points_is_the_per_row_result(isa):
    """The GEMM driver folds a column bias into the per-column zero-point term where every row of a block
    has the same zero point (QLinearConv, QGemm), and adds it to the sums where rows differ (a zero point
    per row): both give the same bits, and the bits of each row computed alone."""
    from quantmatmul import _core

    rng = np.random.default_rng(3)
    M, K, N = 37, 70, 45
    a = rng.integers(0, 256, (1, M, K), np.uint8)
    b = rng.integers(-128, 128, (1, K, N), np.int8)
    bias = rng.integers(-(2**21), 2**21, (1, N)).astype(np.int32)
    mult = np.broadcast_to(np.float32(4e-5) * (1 + rng.random(N, np.float32)), (1, M, N))
    zp = np.broadcast_to(np.int32(9), (1, M, N))
    index = np.zeros(1, np.int64)
    b_zp = rng.integers(-3, 3, (1, N)).astype(np.int32)
    packed = _core.pack_b(b, True)

    def run(a_rows, a_zp):
        y = np.empty((1, a_rows.shape[1], N), np.uint8)
        sub = (1, a_rows.shape[1], N)
        _core.qlinear_matmul_onnxruntime_bias(
            a_rows, False, index, a_zp, packed, True, index, b_zp, bias, mult[:, : sub[1]], y, False, zp[:, : sub[1]]
        )
        return y

    a_zp = rng.integers(0, 256, (1, M)).astype(np.int32)
    mixed = run(a, a_zp)
    for r in range(M):
        np.testing.assert_array_equal(mixed[:, r], run(a[:, r : r + 1], a_zp[:, r : r + 1])[:, 0])
    uniform = np.full((1, M), a_zp[0, 0], np.int32)
    first = run(a, uniform)
    np.testing.assert_array_equal(first[:, :1], mixed[:, :1])
    assert len(np.unique(mixed)) > 100  # outputs spread over the range, not saturated


def test_a_qgemm_call_checked_once_takes_any_row_count():
    """QGemmCall (the session's QGemm whose inputs but A are initializers): its parameters checked and its scale
    formed once, the kernels' arrays kept for the last row count; calls with other row counts (and back) give
    the module's formula's bits, and an A of the other 8-bit type than a's zero point is refused per call."""
    rng = np.random.default_rng(12)
    K, N = 40, 23
    B = rng.integers(-128, 128, (N, K)).astype(S8)
    b_scale = rng.uniform(0.005, 0.05, N).astype(F32)
    C = rng.integers(-50000, 50000, N).astype(np.int32)
    a_scale, a_zp, y_scale, y_zp = np.float32(0.04), np.uint8(17), np.float32(0.9), np.uint8(100)
    call = QGemmCall(qgemm_weight(B, np.zeros(N, S8), True), a_scale, a_zp, b_scale, C, y_scale, y_zp, alpha=0.8)
    for M in (7, 3, 7, 1):
        A = rng.integers(0, 256, (M, K)).astype(U8)
        acc = (A.astype(np.int64) - 17) @ B.T.astype(np.int64) + C  # (no wrap at these sizes)
        scale = ((np.float32(0.8) * a_scale) * b_scale) / y_scale
        want = (np.rint(np.clip(acc.astype(np.int32).astype(F32) * scale, -100, 155)).astype(np.int32) + 100).astype(U8)
        got = call(A)
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 20
    with pytest.raises(TypeError, match="^QGemm: a_zero_point dtype uint8 does not match a dtype int8"):
        call(A.view(S8))
