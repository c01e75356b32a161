"""quantmatmul.onnx: whole ONNX models: quantize their weights for MatMulNBits, run them on quantmatmul's kernels, compare them node by node with ONNX Runtime.

Three entry points (docs/onnx.md):

* ``quantize(model, *, bits=4, block_size=128, method="mse", ...)``: every MatMul / Gemm with a
  constant float weight becomes a ``com.microsoft`` MatMulNBits node, in the form ONNX Runtime's
  ``MatMulNBitsQuantizer`` writes (byte for byte with ``method="rtn"``).
* ``InferenceSession(model, *, numerics="onnxruntime", fuse_qdq=True, tabulate=True)``: ``.run(output_names,
  input_feed)`` as in onnxruntime, on ``onnx.reference.ReferenceEvaluator`` with quantmatmul's
  QLinearMatMul, MatMulNBits, QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and
  MatMulInteger, QLinearConv, ConvInteger and com.microsoft QGemm, QLinearAdd, QLinearMul, QLinearSoftmax; a QDQ
  model's DequantizeLinear -> MatMul / Gemm / Conv -> QuantizeLinear groups run as QLinearMatMul / QGemm /
  QLinearConv, as ONNX Runtime's optimizer runs them.
* ``compare(model, input_feed=None, *, numerics="exact")``: runs the model once in ONNX Runtime
  and checks every quantized node's output against quantmatmul's: a ``CompareReport``.

The single operators ONNX Runtime's quantizers write around them are functions here too:
``qlinear_conv`` and ``conv_integer`` (ONNX QLinearConv / ConvInteger; docs/onnx.md).

Needs the ``onnx`` package (``pip install onnx``); ``compare`` also needs ``onnxruntime``.
"""

from __future__ import annotations

try:
    import onnx as _onnx  # noqa: F401  (the top-level onnx package, not this one)
except ImportError as error:  # pragma: no cover - exercised only where onnx is missing
    raise ImportError(
        "quantmatmul.onnx needs the onnx package: pip install onnx (or pip install 'quantmatmul[peers]', "
        "which also brings onnxruntime for compare())"
    ) from error

from ._compare import CompareReport, compare
from ._qconv import conv_integer, qlinear_conv
from ._quantize import quantize
from ._session import InferenceSession, NodeArg

__all__ = ["quantize", "InferenceSession", "NodeArg", "compare", "CompareReport", "qlinear_conv", "conv_integer"]
