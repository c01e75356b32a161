"""test_onnx_pairs.py: the session's QLinearMatMul -> QLinearAdd(bias) pairs run as one call (onnx/_pairs.py): the bits of the two nodes (quantmatmul's functions and ONNX Runtime's kernels), every table, which pairs form, and the calls that run the two nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from peer_deviations import pinned_only

import quantmatmul.onnx as qo
from quantmatmul import peers, qlinear_matmul
from quantmatmul.onnx._pairs import MatMulAdd
from quantmatmul.onnx._qlinear_ops import qlinear_add

ORT_PINNED = pinned_only("onnxruntime", "reproduces the kernels of")
MS = "com.microsoft"
ELEM = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


def pair_model(
    y_dtype, K, N, *, product_first=True, bias_shape=None, per_column=True, a_rank=3, seed=0, extra=(), a_dtype=np.uint8
):
    """a [batch, S, K] (or [M, K]; uint8 unless a_dtype) -> QLinearMatMul with a constant int8 b -> QLinearAdd with a
    constant bias row of y's type (bias_shape: [N] unless given) -> y."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(y_dtype)
    w = {
        "as": np.float32(0.031),
        "az": np.asarray(rng.integers(np.iinfo(a_dtype).min, np.iinfo(a_dtype).max + 1), a_dtype),
        "b": rng.integers(-128, 128, (K, N)).astype(np.int8),
        "bs": (rng.uniform(0.002, 0.02, N) if per_column else np.float32(0.01)).astype(np.float32),
        "bz": np.zeros(N, np.int8) if per_column else np.int8(0),
        "ys": np.float32(rng.uniform(0.05, 0.3)),
        "yz": np.asarray(rng.integers(info.min, info.max + 1), y_dtype),
        "bias": rng.integers(info.min, info.max + 1, bias_shape or (N,)).astype(y_dtype),
        "bias_s": np.float32(rng.uniform(0.01, 0.1)),
        "bias_z": np.asarray(rng.integers(info.min, info.max + 1), y_dtype),
        "cs": np.float32(rng.uniform(0.05, 0.4)),
        "cz": np.asarray(rng.integers(info.min, info.max + 1), y_dtype),
    }
    add_in = ["p", "ys", "yz", "bias", "bias_s", "bias_z"]
    if not product_first:
        add_in = add_in[3:] + add_in[:3]
    nodes = [
        helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["p"], name="mm"),
        helper.make_node("QLinearAdd", [*add_in, "cs", "cz"], ["y"], name="add", domain=MS),
        *extra,
    ]
    a_shape = ["batch", "S", K] if a_rank == 3 else ["M", K] if a_rank == 2 else [K]
    outputs = [helper.make_tensor_value_info("y", ELEM[np.dtype(y_dtype)], None)]
    outputs += [helper.make_tensor_value_info(n.output[0], ELEM[np.dtype(y_dtype)], None) for n in extra]
    graph = helper.make_graph(
        nodes,
        "pair",
        [helper.make_tensor_value_info("a", ELEM[np.dtype(a_dtype)], a_shape)],
        outputs,
        [numpy_helper.from_array(np.asarray(v), k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, w


def two_nodes(w, a, product_first=True):
    """The pair's output from quantmatmul's two functions, one after the other."""
    p = qlinear_matmul(a, w["as"], w["az"], w["b"], w["bs"], w["bz"], w["ys"], w["yz"])
    operands = [p, w["ys"], w["yz"], w["bias"], w["bias_s"], w["bias_z"]]
    if not product_first:
        operands = operands[3:] + operands[:3]
    return qlinear_add(*operands, w["cs"], w["cz"])


def pairs_in(session) -> int:
    return sum(isinstance(entry[0], MatMulAdd) for entry in session._plan)


@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
def test_the_pair_gives_the_two_nodes_bits(y_dtype, isa):
    """Both operand orders, per-column and per-tensor b, N off 32 and 16, a of rank 2 and 3 with row counts
    off 8, on each kernel level (the AVX-512 one fuses the epilogue, the others add the stage after theirs)."""
    for seed, (K, N, product_first, per_column, a_shape) in enumerate(
        [
            (64, 96, True, True, (3, 5, 64)),
            (20, 37, False, True, (13, 20)),
            (384, 48, True, False, (2, 9, 384)),
            (16, 200, False, False, (1, 1, 16)),
        ]
    ):
        model, w = pair_model(
            y_dtype, K, N, product_first=product_first, per_column=per_column, a_rank=len(a_shape), seed=seed
        )
        session = qo.InferenceSession(model)
        assert pairs_in(session) == 1
        a = np.random.default_rng(seed).integers(0, 256, a_shape).astype(np.uint8)
        got = session.run(None, {"a": a})[0]
        want = two_nodes(w, a, product_first)
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), (K, N)


@ORT_PINNED
@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
def test_the_pair_is_onnxruntimes(y_dtype):
    """(ONNX Runtime's QLinearMatMul takes uint8 a with a uint8 y, int8 a with an int8 y.)"""
    info = np.iinfo(y_dtype)
    for seed, product_first in enumerate([True, False]):
        model, _ = pair_model(y_dtype, 96, 130, product_first=product_first, seed=10 + seed, a_dtype=y_dtype)
        a = np.random.default_rng(seed).integers(info.min, info.max + 1, (4, 7, 96)).astype(y_dtype)
        got = qo.InferenceSession(model).run(None, {"a": a})[0]
        want = peers.session(model).run(None, {"a": a})[0]
        assert got.tobytes() == want.tobytes() and got.shape == want.shape


def test_leading_ones_of_the_bias_and_a_product_of_rank_one():
    """A bias [1, 1, N] adds a dimension to the output; an a of rank 1 (the fast product does not take
    it) runs the two nodes."""
    model, w = pair_model(np.uint8, 32, 40, bias_shape=(1, 1, 40), a_rank=2, seed=3)
    session = qo.InferenceSession(model)
    assert pairs_in(session) == 1
    a = np.random.default_rng(1).integers(0, 256, (6, 32)).astype(np.uint8)
    got = session.run(None, {"a": a})[0]
    want = two_nodes(w, a)
    assert got.shape == (1, 6, 40) and got.tobytes() == want.tobytes()
    model, w = pair_model(np.uint8, 32, 40, a_rank=1, seed=4)
    a = np.random.default_rng(2).integers(0, 256, 32).astype(np.uint8)
    got = qo.InferenceSession(model).run(None, {"a": a})[0]
    assert got.shape == (40,) and got.tobytes() == two_nodes(w, a).tobytes()


def test_what_does_not_pair():
    """Other numerics; the product read by another node too; a bias that is a column, not a row."""
    model, _ = pair_model(np.uint8, 32, 40, seed=5)
    assert pairs_in(qo.InferenceSession(model, numerics="exact")) == 0
    assert pairs_in(qo.InferenceSession(model, numerics="onnx-reference")) == 0
    also = helper.make_node("Identity", ["p"], ["p2"], name="also")
    model, w = pair_model(np.uint8, 32, 40, seed=6, extra=(also,))
    session = qo.InferenceSession(model)
    assert pairs_in(session) == 0
    a = np.random.default_rng(3).integers(0, 256, (2, 3, 32)).astype(np.uint8)
    assert session.run(["y"], {"a": a})[0].tobytes() == two_nodes(w, a).tobytes()
    model, w = pair_model(np.uint8, 32, 40, bias_shape=(5, 1), a_rank=2, seed=7)
    session = qo.InferenceSession(model)
    assert pairs_in(session) == 0
    a = np.random.default_rng(4).integers(0, 256, (5, 32)).astype(np.uint8)
    assert session.run(None, {"a": a})[0].tobytes() == two_nodes(w, a).tobytes()


def residual_model(x_dtype, C, M, kernel, *, product_first=True, seed=0, bias=True):
    """x [1, C, 9, 11] -> QLinearConv 1x1 (C -> M) -> r -> QLinearConv kernel x kernel (M -> M, same padding)
    -> p; y = QLinearAdd(p, r) (or (r, p)): a residual block's shape. Also a second output z =
    QLinearAdd(p2, x2) with x2 a graph input laid out in C order (the pair's other path)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(x_dtype)
    elem = ELEM[np.dtype(x_dtype)]

    def zp():
        return np.asarray(rng.integers(info.min // 2, info.max // 2 + 1), x_dtype)

    w = {
        "xs": np.float32(0.05), "xz": zp(),
        "w1": rng.integers(-127, 128, (M, C, 1, 1)).astype(np.int8), "w1s": np.full(M, 0.01, np.float32),
        "w1z": np.zeros(M, np.int8), "rs": np.float32(0.08), "rz": zp(),
        "w2": rng.integers(-127, 128, (M, M, kernel, kernel)).astype(np.int8),
        "w2s": rng.uniform(0.002, 0.01, M).astype(np.float32), "w2z": np.zeros(M, np.int8),
        "ps": np.float32(0.11), "pz": zp(), "cs": np.float32(0.13), "cz": zp(),
        "b1": rng.integers(-500, 500, M).astype(np.int32), "b2": rng.integers(-500, 500, M).astype(np.int32),
    }  # fmt: skip
    pad = kernel // 2
    conv2_in = ["r", "rs", "rz", "w2", "w2s", "w2z", "ps", "pz"] + (["b2"] if bias else [])
    first, second = (["p", "ps", "pz"], ["r", "rs", "rz"]) if product_first else (["r", "rs", "rz"], ["p", "ps", "pz"])
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "w1s", "w1z", "rs", "rz", "b1"], ["r"]),
        helper.make_node("QLinearConv", conv2_in, ["p"], pads=[pad] * 4),
        helper.make_node("QLinearAdd", [*first, *second, "cs", "cz"], ["y"], domain=MS),
        helper.make_node("QLinearConv", conv2_in, ["p2"], pads=[pad] * 4),
        helper.make_node("QLinearAdd", ["p2", "ps", "pz", "x2", "ps", "pz", "cs", "cz"], ["z"], domain=MS),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info(n, elem, s) for n, s in (("x", [1, C, 9, 11]), ("x2", [1, M, 9, 11]))],
        [helper.make_tensor_value_info(n, elem, None) for n in ("y", "z")],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def unpaired(model, monkeypatch):
    from quantmatmul.onnx import _session

    with monkeypatch.context() as m:
        m.setattr(_session, "matmul_adds", lambda entries, *_: entries)
        return qo.InferenceSession(model)


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_a_residual_add_after_a_convolution_gives_the_two_nodes_bits(x_dtype, isa, monkeypatch):
    """The add's other operand another convolution's output (channels-last: the add runs in the GEMM's
    output), 1x1 and 3x3 convolutions (the 3x3 read in place where the kernels can), both operand orders,
    with and without a bias; a second add whose other operand is a graph input in C order runs the two
    nodes. Each kernel level."""
    from quantmatmul.onnx import _pairs

    taken = []
    bound_call = _pairs.ConvAdd._bound_call
    monkeypatch.setattr(_pairs.ConvAdd, "_bound_call", lambda *a: taken.append(r := bound_call(*a)) or r, raising=True)
    info = np.iinfo(x_dtype)
    for seed, (C, M, kernel, product_first, bias) in enumerate(
        [(8, 16, 1, True, True), (12, 40, 3, False, True), (4, 24, 3, True, False), (16, 33, 1, False, False)]
    ):
        model = residual_model(x_dtype, C, M, kernel, product_first=product_first, seed=seed, bias=bias)
        session = qo.InferenceSession(model)
        assert sum(type(e[0]).__name__ == "ConvAdd" for e in session._plan) == 2
        rng = np.random.default_rng(seed)
        feed = {
            "x": rng.integers(info.min, info.max + 1, (1, C, 9, 11)).astype(x_dtype),
            "x2": rng.integers(info.min, info.max + 1, (1, M, 9, 11)).astype(x_dtype),
        }
        taken.clear()
        got = session.run(None, feed)
        assert [r is not None for r in taken] == [True, False]  # y in the GEMM, z by the two nodes
        want = unpaired(model, monkeypatch).run(None, feed)
        for g, w_ in zip(got, want, strict=True):
            assert g.dtype == w_.dtype and g.shape == w_.shape and g.tobytes() == w_.tobytes(), (C, M, kernel)


@ORT_PINNED
def test_a_residual_pair_is_onnxruntimes():
    model = residual_model(np.uint8, 12, 40, 3, product_first=False, seed=9)
    rng = np.random.default_rng(3)
    feed = {
        "x": rng.integers(0, 256, (1, 12, 9, 11)).astype(np.uint8),
        "x2": rng.integers(0, 256, (1, 40, 9, 11)).astype(np.uint8),
    }
    got = qo.InferenceSession(model).run(None, feed)
    want = peers.session(model).run(None, feed)
    for g, w_ in zip(got, want, strict=True):
        assert g.tobytes() == w_.tobytes() and g.shape == w_.shape


def test_bad_input_to_a_pair_is_the_nodes_error():
    """A pair's bad input (here a float a the model declares so) raises what the node would, naming it:
    the fast path's own error is not what the caller sees."""
    model, _ = pair_model(np.uint8, 32, 40, seed=8)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(TypeError, match="^InferenceSession.run: .*'mm'"):
        qo.InferenceSession(model).run(None, {"a": np.zeros((2, 3, 32), np.float32)})
    model = residual_model(np.uint8, 8, 16, 1, seed=1)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    feed = {"x": np.zeros((1, 8, 9, 11), np.float32), "x2": np.zeros((1, 16, 9, 11), np.uint8)}
    with pytest.raises(TypeError, match="^InferenceSession.run: .*x must be int8 or uint8"):
        qo.InferenceSession(model).run(None, feed)


def residual_after_bias_model(y_dtype, K, N, *, product_first=True, residual_first=False, seed=0):
    """pair_model's product and bias add, then a second QLinearAdd of that output and a graph input r of its
    shape (a transformer block's residual): out."""
    model, w = pair_model(y_dtype, K, N, product_first=product_first, seed=seed)
    rng = np.random.default_rng(100 + seed)
    info = np.iinfo(y_dtype)
    extra = {
        "rs": np.float32(rng.uniform(0.02, 0.2)),
        "rz": np.asarray(rng.integers(info.min, info.max + 1), y_dtype),
        "os": np.float32(rng.uniform(0.05, 0.4)),
        "oz": np.asarray(rng.integers(info.min, info.max + 1), y_dtype),
    }
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in extra.items())
    operands = [["y", "cs", "cz"], ["r", "rs", "rz"]]
    if residual_first:
        operands.reverse()
    model.graph.node.append(
        helper.make_node("QLinearAdd", [*operands[0], *operands[1], "os", "oz"], ["out"], domain=MS)
    )
    model.graph.input.append(helper.make_tensor_value_info("r", ELEM[np.dtype(y_dtype)], ["batch", "S", N]))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("out", ELEM[np.dtype(y_dtype)], None))
    return model


@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
def test_a_residual_after_the_bias_joins_the_pair(y_dtype, isa, monkeypatch):
    """QLinearMatMul -> QLinearAdd(bias) -> QLinearAdd(residual): one call with two stages where the residual
    is laid out as the product's rows; a transposed (not C-contiguous) residual runs its add as a node.
    Both operand orders of both adds; the nodes' bits on each kernel level."""
    from quantmatmul import qlinear

    stages = []
    product = qlinear._product_2d  # (the fast product's call, bound or not)
    monkeypatch.setattr(qlinear, "_product_2d", lambda *a: stages.append(len(a[-1])) or product(*a))
    info = np.iinfo(y_dtype)
    for seed, (K, N, product_first, residual_first) in enumerate(
        [(64, 96, True, False), (40, 37, False, True), (384, 130, True, True)]
    ):
        model = residual_after_bias_model(
            y_dtype, K, N, product_first=product_first, residual_first=residual_first, seed=seed
        )
        session = qo.InferenceSession(model)
        pairs = [e[0] for e in session._plan if isinstance(e[0], MatMulAdd)]
        assert len(pairs) == 1 and pairs[0].residual is not None
        plain = unpaired(model, monkeypatch)
        rng = np.random.default_rng(seed)
        a = rng.integers(0, 256, (2, 5, K)).astype(np.uint8)
        r = rng.integers(info.min, info.max + 1, (2, 5, N)).astype(y_dtype)
        for residual in (r, np.ascontiguousarray(r.transpose(1, 0, 2)).transpose(1, 0, 2)):
            stages.clear()
            got = session.run(None, {"a": a, "r": residual})[0]
            assert stages == [6 if residual.flags.c_contiguous else 3]
            want = plain.run(None, {"a": a, "r": residual})[0]
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), (K, N)


@ORT_PINNED
def test_a_residual_after_the_bias_is_onnxruntimes():
    model = residual_after_bias_model(np.uint8, 96, 70, product_first=False, residual_first=True, seed=4)
    rng = np.random.default_rng(5)
    feed = {
        "a": rng.integers(0, 256, (3, 4, 96)).astype(np.uint8),
        "r": rng.integers(0, 256, (3, 4, 70)).astype(np.uint8),
    }
    got = qo.InferenceSession(model).run(None, feed)[0]
    want = peers.session(model).run(None, feed)[0]
    assert got.tobytes() == want.tobytes() and got.shape == want.shape
