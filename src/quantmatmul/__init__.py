"""quantmatmul: exact and fast quantized matrix multiplication (ONNX QLinearMatMul, ONNX Runtime MatMulNBits, Orion)."""

from __future__ import annotations

from . import orion
from ._runtime import available_isas, cpu_info, emulated_isas, get_num_threads, set_isa, set_num_threads
from .matmul_nbits import MatMulNBits, dequantize_nbits, matmul_nbits
from .nbits_layout import pack_nbits, unpack_nbits
from .qlinear import QLinearMatMul, qlinear_matmul
from .quantize_linear import dequantize_linear, quantize_linear
from .quantize_nbits import NBitsWeight, quantize_nbits

__version__ = "0.1.0"


def __getattr__(name):
    # quantmatmul.onnx (whole models: quantize, InferenceSession, compare) needs the onnx package, so it is
    # imported on first use rather than with quantmatmul
    if name == "onnx":
        import importlib

        return importlib.import_module(".onnx", __name__)
    raise AttributeError(f"module 'quantmatmul' has no attribute {name!r}")


__all__ = [
    "qlinear_matmul",
    "QLinearMatMul",
    "quantize_linear",
    "dequantize_linear",
    "orion",
    "matmul_nbits",
    "MatMulNBits",
    "dequantize_nbits",
    "quantize_nbits",
    "NBitsWeight",
    "pack_nbits",
    "unpack_nbits",
    "cpu_info",
    "available_isas",
    "emulated_isas",
    "set_isa",
    "get_num_threads",
    "set_num_threads",
    "__version__",
]
