"""test_onnx_cnn.py: convolutional models in the session: a QDQ model's DequantizeLinear -> Conv -> QuantizeLinear groups as QLinearConv (which fuse, the bits they give), ONNX Runtime's quantize_static CNNs (QDQ and QOperator) against ONNX Runtime, compare()'s rows."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_bits import optimized_session
from ort_quantizer import quantize_static_model, small_cnn
from peer_deviations import _ort_u8s8_kernel_saturates, deviation, pinned_only
from qdq_chain import Chain

import quantmatmul
import quantmatmul.onnx as qo
from quantmatmul.onnx._fuse import fuse_qdq
from quantmatmul.onnx._qconv import qlinear_conv

U8, S8 = np.uint8, np.int8
ELEM = {np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8}
# the residual Add runs as QLinearAdd and the pooling as QLinearGlobalAveragePool: the pinned ORT's kernels
ORT_PINNED = pinned_only("onnxruntime", "compared with the kernels of")
SATURATES = _ort_u8s8_kernel_saturates()  # ORT's u8·s8 AVX2 kernels without VNNI (onnxruntime#16105)


def conv_qdq_model(
    *,
    types=(U8, S8, U8),
    per_channel=False,
    bias="int32",
    bias_scale=None,
    relu=False,
    y_zero_point=None,
    w_axis=0,
    conv_output=False,
    seed=0,
    **attrs,
):
    """x (float [1, 4, 7, 6]) -> Q -> DQ -> Conv (w: DQ of int8/uint8 codes [6, 2, 3, 3], group 2, pads 1; bias:
    DQ of int32 codes, a float initializer or none) [-> Relu] -> Q -> y_q -> DQ -> y."""
    rng = np.random.default_rng(seed)
    xt, wt, yt = (np.dtype(t) for t in types)
    M = 6
    x_s, y_s = np.float32(0.05), np.float32(0.4)
    w_s = rng.uniform(0.01, 0.03, M).astype(np.float32) if per_channel else np.float32(0.02)
    w_codes = rng.integers(-100, 100, (M, 2, 3, 3)) + (128 if wt == U8 else 0)
    inits = {
        "x_s": x_s,
        "x_z": np.asarray(3 if xt == U8 else -2, xt),
        "w": w_codes.astype(wt),
        "w_s": w_s,
        "w_z": np.zeros(np.shape(w_s), wt) + (128 if wt == U8 else 0),
        "y_s": y_s,
        "y_z": np.asarray(y_zero_point if y_zero_point is not None else (90 if yt == U8 else -7), yt),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["w_dq"], axis=w_axis),
    ]
    conv_inputs = ["x_dq", "w_dq"]
    if bias == "int32":
        inits["b"] = rng.integers(-2000, 2000, M).astype(np.int32)
        inits["b_s"] = np.asarray(bias_scale if bias_scale is not None else x_s * w_s, np.float32)
        nodes.append(helper.make_node("DequantizeLinear", ["b", "b_s"], ["b_dq"], axis=0))
        conv_inputs.append("b_dq")
    elif bias == "float":
        inits["b"] = rng.normal(size=M).astype(np.float32)
        conv_inputs.append("b")
    attrs = {"group": 2, "pads": [1, 1, 1, 1], **attrs}
    nodes.append(helper.make_node("Conv", conv_inputs, ["c"], name="conv", **attrs))
    out = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        out = "r"
    nodes += [
        helper.make_node("QuantizeLinear", [out, "y_s", "y_z"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if conv_output:
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 6])],
        outputs,
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), inits


def feed(seed=1, shape=(1, 4, 7, 6)):
    return {"x": np.random.default_rng(seed).normal(size=shape).astype(np.float32) * 3}


def fused_types(model):
    return [n.op_type for n in fuse_qdq(model)[0].graph.node]


@pytest.mark.parametrize(
    "types", list(itertools.product([U8, S8], repeat=3)), ids=lambda t: "".join(np.dtype(v).name[0] for v in t)
)
def test_conv_group_is_qlinear_conv_of_the_codes(types):
    """Every int8 / uint8 combination fuses (exact integer sums, as the MatMul group); the fused output is
    qlinear_conv of the codes, and as written lands at most a step away."""
    model, inits = conv_qdq_model(types=types, per_channel=True)
    session = qo.InferenceSession(model)
    assert session.fused == ["conv"]
    assert fused_types(model) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    x = feed()
    y = session.run(None, x)[0]
    x_q = quantmatmul.quantize_linear(x["x"], inits["x_s"], inits["x_z"])
    y_q = qlinear_conv(
        x_q,
        inits["x_s"],
        inits["x_z"],
        inits["w"],
        inits["w_s"],
        inits["w_z"],
        inits["y_s"],
        inits["y_z"],
        inits["b"],
        group=2,
        pads=[1, 1, 1, 1],
    )
    np.testing.assert_array_equal(y, quantmatmul.dequantize_linear(y_q, inits["y_s"], inits["y_z"]))
    written = qo.InferenceSession(model, fuse_qdq=False).run(None, x)[0]
    assert np.abs(written - y).max() <= inits["y_s"] * 1.0001


@pytest.mark.parametrize("types", [(U8, S8, U8), (U8, U8, U8)], ids=["u8s8", "u8u8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fused_conv_is_onnxruntime_bit_for_bit(types, per_channel):
    """ORT's optimizer fuses the same group (uint8 activations) into its QLinearConv."""
    if SATURATES and types[1] == S8:
        pytest.skip("ORT's u8·s8 kernels saturate int16 pair sums on this CPU (onnxruntime#16105)")
    model, _ = conv_qdq_model(types=types, per_channel=per_channel)
    for seed in range(3):
        ours = qo.InferenceSession(model).run(None, feed(seed))[0]
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feed(seed)
        )[0]
        np.testing.assert_array_equal(ours, theirs)


def test_redundant_relu_fuses_and_a_clipping_one_does_not():
    model, _ = conv_qdq_model(relu=True, y_zero_point=0)
    assert fused_types(model).count("QLinearConv") == 1 and "Relu" not in fused_types(model)
    model, _ = conv_qdq_model(relu=True, y_zero_point=5)  # the Relu clips above the type's minimum
    assert "QLinearConv" not in fused_types(model)
    model, _ = conv_qdq_model(types=(S8, S8, S8), relu=True, y_zero_point=-128)
    assert "Relu" not in fused_types(model)


@pytest.mark.parametrize(
    "change",
    [
        {"bias": "float"},  # a float bias: ORT's selector wants every input dequantized
        {"bias_scale": 0.5},  # an int32 bias at another scale than x_scale * w_scale
        {"per_channel": True, "w_axis": 1},  # per channel along the wrong axis
        {"conv_output": True},  # the Conv's float output is a graph output
    ],
    ids=["float-bias", "bias-scale", "weight-axis", "graph-output"],
)
def test_groups_that_stay_as_written(change):
    model, _ = conv_qdq_model(**change)
    assert "QLinearConv" not in fused_types(model)
    if change.get("w_axis") != 1:  # (a scale along axis 1 does not fit the weight: not a valid model)
        qo.InferenceSession(model).run(None, feed())


def test_attributes_go_with_the_fused_node():
    model, inits = conv_qdq_model(strides=[2, 1], dilations=[1, 2], pads=[2, 1, 0, 2], bias="none")
    (node,) = [n for n in fuse_qdq(model)[0].graph.node if n.op_type == "QLinearConv"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"group": 2, "pads": [2, 1, 0, 2], "strides": [2, 1], "dilations": [1, 2]}
    if not SATURATES:
        ours = qo.InferenceSession(model).run(None, feed())[0]
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed())[
            0
        ]
        np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------------------------------
# ONNX Runtime's quantize_static on a small CNN


@pytest.fixture(scope="module")
def cnn_models(tmp_path_factory):
    from onnxruntime.quantization import QuantFormat, QuantType

    models = {}
    for fmt, act, per_channel in itertools.product(["QDQ", "QOperator"], ["u8", "s8"], [True, False]):
        folder = tmp_path_factory.mktemp(f"{fmt}{act}{per_channel}")
        models[fmt, act, per_channel] = quantize_static_model(
            small_cnn(),
            folder,
            quant_format=getattr(QuantFormat, fmt),
            activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8,
            weight_type=QuantType.QUInt8 if (act == "u8" and not per_channel) else QuantType.QInt8,
            per_channel=per_channel,
        )
    return models


def cnn_feed(seed):
    return {"x": np.random.default_rng(seed).normal(size=(2, 3, 16, 16)).astype(np.float32)}


def ort_optimized_types(model):
    return optimized_session(model)[1]


@ORT_PINNED
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_uint8_cnn_is_onnxruntime_bit_for_bit(cnn_models, fmt, per_channel):
    """uint8 activations: ORT fuses every group the session fuses (its NHWC QLinearConv, QLinearAdd,
    QLinearGlobalAveragePool, QGemm); the logits are ORT's bit for bit."""
    model = cnn_models[fmt, "u8", per_channel]
    if SATURATES and per_channel:
        pytest.skip("ORT's u8·s8 kernels saturate int16 pair sums on this CPU (onnxruntime#16105)")
    session = qo.InferenceSession(model)
    if fmt == "QDQ":
        assert fused_types(model).count("QLinearConv") == 3 == ort_optimized_types(model).count("QLinearConv")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        np.testing.assert_array_equal(session.run(None, cnn_feed(seed))[0], reference.run(None, cnn_feed(seed))[0])


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_int8_cnn_within_a_step_of_onnxruntime(cnn_models, fmt):
    """int8 activations: ORT's x86 optimizer fuses a group only where its S8-to-U8 transformer makes the
    activations uint8 (the middle Conv, whose input two nodes read, stays float there); the session fuses
    every Conv (exact sums), so the logits agree to a step of their scale."""
    model = cnn_models[fmt, "s8", True]
    if fmt == "QDQ":
        assert fused_types(model).count("QLinearConv") == 3
        assert ort_optimized_types(model).count("QLinearConv") == 2
    y_scale = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "y_scale")
    session = qo.InferenceSession(model)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        ours, theirs = session.run(None, cnn_feed(seed))[0], reference.run(None, cnn_feed(seed))[0]
        assert np.abs(ours - theirs).max() <= y_scale * 1.0001


@ORT_PINNED
def test_compare_checks_the_conv_groups_and_nodes(cnn_models):
    if SATURATES:
        pytest.skip("ORT's u8·s8 kernels saturate int16 pair sums on this CPU (onnxruntime#16105)")
    report = qo.compare(cnn_models["QDQ", "u8", True], cnn_feed(0), numerics="onnxruntime")
    rows = [r for r in report.rows if r["op_type"] == "QDQ Conv -> QLinearConv"]
    assert len(rows) == 3 and all(r["ok"] and r["differing"] == 0 for r in rows), str(report)
    assert report.ok
    report = qo.compare(cnn_models["QOperator", "u8", True], cnn_feed(0), numerics="exact")
    rows = [r for r in report.rows if r["op_type"] == "QLinearConv"]
    assert len(rows) == 3 and all(r["ok"] for r in rows), str(report)
    assert report.ok


# --------------------------------------------------------------------------------------------------
# MaxPool (onnx/_pool.py)

_POOL_TYPES = [np.float32, np.float64, np.uint8, np.int8]
_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE, **ELEM}


def _max_pool_model(x, **attrs):
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", _ONNX_TYPES[x.dtype], x.shape)],
        [helper.make_tensor_value_info("y", _ONNX_TYPES[x.dtype], None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _random_pool(rng, trial, *, dilated):
    nd = int(rng.integers(1, 4))
    dtype = np.dtype(_POOL_TYPES[trial % 4])
    kernel = [int(rng.integers(1, 4)) for _ in range(nd)]
    dilations = [int(rng.integers(1, 3)) if dilated else 1 for _ in range(nd)]
    spatial = [int(rng.integers((k - 1) * d + 1, (k - 1) * d + 6)) for k, d in zip(kernel, dilations)]
    auto_pad = ["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"][trial % 5]
    attrs = {"kernel_shape": kernel, "strides": [int(rng.integers(1, 3)) for _ in range(nd)], "auto_pad": auto_pad}
    attrs["dilations"] = dilations
    if auto_pad == "NOTSET":
        attrs["pads"] = [int(rng.integers(0, k)) for k in kernel] + [int(rng.integers(0, k)) for k in kernel]
    if dtype.kind == "f":
        x = (rng.normal(size=(2, 3, *spatial)) * 50).astype(dtype)
    else:
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (2, 3, *spatial)).astype(dtype)
    return x, attrs


def test_max_pool_is_onnxruntimes():
    """Values and shapes as ONNX Runtime's MaxPool (the spec's pads, every auto_pad), 1-3-D, floats and
    8-bit codes, in the session."""
    rng = np.random.default_rng(4)
    for trial in range(120):
        x, attrs = _random_pool(rng, trial, dilated=trial % 5 < 3)  # SAME with dilations: below
        model = _max_pool_model(x, **attrs)
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        ours = qo.InferenceSession(model).run(None, {"x": x})[0]
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_max_pool_of_codes_is_numpys(dtype):
    """The C++ loop over 8-bit codes (channels last: 64 channels at a time, then 16, then one by one; the 2-D
    taps from each position's coordinates, counted along from a task's first row) against max_pool's numpy
    path on the same values as int16: channel counts on and off those steps, several images and tasks
    starting mid-row, 1- to 3-D, strides, dilations and pads smaller than the kernel."""
    from quantmatmul.onnx._pool import max_pool

    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    threads_before = quantmatmul.get_num_threads()
    cases = [((2, 85, 29, 31), [3, 3], [2, 2], [1], [1, 1, 1, 1]), ((1, 64, 40, 40), [3, 3], [1, 1], [1], [1, 0, 0, 1])]
    cases += [((3, 16, 9, 7), [2, 3], [1, 2], [2], [0, 1, 1, 1]), ((1, 130, 12, 12), [3, 3], [2, 2], [1], [0] * 4)]
    cases += [((2, 70, 50), [3], [2], [1], [1, 1]), ((1, 17, 6, 5, 7), [2, 2, 3], [1, 2, 1], [1], [1, 0, 1, 0, 1, 1])]
    for shape, kernel, strides, dilation, pads in cases:
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        attrs = dict(kernel_shape=kernel, strides=strides, dilations=dilation * len(kernel), pads=pads)
        want = max_pool(x.astype(np.int16), **attrs).astype(dtype)
        try:
            for threads in (1, 2):
                quantmatmul.set_num_threads(threads)
                got = max_pool(x, **attrs)
                assert got.dtype == x.dtype and got.tobytes() == want.tobytes(), (shape, threads)
                view = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)  # channels-last memory
                assert max_pool(view, **attrs).tobytes() == want.tobytes()
        finally:
            quantmatmul.set_num_threads(threads_before)


def test_max_pool_same_with_dilations_is_the_specs():
    """auto_pad SAME pads the dilated kernel (the spec, as Conv); ONNX Runtime's MaxPool pads for the
    undilated one there (its output shape differs from the spec's and its own shape inference's)."""
    from quantmatmul.onnx._pool import max_pool

    x = np.arange(2 * 11, dtype=np.float32).reshape(1, 2, 11)
    attrs = {"kernel_shape": [3], "strides": [2], "dilations": [2], "auto_pad": "SAME_UPPER"}
    ours = max_pool(x, **attrs)
    assert ours.shape == (1, 2, 6)  # ceil(11 / 2)
    # the spec's padding: (6 - 1) * 2 + 5 - 11 = 4, two on each side
    np.testing.assert_array_equal(ours, max_pool(x, kernel_shape=[3], strides=[2], dilations=[2], pads=[2, 2]))
    model = _max_pool_model(x, **attrs)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    deviation("ort-pool-same-dilations", theirs.shape != ours.shape or not np.array_equal(theirs, ours))


def test_onnx_reference_max_pool_pads_deviation():
    """onnx.reference's MaxPool (strides and dilations 1, or SAME_LOWER) reads pads as (begin, end) per axis
    and pads SAME_LOWER as SAME_UPPER; the session follows the spec (and ONNX Runtime)."""
    from onnx.reference import ReferenceEvaluator

    from quantmatmul.onnx._pool import max_pool

    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 1, 0, 1])
    theirs = ReferenceEvaluator(node).run(None, {"x": x})[0]
    ours = max_pool(x, kernel_shape=[3, 3], pads=[0, 1, 0, 1])
    np.testing.assert_array_equal(ours, [[[[11, 12, 13, 14, 14], [16, 17, 18, 19, 19], [21, 22, 23, 24, 24]]]])
    x1 = np.arange(6, dtype=np.float32).reshape(1, 1, 6)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], strides=[2], auto_pad="SAME_LOWER")
    theirs_lower = ReferenceEvaluator(node).run(None, {"x": x1})[0]
    ours_lower = max_pool(x1, kernel_shape=[3], strides=[2], auto_pad="SAME_LOWER")
    np.testing.assert_array_equal(ours_lower, [[[1, 3, 5]]])  # padding 1: at the beginning
    deviation(
        "onnx-maxpool-pads",
        theirs.shape != ours.shape or not np.array_equal(theirs, ours) or not np.array_equal(theirs_lower, ours_lower),
    )


def test_max_pool_keeps_onnx_reference_for_indices_ceil_mode_and_nan():
    x = np.random.default_rng(0).normal(size=(1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 1, 1] = np.nan
    for attrs, outputs in (({"kernel_shape": [2, 2]}, ["y"]), ({"kernel_shape": [2, 2], "ceil_mode": 1}, ["y"])):
        node = helper.make_node("MaxPool", ["x"], outputs, **attrs)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_array_equal(qo.InferenceSession(model).run(None, {"x": x})[0], expected)


def test_max_pool_bad_input():
    from quantmatmul.onnx._pool import max_pool

    with pytest.raises(ValueError, match="^MaxPool: kernel_shape is required"):
        max_pool(np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="^MaxPool: strides must be 2 positive integers"):
        max_pool(np.zeros((1, 1, 4, 4), np.float32), kernel_shape=[2, 2], strides=[0, 1])
    with pytest.raises(ValueError, match=r"^MaxPool: the kernel \(extent \[5, 5\]\) does not fit"):
        max_pool(np.zeros((1, 1, 4, 4), np.float32), kernel_shape=[5, 5])


# --------------------------------------------------------------------------------------------------
# Random uint8 QDQ CNN chains against ONNX Runtime's optimizer


def random_cnn_chain(seed):
    """x [2, C, H, W] quantized (uint8) and run through 2-5 random steps, each dequantizing the previous codes
    and quantizing its result at a fresh uint8 scale and zero point (or, for MaxPool, the same one: its pair
    is dropped): Conv (int8 or uint8 weights per tensor or per channel, an int32 bias, strides, pads, maybe
    a ReLU6 Clip that the quantization makes redundant or not),
    MaxPool, AveragePool (pads, ceil_mode, count_include_pad), Sigmoid, LeakyRelu, Add with a second
    quantized input, Concat of channels with one (the first input maybe twice), GlobalAveragePool last.
    Every step's codes are graph outputs."""
    chain = Chain(seed)
    rng, inits, nodes = chain.rng, chain.inits, chain.nodes
    shape = [2, int(rng.integers(1, 9)), int(rng.integers(5, 12)), int(rng.integers(5, 12))]
    chain.input("x", shape)
    quantize, dequantize = chain.quantize, chain.dequantize

    def pooled(size, k, s, pad, ceil):
        span = size + pad - k
        return (-(-span // s) if ceil else span // s) + 1

    codes = quantize("x", "q0", 0.05, 128)
    steps = int(rng.integers(2, 6))
    for step in range(1, steps + 1):
        kinds = ["Conv", "Conv", "MaxPool", "AveragePool", "Sigmoid", "LeakyRelu", "Add", "Concat"]
        kind = "GlobalAveragePool" if step == steps and rng.random() < 0.4 else rng.choice(kinds)
        if kind in ("MaxPool", "AveragePool") and min(shape[2:]) < 3:
            kind = "Sigmoid"
        a, out = dequantize(codes), f"h{step}"
        scale = zero = None
        if kind == "Conv":
            m, k, s = int(rng.integers(1, 9)), int(rng.choice([1, 3])), int(rng.integers(1, 3))
            w_type = S8 if rng.random() < 0.6 else U8
            lo, hi = (-64, 64) if (SATURATES and w_type == S8) else (np.iinfo(w_type).min, np.iinfo(w_type).max + 1)
            per_channel = rng.random() < 0.5
            inits[f"W{step}"] = rng.integers(lo, hi, (m, shape[1], k, k)).astype(w_type)
            w_s = rng.uniform(0.002, 0.02, (m,) if per_channel else ()).astype(np.float32)
            inits[f"W{step}_s"] = w_s
            inits[f"W{step}_z"] = (np.zeros(w_s.shape, int) + (0 if w_type == S8 else 128)).astype(w_type)
            inits[f"B{step}"] = rng.integers(-3000, 3000, m).astype(np.int32)
            inits[f"B{step}_s"] = (inits[f"{codes}_s"] * w_s).astype(np.float32)
            nodes.append(
                helper.make_node("DequantizeLinear", [f"W{step}", f"W{step}_s", f"W{step}_z"], [f"W{step}_dq"], axis=0)
            )
            nodes.append(helper.make_node("DequantizeLinear", [f"B{step}", f"B{step}_s"], [f"B{step}_dq"], axis=0))
            pad = k // 2
            nodes.append(
                helper.make_node("Conv", [a, f"W{step}_dq", f"B{step}_dq"], [out], pads=[pad] * 4, strides=[s, s])
            )
            shape = [2, m, *((d + 2 * pad - k) // s + 1 for d in shape[2:])]
            if rng.random() < 0.4:  # a ReLU6 as Clip(0, 6), quantized at a scale near 6 / 255 (redundant or not)
                inits[f"lo{step}"], inits[f"hi{step}"] = np.float32(0), np.float32(6)
                nodes.append(helper.make_node("Clip", [out, f"lo{step}", f"hi{step}"], [out + "c"]))
                out, scale, zero = out + "c", 6 / rng.uniform(253.5, 256.5), 0
        elif kind in ("MaxPool", "AveragePool"):
            k, s = int(rng.integers(2, 4)), int(rng.integers(1, 3))
            pads = [int(rng.integers(0, k)) for _ in range(4)]
            attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": pads}
            ceil = 0
            if kind == "AveragePool":
                ceil = int(rng.integers(0, 2))
                attrs |= {"count_include_pad": int(rng.integers(0, 2)), "ceil_mode": ceil}
                attrs["pads"] = pads = [0, 0, 0, 0] if ceil else pads  # (ceil_mode with pads: ORT's own rule)
            else:
                scale, zero = inits[f"{codes}_s"].item(), inits[f"{codes}_z"].item()
            nodes.append(helper.make_node(kind, [a], [out], **attrs))
            shape = [2, shape[1], *(pooled(d, k, s, pads[i] + pads[i + 2], ceil) for i, d in enumerate(shape[2:]))]
        elif kind in ("Sigmoid", "LeakyRelu"):
            attrs = {"alpha": float(rng.uniform(0.01, 0.3))} if kind == "LeakyRelu" else {}
            nodes.append(helper.make_node(kind, [a], [out], **attrs))
        elif kind == "Add":
            chain.input(f"z{step}", shape)
            other = dequantize(quantize(f"z{step}", f"zq{step}"))
            nodes.append(helper.make_node("Add", [a, other], [out]))
        elif kind == "Concat":  # of channels, with a second quantized input (the first maybe twice)
            extra = [2, int(rng.integers(1, 5)), *shape[2:]]
            chain.input(f"z{step}", extra)
            other = dequantize(quantize(f"z{step}", f"zq{step}"))
            parts = [a, other] + ([a] if rng.random() < 0.5 else [])
            nodes.append(helper.make_node("Concat", parts, [out], axis=1))
            shape = [2, shape[1] * parts.count(a) + extra[1], *shape[2:]]
        else:
            nodes.append(helper.make_node("GlobalAveragePool", [a], [out]))
            shape = [2, shape[1], 1, 1]
        codes = quantize(out, f"q{step}", scale, zero)
        chain.output(codes, shape)
    return chain.finish("cnn")


@ORT_PINNED
def test_random_qdq_cnn_chains_are_onnxruntime_bit_for_bit():
    """40 random uint8 QDQ CNN chains: the session's rewritten graph runs as many QLinear* / QuantizeLinear /
    DequantizeLinear nodes as ONNX Runtime's optimized graph (the rules meet ORT's), and gives ORT's codes at
    every step."""
    counted = (
        "QLinearConv",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAdd",
        "QLinearConcat",
        "QuantizeLinear",
        "DequantizeLinear",
    )
    for seed in range(40):
        model, x = random_cnn_chain(seed)
        session = qo.InferenceSession(model)
        reference, ort_ops = optimized_session(model)
        ours_ops = [n.onnx_node.op_type for n in session._evaluator.rt_nodes_]
        assert {op: ours_ops.count(op) for op in counted} == {op: ort_ops.count(op) for op in counted}, (
            seed,
            ours_ops,
            ort_ops,
        )
        for output, a, b in zip(model.graph.output, session.run(None, x), reference.run(None, x)):
            assert a.tobytes() == b.tobytes(), (seed, output.name, session.fused)
            assert a.flags.c_contiguous  # (the session's convolutions and pools pass channels-last views on)


# --------------------------------------------------------------------------------------------------
# ONNX's own node test cases (onnx.backend.test's generator, in memory)

_NODE_CASES = ("qlinearconv", "convinteger", "maxpool")


@pytest.fixture(scope="module")
def onnx_node_cases():
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():  # the generator's own numpy warnings (other operators' cases)
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [c for c in cases if any(key in c.name for key in _NODE_CASES) and "globalmaxpool" not in c.name]


@pytest.mark.parametrize("numerics", ["onnxruntime", "onnx-reference", "exact"])
def test_onnx_node_test_cases(onnx_node_cases, numerics):
    """onnx 1.23's QLinearConv, ConvInteger and MaxPool node tests (padding, strides, dilations, SAME_UPPER /
    SAME_LOWER, ceil_mode, uint8, with Indices), their expected outputs exactly, in the session."""
    names = sorted(c.name for c in onnx_node_cases)
    assert {"test_qlinearconv", "test_convinteger_with_padding", "test_maxpool_2d_same_lower"} <= set(names), names
    for case in onnx_node_cases:
        session = qo.InferenceSession(case.model, numerics=numerics)
        constants = {t.name for t in case.model.graph.initializer}
        feeds = [i.name for i in case.model.graph.input if i.name not in constants]
        for inputs, outputs in case.data_sets:
            for got, expected in zip(session.run(None, dict(zip(feeds, inputs))), outputs):
                assert got.dtype == expected.dtype and got.shape == expected.shape, case.name
                np.testing.assert_array_equal(got, expected, err_msg=case.name)


def _clip_model(c_min, c_max, y_scale, y_zero_point, opset):
    """x -> Q -> DQ -> Conv (int8 weights) -> Clip(c_min, c_max; None: absent) -> Q (uint8) -> DQ -> y."""
    rng = np.random.default_rng(0)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(128), "w": rng.integers(-50, 50, (4, 3, 3, 3)).astype(np.int8)}
    inits |= {"ws": np.float32(0.01), "wz": np.int8(0), "ys": np.float32(y_scale), "yz": np.uint8(y_zero_point)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1], name="conv"),
    ]
    if opset >= 11:  # bounds as inputs
        bounds = []
        for name, value in (("lo", c_min), ("hi", c_max)):
            if value is not None:
                inits[name] = np.float32(value)
            bounds.append(name if value is not None else "")
        nodes.append(helper.make_node("Clip", ["c", *bounds], ["r"]))
    else:  # as attributes
        attrs = {k: float(v) for k, v in (("min", c_min), ("max", c_max)) if v is not None}
        nodes.append(helper.make_node("Clip", ["c"], ["r"], **attrs))
    nodes += [
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


_CLIPS = [
    (0, 6, 6 / 255, 0, True),  # a ReLU6 quantized to [0, 6]
    (0, 6, 6 / 254.9, 0, True),  # 6 / scale rounds to 255
    (0, 6, 6 / 254.4, 0, False),  # ... to 254: the Clip cuts the top code off
    (0, 6, 7 / 255, 0, False),
    (0, 6, 6 / 255, 3, False),  # 0 quantizes to 3, above the type's minimum
    (-0.011, 6, 0.02, 1, True),
    (0.1, 6, 6 / 255, 0, False),
    (0, None, 0.001, 0, True),  # no max: ORT 1.32 takes it as redundant whatever the scale
    (None, 6, 6 / 255, 0, True),
]
# before opset 11 the bounds are attributes, and one left out is the float range: the cases with both
_CLIP_CASES = [(*case, opset) for opset in (10, 17) for case in _CLIPS if opset >= 11 or None not in case[:2]]


@ORT_PINNED
@pytest.mark.parametrize(("c_min", "c_max", "y_scale", "y_zero_point", "redundant", "opset"), _CLIP_CASES)
def test_clip_made_redundant_by_the_quantization(c_min, c_max, y_scale, y_zero_point, redundant, opset):
    """A Clip between the Conv and its QuantizeLinear fuses exactly where ORT's optimizer removes it (the
    bounds' codes past the type's range), and the output is ORT's bit for bit either way."""
    model = _clip_model(c_min, c_max, y_scale, y_zero_point, opset)
    assert ("QLinearConv" in fused_types(model)) == redundant
    assert ("QLinearConv" in ort_optimized_types(model)) == redundant
    if SATURATES:
        return
    x = {"x": np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32) * 3}
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(qo.InferenceSession(model).run(None, x)[0], reference.run(None, x)[0])
