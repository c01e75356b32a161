"""quantmatmul: exact and fast quantized matrix multiplication (ONNX QLinearMatMul, ONNX Runtime MatMulNBits, Orion)."""

from __future__ import annotations

from . import orion
from .qlinear import qlinear_matmul
from .quantize_linear import dequantize_linear, quantize_linear

__version__ = "0.1.0"

__all__ = ["qlinear_matmul", "quantize_linear", "dequantize_linear", "orion", "__version__"]
