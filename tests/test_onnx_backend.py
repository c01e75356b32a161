"""The 8 ONNX backend node tests for QLinearMatMul, run by onnx's own backend-test Runner against quantmatmul.

How the pieces fit (onnx 1.23.2):

* onnx's Runner does not read node tests from disk. ``load_model_tests(kind="node")`` ignores
  ``data_dir`` and returns the test cases that onnx's generator
  (``onnx.backend.test.case.node``) builds in memory: model plus inputs and expected outputs.
  The Runner then calls ``backend.prepare(model).run(inputs)`` and compares the results with
  ``Runner.assert_similar_outputs``, which checks length, shape and dtype exactly and values
  with ``assert_allclose``. We pass ``rtol=0, atol=0`` through the Runner's ``test_kwargs``,
  so onnx's own comparison is exact. The default tolerances (1e-3, 1e-7) would also be exact
  for 8-bit outputs.
* The wheel has no ``onnx/backend/test/data/node`` folder. The 8 folders are checked in under
  ``tests/data/onnx_node_tests``. ``test_checked_in_data_is_what_onnx_generates`` regenerates
  them into a temporary folder with onnx's generator and onnx's own writer,
  ``onnx.backend.test.cmd_tools.generate_data``, which is what ``backend-test-tools
  generate-data`` runs. The test then requires byte equality. This proves that the checked-in
  copies are the same data the Runner compares against. If a later onnx changes them, that test
  fails and names the file.
* ``test_checked_in_data_exact`` runs the checked-in ``.pb`` files, read with
  ``onnx.numpy_helper``, through the backend and compares exactly. It does not depend on the
  Runner.

Old expectations: onnx <= 1.21 expected wrapped int8 outputs, such as 20 for -236. onnx 1.22
still had the wrong 3D int8 b_zero_point of 114. onnx 1.23 saturates the outputs (#7868) and
uses b_zero_point -13 (#7991). We compare only against the 1.23 data, and
``test_expected_outputs_are_onnx_1_23s`` pins the saturated values.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner
from onnx_backend import BACKENDS, NUMERICS

DATA_DIR = Path(__file__).parent / "data" / "onnx_node_tests"
NAMES = tuple(f"test_qlinearmatmul_{rank}_{qtype}_{ftype}"
              for rank in ("2D", "3D") for qtype in ("uint8", "int8") for ftype in ("float32", "float16"))
INCLUDE = r"test_qlinearmatmul_.*"


class _QuietOnnxGenerator(warnings.catch_warnings):
    """Silence the RuntimeWarnings that onnx's node-test generator raises for other operators.

    Importing ``onnx.backend.test.case.node`` runs the generator for every operator; that is
    how onnx registers the cases. Some of those generators overflow or divide by zero on
    purpose in numpy: cast, castlike, reducemin/max, reduce_log_sum(_exp) and
    lpnormalization. pytest's ``filterwarnings = error`` would turn those warnings into
    exceptions in the middle of onnx's import. This ignores only RuntimeWarnings raised from
    onnx's node-case modules.
    """

    def __enter__(self):
        result = super().__enter__()
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnx\.backend\.test\.case\.node\.")
        return result


def _qlinearmatmul_testcases():
    """onnx's generator's test cases for QLinearMatMul, in memory (the Runner's own source)."""
    import onnx.backend.test.case.node as node_cases

    # Do not pass collect_testcases(op_type=...). It sets a module global filter, and
    # registration happens only once, at import. With the filter, every later Runner or
    # load_model_tests(kind="node") in this process would see only QLinearMatMul.
    with _QuietOnnxGenerator():
        cases = node_cases.collect_testcases()
    return [c for c in cases if c.name in NAMES
            and [(n.domain, n.op_type) for n in c.model.graph.node] == [("", "QLinearMatMul")]]


def _generate_with_onnx(out_dir: Path) -> Path:
    """Write the QLinearMatMul node tests as ``backend-test-tools generate-data`` writes test data.

    onnx 1.23's ``cmd_tools.generate_data`` serializes only ``onnx.backend.test.case.model.collect_testcases()``.
    Older releases also appended ``node_test.collect_testcases(args.op_type)``.
    We hand it the QLinearMatMul node cases in place of the model cases. onnx's own writer
    then produces ``node/<name>/model.onnx`` and ``test_data_set_0/{input,output}_*.pb``.
    """
    import onnx.backend.test.cmd_tools as cmd_tools

    cases = _qlinearmatmul_testcases()
    with mock.patch.object(cmd_tools.model_test, "collect_testcases", return_value=cases):
        cmd_tools.generate_data(argparse.Namespace(output=str(out_dir), op_type=None, diff=False))
    return out_dir / "node"


# --- onnx's Runner: one Runner and one exposed unittest.TestCase per numerics ----------------

# Per-test kwargs go to Runner.assert_similar_outputs (and to prepare, which ignores them).
_EXACT = {name: {"rtol": 0.0, "atol": 0.0} for name in NAMES}


def _runner_test_case(numerics: str):
    with _QuietOnnxGenerator():
        runner = Runner(BACKENDS[numerics], __name__, test_kwargs=_EXACT).include(INCLUDE)
        test_case = runner.test_cases["OnnxBackendNodeModelTest"]
    # runner.test_cases holds every onnx test, with the ones it will not run wrapped in
    # unittest.skip: not matching INCLUDE, or the CUDA copies, which supports_device rejects.
    # Drop those, so that pytest collects exactly the tests onnx runs rather than thousands of skips.
    for attr in [a for a in vars(test_case) if a.startswith("test_")]:
        if getattr(getattr(test_case, attr), "__unittest_skip__", False):
            delattr(test_case, attr)
    test_case.__name__ = test_case.__qualname__ = f"OnnxBackendNodeModelTest_{numerics.replace('-', '_')}"
    return test_case


RUNNER_TEST_CASES = {numerics: _runner_test_case(numerics) for numerics in NUMERICS}
# onnx's idiom is globals().update(runner.test_cases). We keep its NodeModel class, renamed
# per numerics so the three Runners do not collide.
globals().update({case.__name__: case for case in RUNNER_TEST_CASES.values()})


@pytest.mark.parametrize("numerics", NUMERICS)
def test_runner_selects_exactly_the_8_tests(numerics):
    # Guards against an empty or changed selection, for instance if onnx renames its tests or
    # stops generating them, or another module's collect_testcases(op_type=...) hid them.
    test_case = RUNNER_TEST_CASES[numerics]
    assert globals()[test_case.__name__] is test_case
    selected = sorted(a for a in vars(test_case) if a.startswith("test_"))
    assert selected == sorted(f"{name}_cpu" for name in NAMES)
    for attr in selected:
        func = getattr(test_case, attr)
        assert not getattr(func, "__unittest_skip__", False)
        assert not getattr(func, "__unittest_expecting_failure__", False)


# --- the checked-in data -----------------------------------------------------------------------

def _files(case_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(case_dir)) for p in case_dir.rglob("*") if p.is_file())


def _describe(path: Path) -> str:
    if path.name == "model.onnx":
        return str(onnx.load(path).graph)
    t = onnx.load_tensor(path)
    return f"{t.name}: {numpy_helper.to_array(t)!r}"


def test_checked_in_data_is_what_onnx_generates(tmp_path):
    generated = _generate_with_onnx(tmp_path)
    assert sorted(p.name for p in generated.iterdir()) == sorted(NAMES), \
        f"onnx {onnx.__version__}'s generator no longer yields exactly the 8 QLinearMatMul node tests"
    assert sorted(p.name for p in DATA_DIR.iterdir() if p.is_dir()) == sorted(NAMES)
    for name in NAMES:
        assert _files(generated / name) == _files(DATA_DIR / name), name
        for rel in _files(DATA_DIR / name):
            new, old = generated / name / rel, DATA_DIR / name / rel
            assert new.read_bytes() == old.read_bytes(), (
                f"{name}/{rel}: the checked-in copy (generated by onnx 1.23.2) differs from what "
                f"onnx {onnx.__version__}'s generator produces: onnx changed this test, or the copy was "
                f"altered.\n"
                f"generated: {_describe(new)}\nchecked in: {_describe(old)}")


def _load_checked_in(name: str):
    model = onnx.load(DATA_DIR / name / "model.onnx")
    data_set = DATA_DIR / name / "test_data_set_0"
    n_in, n_out = len(list(data_set.glob("input_*.pb"))), len(list(data_set.glob("output_*.pb")))
    assert (n_in, n_out) == (len(model.graph.input), len(model.graph.output)) == (8, 1)
    inputs = [numpy_helper.to_array(onnx.load_tensor(data_set / f"input_{i}.pb")) for i in range(n_in)]
    expected = numpy_helper.to_array(onnx.load_tensor(data_set / "output_0.pb"))
    return model, inputs, expected


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("name", NAMES)
def test_checked_in_data_exact(name, numerics):
    model, inputs, expected = _load_checked_in(name)
    (y,) = BACKENDS[numerics].run_model(model, inputs)
    assert (y.dtype, y.shape) == (expected.dtype, expected.shape)
    np.testing.assert_array_equal(y, expected, strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_expected_outputs_are_onnx_1_23s(name):
    # The onnx 1.23 expectations: the same 2x3 matrix for every test, the 3D tests tile it over
    # the batch, and the values saturate at 255 and -128. onnx <= 1.21 expected -236 wrapped to
    # 20, and its 3D int8 tests used b_zero_point 114 (values -86, 117, 120, ...).
    _, inputs, expected = _load_checked_in(name)
    want = [[168, 115, 255], [1, 66, 151]] if "uint8" in name else [[41, -12, -9], [1, -75, -128]]
    assert expected.dtype == (np.uint8 if "uint8" in name else np.int8)
    assert expected.shape == ((2, 3) if "2D" in name else (2, 2, 3))
    assert (expected.reshape(-1, 2, 3) == np.array(want)).all()
    if "int8" in name and "uint8" not in name:
        assert inputs[5].tolist() == [-13]  # b_zero_point, corrected by onnx #7991
