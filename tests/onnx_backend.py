"""A minimal onnx.backend.base.Backend that runs single-node QLinearMatMul models with quantmatmul (for onnx's backend-test Runner)."""

from __future__ import annotations

from typing import Any

import onnx
import onnx.backend.base
from onnx import numpy_helper

import quantmatmul

__all__ = ["NUMERICS", "BACKENDS", "QuantMatMulBackend", "QuantMatMulBackendRep"]

NUMERICS = ("onnxruntime", "onnx-reference", "exact")


class QuantMatMulBackendRep(onnx.backend.base.BackendRep):
    """A prepared single QLinearMatMul node."""

    def __init__(self, node: onnx.NodeProto, input_names: list[str], output_names: list[str],
                 initializers: dict[str, Any], numerics: str) -> None:
        self.node = node
        self.input_names = input_names  # what positional run() inputs are, in order
        self.output_names = output_names
        self.initializers = initializers
        self.numerics = numerics

    @classmethod
    def from_model(cls, model: onnx.ModelProto, numerics: str) -> QuantMatMulBackendRep:
        graph = model.graph
        initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        # Positional run() inputs are the graph inputs that no initializer provides, in graph order.
        input_names = [vi.name for vi in graph.input if vi.name not in initializers]
        return cls(graph.node[0], input_names, [vi.name for vi in graph.output], initializers, numerics)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise ValueError(f"expected {len(self.input_names)} inputs {self.input_names}, got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        values = {**self.initializers, **feeds}
        missing = [name for name in self.node.input if name not in values]
        if missing:
            raise ValueError(f"no value for the node inputs {missing}")
        y = quantmatmul.qlinear_matmul(*(values[name] for name in self.node.input), numerics=self.numerics)
        outputs = {self.node.output[0]: y}
        return onnx.backend.base.namedtupledict("Outputs", self.output_names)(
            *(outputs[name] for name in self.output_names))


class QuantMatMulBackend(onnx.backend.base.Backend):
    """Runs a model made of one ai.onnx QLinearMatMul node (opset 10 or 21) on the CPU.

    ``numerics`` selects quantmatmul's numerics mode; ``BACKENDS`` has one subclass per mode.
    Anything else raises NotImplementedError (never onnx's BackendIsNotSupposedToImplementIt,
    which the Runner would turn into a silent pass).
    """

    numerics = "onnxruntime"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return onnx.backend.base.Device(device).type == onnx.backend.base.DeviceType.CPU
        except (AttributeError, ValueError):
            return False

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:  # noqa: ARG003
        return cls._unsupported(model) is None and cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> QuantMatMulBackendRep:
        # kwargs: the Runner passes its per-test kwargs (such as rtol, atol) here too; they
        # concern its comparison, not this backend.
        super().prepare(model, device, **kwargs)  # onnx.checker.check_model
        if not cls.supports_device(device):
            raise NotImplementedError(f"{cls.__name__} runs on the CPU only, not on {device!r}")
        reason = cls._unsupported(model)
        if reason is not None:
            raise NotImplementedError(f"{cls.__name__}: {reason}")
        return QuantMatMulBackendRep.from_model(model, cls.numerics)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple[Any, ...]:
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        if node.op_type != "QLinearMatMul" or node.domain not in ("", "ai.onnx"):
            raise NotImplementedError(f"{cls.__name__} runs QLinearMatMul only, not {node.domain}::{node.op_type}")
        return QuantMatMulBackendRep(node, list(node.input), list(node.output), {}, cls.numerics).run(inputs)

    @staticmethod
    def _unsupported(model: onnx.ModelProto) -> str | None:
        graph = model.graph
        if len(graph.node) != 1:
            return f"only single-node models are supported, this graph has {len(graph.node)} nodes"
        node = graph.node[0]
        if node.op_type != "QLinearMatMul" or node.domain not in ("", "ai.onnx"):
            return f"only ai.onnx QLinearMatMul is supported, not {node.domain or 'ai.onnx'}::{node.op_type}"
        if len(node.input) != 8 or "" in node.input or len(node.output) != 1:
            return "QLinearMatMul needs 8 inputs and 1 output"
        if [vi.name for vi in graph.output] != list(node.output):
            return "the graph output must be the node's output"
        known = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
        if not set(node.input) <= known:
            return f"node inputs {sorted(set(node.input) - known)} are neither graph inputs nor initializers"
        return None


BACKENDS: dict[str, type[QuantMatMulBackend]] = {
    numerics: type(f"QuantMatMulBackend_{numerics.replace('-', '_')}", (QuantMatMulBackend,),
                   {"numerics": numerics, "__module__": __name__})
    for numerics in NUMERICS
}
