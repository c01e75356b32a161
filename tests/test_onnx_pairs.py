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
