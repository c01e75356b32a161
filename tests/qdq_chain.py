"""qdq_chain.py: what the random QDQ chains of test_onnx_fuse and test_onnx_cnn share: the graph being built, its uint8 QuantizeLinear / DequantizeLinear steps, the finished model and a feed for it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Chain:
    """A float32 graph being built from a seeded generator: initializers (name -> array), nodes, inputs and
    uint8 outputs."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.inits: dict[str, np.ndarray] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def quantize(self, source: str, name: str, scale=None, zero=None) -> str:
        """QuantizeLinear of source to uint8 codes `name` (scale name_s, zero point name_z): random unless given."""
        self.inits[f"{name}_s"] = np.array(scale if scale is not None else self.rng.uniform(0.01, 0.2), np.float32)
        self.inits[f"{name}_z"] = np.array(zero if zero is not None else self.rng.integers(0, 256), np.uint8)
        self.nodes.append(helper.make_node("QuantizeLinear", [source, f"{name}_s", f"{name}_z"], [name]))
        return name

    def dequantize(self, codes: str) -> str:
        """DequantizeLinear of codes made by quantize, with their scale and zero point."""
        self.nodes.append(helper.make_node("DequantizeLinear", [codes, f"{codes}_s", f"{codes}_z"], [f"{codes}_dq"]))
        return f"{codes}_dq"

    def output(self, codes: str, shape) -> None:
        self.outputs.append(helper.make_tensor_value_info(codes, TensorProto.UINT8, list(shape)))

    def finish(self, name: str) -> tuple[onnx.ModelProto, dict]:
        """(the checked opset-17 model, a feed of normal values times 2 for every input)."""
        inits = [numpy_helper.from_array(v, k) for k, v in self.inits.items()]
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.checker.check_model(model)
        feed = {
            i.name: (self.rng.normal(size=[d.dim_value for d in i.type.tensor_type.shape.dim]) * 2).astype(np.float32)
            for i in self.inputs
        }
        return model, feed
