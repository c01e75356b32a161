"""ort_bits.py: what the tests of ONNX Runtime's QLinear* operators share: a bit-for-bit check naming the first difference, read-only copies of the inputs."""

from __future__ import annotations

import numpy as np
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
