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
