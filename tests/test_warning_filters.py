"""test_warning_filters.py: pyproject's filterwarnings: warnings from quantmatmul and the tests are errors, deprecations inside the third-party code the suite drives are not."""

from __future__ import annotations

import warnings

import pytest

NUMPY_2_5 = "Setting the shape on a NumPy array has been deprecated in NumPy 2.5"


def warn_from(module: str, category: type[Warning], message: str = "a warning") -> list[str]:
    """Warns as code running in `module` does (stacklevel 1 there: numpy's C-level deprecations name the
    Python line that triggered them), under the suite's filters; returns the messages shown."""
    code = compile("warnings.warn(message, category)", f"<{module}>", "exec")
    with warnings.catch_warnings(record=True) as shown:  # keeps the filters, records what is shown
        exec(code, {"__name__": module, "warnings": warnings, "message": message, "category": category})
    return [str(w.message) for w in shown]


@pytest.mark.parametrize(
    "module",
    [
        "onnx.backend.test.case.node.reshape",
        "onnx",
        "numpy._core.fromnumeric",
        "hypothesis.strategies._internal.core",
        "onnxruntime.capi.onnxruntime_inference_collection",
    ],
)
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_third_party_deprecations_are_shown_not_raised(module, category):
    # e.g. numpy 2.5 deprecating `a.shape = ...` inside onnx's backend test cases, at collection
    assert warn_from(module, category, NUMPY_2_5) == [NUMPY_2_5]


@pytest.mark.parametrize(
    "module", ["quantmatmul.qlinear", "quantmatmul", "test_quantize_linear", "onnx_backend", "conftest", "onnxfoo"]
)
@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning, RuntimeWarning, UserWarning])
def test_our_warnings_are_errors(module, category):
    with pytest.raises(category):
        warn_from(module, category)


def test_other_third_party_warnings_are_errors():
    with pytest.raises(RuntimeWarning):
        warn_from("numpy._core._methods", RuntimeWarning, "overflow encountered")
