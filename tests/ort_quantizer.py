"""ort_quantizer.py: small float models made with onnx.helper, quantized by ONNX Runtime's quantize_static over random calibration batches: the QOperator / QDQ models the session's tests run."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def float_model(nodes, x_features: int, y_features: int, weights: dict, opset: int = 17) -> onnx.ModelProto:
    """nodes reading x [batch, x_features] and writing y [batch, y_features], with weights as initializers."""
    graph = helper.make_graph(
        nodes,
        "float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", x_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", y_features])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def quantize_static_model(model: onnx.ModelProto, tmp_path, *, seed: int = 0, **options) -> onnx.ModelProto:
    """model through onnxruntime.quantization.quantize_static (options: quant_format, activation_type, ...),
    calibrated on 4 random batches of x (a named batch dimension: 8); its advice on the root logger kept quiet."""
    from onnxruntime.quantization import quantize_static

    shape = [d.dim_value or 8 for d in model.graph.input[0].type.tensor_type.shape.dim]  # a named batch: 8
    rng = np.random.default_rng(seed)

    class Batches:
        def __init__(self):
            self.batches = iter([{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, src)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_static(src, dst, Batches(), **options)
    finally:
        root.setLevel(level)
    return onnx.load(dst)


def small_cnn(seed: int = 0, *, size: int = 16) -> onnx.ModelProto:
    """A ResNet-like float CNN on x [batch, 3, size, size]: a padded 3x3 Conv, Relu, MaxPool, a 3x3 Conv with
    Relu and a residual Add, a depthwise 3x3 Conv, Relu, GlobalAveragePool, Flatten and a Gemm to 10 logits."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.normal(size=shape) * 0.3).astype(np.float32)

    weights = {"w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(8, 8, 3, 3), "b2": w(8), "w3": w(8, 1, 3, 3), "b3": w(8)}
    weights |= {"fc": w(8, 10), "fcb": w(10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Add", ["r2", "p1"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=8, name="conv3"),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
