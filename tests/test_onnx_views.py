"""test_onnx_views.py: the session's chains of view nodes (onnx/_views.py: bound Reshape and Transpose in a row, an attention's split and merged heads) against the nodes one by one: values, shapes, what chains, and the calls the chain leaves to its nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_onnx_bound import fused_entries, session_without, taken
from test_onnx_tables import model

import quantmatmul.onnx as qo
from quantmatmul.onnx import _views

F32 = TensorProto.FLOAT


def plain_session(m):
    return session_without(m, "view_chains")


def chains(session) -> dict:
    return fused_entries(session, _views.ViewChain)


def heads_model():
    """x [B, S, 24] split into 4 heads of 6 (Reshape -> Transpose), each head negated (not a view), merged back
    (Transpose -> Reshape), and a Transpose without perm after a Reshape with -1."""
    w = {
        "split": np.array([0, 0, 4, 6], np.int64),
        "merge": np.array([0, 0, 24], np.int64),
        "flat": np.array([-1, 6], np.int64),
    }
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["xh"], name="split"),
        helper.make_node("Transpose", ["xh"], ["xt"], perm=[0, 2, 1, 3], name="heads"),
        helper.make_node("Neg", ["xt"], ["n"], name="neg"),
        helper.make_node("Transpose", ["n"], ["nt"], perm=[0, 2, 1, 3], name="back"),
        helper.make_node("Reshape", ["nt", "merge"], ["y"], name="merge"),
        helper.make_node("Reshape", ["x", "flat"], ["f"], name="flat"),
        helper.make_node("Transpose", ["f"], ["z"], name="reverse"),
    ]
    outputs = [("y", F32, None), ("z", F32, None), ("xt", F32, None)]  # (xt: the heads as they are split)
    return model(nodes, [("x", F32, ["B", "S", 24])], outputs, w)


def test_view_chains_are_their_nodes():
    m = heads_model()
    session, plain = qo.InferenceSession(m), plain_session(m)
    assert chains(session) == {"split": "Reshape+Transpose", "back": "Transpose+Reshape", "flat": "Reshape+Transpose"}
    calls = taken(session)
    rng = np.random.default_rng(0)
    for shape in [(2, 5, 24), (1, 1, 24), (3, 16, 24)]:
        x = rng.standard_normal(shape).astype(np.float32)
        calls.clear()
        got, want = session.run(None, {"x": x}), plain.run(None, {"x": x})
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype and g.tobytes() == w.tobytes()
        assert all(took == [True] for name, took in calls.items() if name in chains(session))
    with pytest.raises(Exception) as raised:  # (a shape the split does not take: the nodes' own error)
        plain.run(None, {"x": np.ones((2, 5, 25), np.float32)})
    with pytest.raises(type(raised.value)):
        session.run(None, {"x": np.ones((2, 5, 25), np.float32)})


def test_what_does_not_chain():
    """A Reshape whose shape is fed (not bound), a view read twice, a graph output in the middle."""
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"], name="fed"),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0], name="t"),
    ]
    m = model(nodes, [("x", F32, None), ("s", TensorProto.INT64, None)], [("y", F32, None)], {})
    session = qo.InferenceSession(m)
    assert chains(session) == {}
    x = np.arange(6, dtype=np.float32)
    assert session.run(None, {"x": x, "s": np.array([2, 3], np.int64)})[0].tobytes() == x.reshape(2, 3).T.tobytes()
    w = {"s": np.array([2, 3], np.int64)}
    twice = [
        helper.make_node("Reshape", ["x", "s"], ["r"], name="r"),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0], name="t"),
        helper.make_node("Neg", ["r"], ["z"], name="neg"),
    ]
    assert chains(qo.InferenceSession(model(twice, [("x", F32, None)], [("y", F32, None), ("z", F32, None)], w))) == {}
    out = model(twice[:2], [("x", F32, None)], [("y", F32, None), ("r", F32, None)], w)
    assert chains(qo.InferenceSession(out)) == {}
