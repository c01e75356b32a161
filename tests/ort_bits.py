"""ort_bits.py: what the tests against ONNX Runtime share: a bit-for-bit check naming the first difference, read-only copies of the inputs, the graph ORT optimizes a model into."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest


def same_bits(got, expected, label: str) -> None:
    """got is ORT's output bit for bit (dtype and shape too); else a failure naming the first difference."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, (label, got.dtype, got.shape, expected.shape)
    if got.tobytes() != expected.tobytes():
        where = tuple(np.argwhere(got != expected)[0])
        pytest.fail(
            f"{label}: {int((got != expected).sum())} of {got.size} differ, at {where}: "
            f"{got[where]} vs ORT {expected[where]}"
        )


def frozen(*arrays):
    """Read-only copies (None stays None): a function writing into its inputs fails on them."""
    out = []
    for a in arrays:
        if a is not None:
            a = np.array(a)
            a.flags.writeable = False
        out.append(a)
    return out


def optimized_session(model: onnx.ModelProto):
    """(ONNX Runtime's CPU session of model, the op types of the graph it optimized the model into)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session, [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
