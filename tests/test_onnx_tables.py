"""test_onnx_tables.py: the session's element-wise groups on one 8-bit tensor run as lookup tables (onnx/_tables.py): the same bits as the nodes run one by one, which groups form, and the paths that run the nodes instead."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantmatmul.onnx as qo
from quantmatmul.onnx import _tables

MS = "com.microsoft"
U8, I8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def model(nodes, inputs, outputs, weights):
    graph = helper.make_graph(
        nodes,
        "tables",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def gelu_model(dtype=np.uint8, shape=("batch", 16, 96), extra_output=False):
    """quantize_static's QOperator erf-GELU on the codes x (all-MiniLM-L6-v2's form), then a QLinearMatMul
    that reads its output."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = np.asarray(3 if dtype == np.uint8 else -5, dtype)
    weights = {
        "xs": np.float32(0.061),
        "xz": zero,
        "sqrt2": np.float32(1.4142135),
        "es": np.float32(1 / 127.0),
        "ez": zero,
        "one": np.asarray(1 if dtype == np.uint8 else 100, dtype),
        "one_s": np.float32(1 / 100.0),
        "one_z": np.asarray(0, dtype),
        "as": np.float32(2 / 250.0),
        "az": zero,
        "ms": np.float32(0.05),
        "mz": zero,
        "half": np.asarray(128 if dtype == np.uint8 else 64, dtype),
        "half_s": np.float32(1 / 256.0),
        "half_z": np.asarray(0, dtype),
        "gs": np.float32(0.021),
        "gz": zero,
        "w": np.random.default_rng(3).integers(-127, 128, (96, 8)).astype(np.int8),
        "ws": np.float32(0.01),
        "wz": np.int8(0),
        "ys": np.float32(0.7),
        "yz": zero,
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["f"], name="dq"),
        helper.make_node("Div", ["f", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("QuantizeLinear", ["e", "es", "ez"], ["eq"], name="q"),
        helper.make_node(
            "QLinearAdd", ["eq", "es", "ez", "one", "one_s", "one_z", "as", "az"], ["aq"], name="add", domain=MS
        ),
        helper.make_node("QLinearMul", ["x", "xs", "xz", "aq", "as", "az", "ms", "mz"], ["mq"], name="mul", domain=MS),
        helper.make_node(
            "QLinearMul", ["mq", "ms", "mz", "half", "half_s", "half_z", "gs", "gz"], ["g"], name="mul2", domain=MS
        ),
        helper.make_node("QLinearMatMul", ["g", "gs", "gz", "w", "ws", "wz", "ys", "yz"], ["y"], name="mm"),
    ]
    outputs = [("y", t, list(shape[:-1]) + [8])]
    if extra_output:  # a value inside the group read outside it: a second output of the group
        outputs.append(("e", F32, list(shape)))
    return model(nodes, [("x", t, list(shape))], outputs, weights)


def codes(dtype, shape, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.fixture
def lookups(monkeypatch):
    """The number of table lookups the session made (csrc lookup_codes calls)."""
    calls = []
    lookup = _tables._core.lookup_codes
    monkeypatch.setattr(_tables._core, "lookup_codes", lambda *a: calls.append(a[1].dtype) or lookup(*a))
    return calls


@pytest.mark.parametrize("numerics", ["onnxruntime", "exact", "onnx-reference"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_the_gelu_group_is_one_table_with_the_nodes_bits(dtype, numerics, lookups):
    m = gelu_model(dtype)
    tables = qo.InferenceSession(m, numerics=numerics)
    plain = qo.InferenceSession(m, numerics=numerics, tabulate=False)
    assert tables.tabulated == [["dq", "div", "erf", "q", "add", "mul", "mul2"]] and plain.tabulated == []
    for shape in [(4, 16, 96), (1, 16, 96), (7, 16, 96)]:
        x = codes(dtype, shape, seed=shape[0])
        x[0, 0, :] = np.arange(96) + np.iinfo(dtype).min  # codes from the bottom of the range
        x[-1, -1, :] = np.iinfo(dtype).max - np.arange(96)  # and the top
        before = x.copy()
        got, want = tables.run(None, {"x": x}), plain.run(None, {"x": x})
        assert got[0].tobytes() == want[0].tobytes() and got[0].shape == want[0].shape
        assert np.array_equal(x, before)
    assert lookups == [np.dtype(dtype)] * 3


def test_a_value_read_outside_the_group_is_an_output_too(lookups):
    m = gelu_model(np.uint8, extra_output=True)
    tables, plain = qo.InferenceSession(m), qo.InferenceSession(m, tabulate=False)
    x = codes(np.uint8, (3, 16, 96))
    got, want = tables.run(None, {"x": x}), plain.run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
    assert sorted(map(str, lookups)) == ["float32", "uint8"]  # the float Erf values and the GELU's codes


def test_broadcasting_constants_and_types():
    """A constant of higher rank adds leading dimensions; outputs of each element size (bool, int16, float32,
    float64; a value read by a node between the group's nodes (ReduceSum: the group's output too, made where
    the group's first node was)."""
    weights = {
        "s": np.float32(0.5),
        "z": np.uint8(7),
        "c4": np.full((1, 1, 1, 1), 3.0, np.float32),
        "lim": np.float64(9.5),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"], name="dq"),
        helper.make_node("Mul", ["f", "c4"], ["wide"], name="mul"),  # [1, batch, n] -> [1, 1, batch, n]
        helper.make_node("ReduceSum", ["f"], ["total"], name="outside", keepdims=0),  # f: an output too
        helper.make_node("Relu", ["x"], ["other"], name="relu"),  # x's codes themselves
        helper.make_node("Cast", ["f"], ["f64"], name="cast", to=TensorProto.DOUBLE),
        helper.make_node("Less", ["f64", "lim"], ["small"], name="less"),
        helper.make_node("Cast", ["f"], ["i16"], name="cast16", to=TensorProto.INT16),
        helper.make_node("Sqrt", ["f64"], ["root"], name="sqrt"),
    ]
    outputs = [
        ("wide", F32, [1, 1, 5, 33]),
        ("total", F32, []),
        ("other", U8, [1, 5, 33]),
        ("small", TensorProto.BOOL, [1, 5, 33]),
        ("i16", TensorProto.INT16, [1, 5, 33]),
        ("root", TensorProto.DOUBLE, [1, 5, 33]),
    ]
    m = model(nodes, [("x", U8, [1, 5, 33])], outputs, weights)
    tables, plain = qo.InferenceSession(m), qo.InferenceSession(m, tabulate=False)
    assert tables.tabulated == [["dq", "mul", "relu", "cast", "less", "cast16", "sqrt"]]
    x = codes(np.uint8, (1, 5, 33))
    for g, w in zip(tables.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


def test_what_does_not_form_a_group():
    """Per-channel parameters, a node that is not element-wise in the middle, a single node, an x that is
    not read as codes, an initializer a feed may override."""
    weights = {"s": np.float32(0.5), "z": np.uint8(7), "sc": np.full(4, 0.5, np.float32), "zc": np.full(4, 7, np.uint8)}
    weights["two"] = np.float32(2)
    per_channel = [
        helper.make_node("DequantizeLinear", ["x", "sc", "zc"], ["f"], axis=1),
        helper.make_node("Mul", ["f", "two"], ["y"]),
    ]
    softmax = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
        helper.make_node("Softmax", ["f"], ["g"]),
        helper.make_node("Mul", ["g", "two"], ["y"]),
    ]
    single = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])]
    float_x = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])]
    x = codes(np.uint8, (3, 4))
    for nodes, x_type, feed in [(per_channel, U8, x), (softmax, U8, x), (single, U8, x), (float_x, F32, x * 1.0)]:
        m = model(nodes, [("x", x_type, [3, 4])], [("y", F32, [3, 4])], weights)
        session = qo.InferenceSession(m)
        assert session.tabulated == []
        feed = {"x": feed.astype(np.float32) if x_type == F32 else feed}
        assert (
            session.run(None, feed)[0].tobytes() == qo.InferenceSession(m, tabulate=False).run(None, feed)[0].tobytes()
        )
    # "two" also a graph input (a feed may replace it): not a constant
    m = model(
        softmax[:1] + [helper.make_node("Mul", ["f", "two"], ["y"])],
        [("x", U8, [3, 4]), ("two", F32, [])],
        [("y", F32, [3, 4])],
        weights,
    )
    assert qo.InferenceSession(m).tabulated == []


def test_other_code_types_and_ranks_run_the_nodes(lookups):
    """int32 codes (DequantizeLinear reads them too) and a 0-d x run the group's nodes: the same results."""
    weights = {"s": np.float32(0.25), "z": np.int32(-3), "two": np.float32(2)}
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"], name="dq"),
        helper.make_node("Mul", ["f", "two"], ["y"], name="mul"),
    ]
    m = model(nodes, [("x", TensorProto.INT32, None)], [("y", F32, None)], weights)
    session = qo.InferenceSession(m)
    assert session.tabulated == [["dq", "mul"]]
    for x in (np.arange(-40, 40, dtype=np.int32).reshape(8, 10), np.array(5, np.int32)):
        y = session.run(None, {"x": x})[0]
        assert y.shape == x.shape and np.array_equal(y, (x.astype(np.float32) + 3) * np.float32(0.25) * 2)
    assert lookups == []


def test_tabulate_is_a_flag():
    with pytest.raises(TypeError, match="^InferenceSession: tabulate must be True or False, got str"):
        qo.InferenceSession(gelu_model(), tabulate="yes")


def test_cli_run_tabulates_unless_told_not_to(tmp_path, capsys):
    import onnx

    import quantmatmul.cli as cli

    m = gelu_model(np.uint8)
    path, x_path = tmp_path / "gelu.onnx", tmp_path / "x.npy"
    onnx.save(m, path)
    x = codes(np.uint8, (2, 16, 96))
    np.save(x_path, x)
    want = qo.InferenceSession(m, tabulate=False).run(None, {"x": x})[0]
    for flags, note in (([], "1 element-wise group as lookup tables"), (["--no-tabulate"], None)):
        out_dir = tmp_path / ("out" + "".join(flags))
        assert cli.main(["run", str(path), "--input", f"x={x_path}", "--output-dir", str(out_dir), *flags]) == 0
        text = capsys.readouterr().out
        assert (note in text) if note else ("lookup" not in text)
        assert np.load(out_dir / "y.npy").tobytes() == want.tobytes()


def test_lookup_paths_give_the_table_s_entries():
    # Every path of the byte tables (scalar, AVX-512 VBMI natively and over SIMDe) against numpy's
    # indexing: lengths around a vector of 64 and across tasks, codes at both ends, in place (out is the
    # codes), and a path off this CPU refused; wider entries take the scalar loop whatever the path.
    from quantmatmul import _core

    paths = _core.lookup_paths()
    assert paths[0] == "scalar" and set(paths) <= {"scalar", "avx512vbmi", "avx512vbmi-emulated"}
    rng = np.random.default_rng(5)
    table = rng.permutation(256).astype(np.uint8)
    for path in paths:
        for n in (0, 1, 13, 63, 64, 65, 127, 128, 129, 1000, 262144 + 77, 600000):
            x = rng.integers(0, 256, n, dtype=np.uint8)
            x[: min(n, 2)] = [0, 255][: min(n, 2)]
            out = np.full(n, 7, np.uint8)
            assert _core.lookup_codes(x, table, out, path)
            assert np.array_equal(out, table[x]), (path, n)
            want, before = table[x], x.copy()
            assert _core.lookup_codes(x, table, x, path)  # in place
            assert np.array_equal(x, want), (path, n)
            wide = np.arange(256, dtype=np.float32) * 1.5
            got = np.empty(n, np.float32)
            assert _core.lookup_codes(before, wide, got, path)
            assert np.array_equal(got, wide[before])
    assert not _core.lookup_codes(np.zeros(3, np.uint8), table, np.empty(3, np.uint8), "no such path")
    if "avx512vbmi" not in paths:
        assert not _core.lookup_codes(np.zeros(3, np.uint8), table, np.empty(3, np.uint8), "avx512vbmi")


def test_lookup_path_follows_the_kernel_level():
    import quantmatmul
    from quantmatmul import _core

    before = quantmatmul.cpu_info()["isa"]
    try:
        quantmatmul.set_isa("avx2" if "avx2" in quantmatmul.cpu_info()["available_isas"] else "portable")
        assert _core.lookup_path() == "scalar"
        quantmatmul.set_isa(quantmatmul.cpu_info()["best_isa"])
        assert _core.lookup_path() == ("avx512vbmi" if "avx512vbmi" in _core.lookup_paths() else "scalar")
    finally:
        quantmatmul.set_isa(before)
