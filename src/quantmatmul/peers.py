"""peers.py: run QLinearMatMul in the peers (onnxruntime, onnx.reference) on the same inputs, for tests, the demo and benchmarks.

onnx and onnxruntime are optional (the "peers" and "test" extras); importing this module needs them.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

INPUTS = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]

_sessions: dict = {}


def qlinear_model(args, opset=21, b_constant=False) -> onnx.ModelProto:
    """A single-node QLinearMatMul model; with b_constant, b and its parameters are initializers (ORT prepacks them)."""
    node = helper.make_node("QLinearMatMul", INPUTS, ["y"])
    inputs, inits = [], []
    for name, x in zip(INPUTS, args):
        x = np.asarray(x)
        if b_constant and name.startswith("b"):
            inits.append(numpy_helper.from_array(x, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    y_type = helper.np_dtype_to_tensor_dtype(np.asarray(args[7]).dtype)
    graph = helper.make_graph([node], "qlinearmatmul", inputs, [helper.make_tensor_value_info("y", y_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def session(model: onnx.ModelProto, *, threads: int = 1, spinning: bool = True) -> ort.InferenceSession:
    """A CPU session for model. spinning=False keeps ORT's idle threads from spinning after a run, so
    that interleaved benchmarks do not lose cores to them (docs/benchmarks.md)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_onnxruntime(*args, opset=21, b_constant=False) -> np.ndarray:
    sess = session(qlinear_model(args, opset, b_constant))
    feeds = {n: np.asarray(x) for n, x in zip(INPUTS, args) if not (b_constant and n.startswith("b"))}
    return sess.run(None, feeds)[0]


def run_onnx_reference(*args, opset=21) -> np.ndarray:
    model = qlinear_model(args, opset)
    return ReferenceEvaluator(model).run(None, dict(zip(INPUTS, (np.asarray(x) for x in args))))[0]


@functools.cache
def onnxruntime_u8s8_saturates() -> bool:
    """True on CPUs where ORT's u8 x s8 kernel saturates pair sums to int16 (AVX2 without VNNI; onnxruntime#16105)."""
    a = np.array([[255, 255]], np.uint8)
    b = np.array([[-128], [-128]], np.int8)
    one = np.float32(1)
    y = run_onnxruntime(a, one, np.uint8(0), b, one, np.int8(0), np.float32(1024), np.uint8(128))
    return int(y.item()) == 96  # -32768 / 1024 = -32 (exact: -63.75 -> -64, giving 64)


def matmul_nbits_model(A_dtype, B, scales, zero_points=None, g_idx=None, bias=None, **attributes) -> onnx.ModelProto:
    """A single com.microsoft MatMulNBits node with B and the other tensors as constant initializers."""
    names = ["A", "B", "scales", "zero_points", "g_idx", "bias"]
    values = dict(zip(names, (None, B, scales, zero_points, g_idx, bias)))
    used = [n if n == "A" or values[n] is not None else "" for n in names]
    while used[-1] == "":
        used.pop()
    attributes = {k: v for k, v in attributes.items() if not (k == "accuracy_level" and v == 0)}
    node = helper.make_node("MatMulNBits", used, ["Y"], domain="com.microsoft", **attributes)
    inits = [numpy_helper.from_array(np.asarray(values[n]), n) for n in names[1:] if values[n] is not None]
    t = helper.np_dtype_to_tensor_dtype(np.dtype(A_dtype))
    graph = helper.make_graph([node], "matmulnbits", [helper.make_tensor_value_info("A", t, None)],
                              [helper.make_tensor_value_info("Y", t, None)], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def run_matmul_nbits_onnxruntime(A, B, scales, zero_points=None, g_idx=None, bias=None, *, threads=1, **attributes):
    """ONNX Runtime's MatMulNBits on A, the weight given as constant initializers (as real models do)."""
    model = matmul_nbits_model(np.asarray(A).dtype, B, scales, zero_points, g_idx, bias, **attributes)
    return session(model, threads=threads).run(None, {"A": np.asarray(A)})[0]
