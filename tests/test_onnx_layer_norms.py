"""test_onnx_layer_norms.py: the session's LayerNormalization with its neighbours as one call (onnx/_layer_norms.py, csrc layer_norm_staged): the nodes' bits for every head and tail, what fuses and what does not, and the calls the group leaves to its nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_onnx_bound import fused_entries, same_bits, session_without, taken
from test_onnx_tables import model

import quantmatmul.onnx as qo
from quantmatmul import _core
from quantmatmul.onnx import _layer_norms

F32, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
H = 48


def plain_session(m):
    return session_without(m, "layer_norm_groups")


def groups(session) -> dict:
    return fused_entries(session, _layer_norms.NormGroup)


def weights(codes=np.uint8, out=np.uint8):
    rng = np.random.default_rng(0)
    return {
        "gamma": rng.standard_normal(H).astype(np.float32),
        "beta": rng.standard_normal(H).astype(np.float32),
        "xs": np.float32(0.07),
        "xz": np.array(130 if codes == np.uint8 else -3, codes),
        "ys": np.float32(0.021),
        "yz": np.array(120 if out == np.uint8 else 4, out),
        "c": rng.standard_normal(H).astype(np.float32),
    }


def ln(x="x", y="n", **kw):
    return helper.make_node("LayerNormalization", [x, "gamma", "beta"], [y], name="ln", epsilon=1e-5, **kw)


def special(rng, shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:6] = [np.inf, np.nan, -0.0, 1e-40, 3e38, -3e38][: x.size]
    if x.ndim > 1:
        x[..., -1, :] = 5.0  # (a row of one value: variance 0)
    return x


@pytest.mark.parametrize(
    "head, tail, codes, out",
    [
        ("dequantize", "quantize", np.uint8, np.uint8),
        ("dequantize", "quantize", np.int8, np.int8),
        ("dequantize", None, np.uint8, None),
        (None, "quantize", None, np.int8),
        ("add", "dynamic", None, None),
        ("add", None, None, None),
        (None, "dynamic", None, None),
    ],
)
def test_the_group_gives_the_nodes_bits(head, tail, codes, out, isa):
    w = weights(codes or np.uint8, out or np.uint8)
    nodes, inputs, outputs = [], [], []
    if head == "dequantize":
        nodes.append(helper.make_node("DequantizeLinear", ["q", "xs", "xz"], ["x"], name="dq"))
        inputs.append(("q", U8 if codes == np.uint8 else I8, None))
    elif head == "add":
        nodes.append(helper.make_node("Add", ["a", "r"], ["x"], name="add"))
        inputs += [("a", F32, None), ("r", F32, None)]
    else:
        inputs.append(("x", F32, None))
    nodes.append(ln())
    if tail == "quantize":
        nodes.append(helper.make_node("QuantizeLinear", ["n", "ys", "yz"], ["y"], name="q"))
        outputs.append(("y", U8 if out == np.uint8 else I8, None))
    elif tail == "dynamic":
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["n"], ["yq", "ys_", "yz_"], name="dql"))
        nodes.append(helper.make_node("Mul", ["n", "c"], ["again"], name="again"))  # (n read on: the next residual)
        outputs += [("yq", U8, None), ("ys_", F32, None), ("yz_", U8, None), ("again", F32, None)]
    else:
        outputs.append(("n", F32, None))
    m = model(nodes, inputs, outputs, w)
    session, plain = qo.InferenceSession(m), plain_session(m)
    names = {"dequantize": "DequantizeLinear", "add": "Add", "quantize": "QuantizeLinear", "dynamic": ""}
    want_ops = [names[head]] if head else []
    want_ops += ["LayerNormalization"] + (
        [("DynamicQuantizeLinear" if tail == "dynamic" else names[tail])] if tail else []
    )
    assert groups(session) == {"ln": "+".join(want_ops)}
    calls = taken(session)
    rng = np.random.default_rng(1)
    for shape in [(2, 7, H), (1, 1, H), (3, 33, H), (H,)]:
        feed = {}
        for name, _, _ in inputs:
            feed[name] = special(rng, shape, codes if name == "q" else np.float32)
        before = {k: v.copy() for k, v in feed.items()}
        calls.clear()
        with np.errstate(all="ignore"):
            got, want = session.run(None, feed), plain.run(None, feed)
        for g, v in zip(got, want, strict=True):
            same_bits(g, v)
        assert all(np.array_equal(feed[k], before[k], equal_nan=True) for k in feed)
        assert calls["ln"] == [True]  # (the group took it: not the nodes)


def test_what_fuses_and_what_does_not():
    w = weights()
    x = [("x", F32, None)]
    # Mean wanted; an Add of a constant (a bias, not a residual); Y read twice before a QuantizeLinear
    mean = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n", "mu"], name="ln")
    q = helper.make_node("QuantizeLinear", ["n", "ys", "yz"], ["y"], name="q")
    assert groups(qo.InferenceSession(model([mean, q], x, [("y", U8, None), ("mu", F32, None)], w))) == {}
    bias = [helper.make_node("Add", ["x", "c"], ["s"], name="add"), ln("s")]
    assert groups(qo.InferenceSession(model(bias, x, [("n", F32, None)], w))) == {}
    twice = [ln(), q, helper.make_node("Neg", ["n"], ["z"], name="neg")]
    assert groups(qo.InferenceSession(model(twice, x, [("y", U8, None), ("z", F32, None)], w))) == {}
    # a QuantizeLinear per axis (its scale per column) is not a tail; a DequantizeLinear without a zero point
    # is a head for either 8-bit type
    w_axis = dict(w, ys=np.full(H, 0.02, np.float32), yz=np.full(H, 7, np.uint8))
    per_axis = [ln(), helper.make_node("QuantizeLinear", ["n", "ys", "yz"], ["y"], name="q", axis=-1)]
    assert groups(qo.InferenceSession(model(per_axis, x, [("y", U8, None)], w_axis))) == {}
    no_zp = [helper.make_node("DequantizeLinear", ["q", "xs"], ["x"], name="dq"), ln()]
    for t, dtype, took in [(I8, np.int8, True), (U8, np.uint8, True), (TensorProto.INT16, np.int16, False)]:
        m = model(no_zp, [("q", t, None)], [("n", F32, None)], w)
        session, plain = qo.InferenceSession(m), plain_session(m)
        assert groups(session) == {"ln": "DequantizeLinear+LayerNormalization"}
        calls = taken(session)
        codes = special(np.random.default_rng(2), (3, H), dtype)
        same_bits(session.run(None, {"q": codes})[0], plain.run(None, {"q": codes})[0])
        assert calls["ln"] == [took]  # (16-bit codes: the nodes)


def test_calls_the_group_does_not_take_run_the_nodes():
    """A residual that broadcasts, a strided x, another type and a LayerNormalization shape the weights do not
    fit: the nodes' bits or their errors."""
    w = weights()
    nodes = [helper.make_node("Add", ["a", "r"], ["x"], name="add"), ln()]
    m = model(nodes, [("a", F32, None), ("r", F32, None)], [("n", F32, None)], w)
    session, plain = qo.InferenceSession(m), plain_session(m)
    calls = taken(session)
    rng = np.random.default_rng(3)
    cases = [
        (special(rng, (4, H)), special(rng, (H,))),  # the residual broadcast
        (special(rng, (H, 4)).T, special(rng, (4, H))),  # a strided x
        (special(rng, (4, H)).astype(np.float64), special(rng, (4, H)).astype(np.float64)),
    ]
    for a, r in cases:
        calls.clear()
        with np.errstate(all="ignore"):
            try:
                want = plain.run(None, {"a": a, "r": r})
            except Exception as error:  # noqa: BLE001 (the same error from both)
                with pytest.raises(type(error)):
                    session.run(None, {"a": a, "r": r})
                continue
            got = session.run(None, {"a": a, "r": r})
        same_bits(got[0], want[0])
        assert calls["ln"] == [False]
    bad = np.ones((2, H + 1), np.float32)
    with pytest.raises(Exception) as raised:
        plain.run(None, {"a": bad, "r": bad})
    with pytest.raises(type(raised.value)):
        session.run(None, {"a": bad, "r": bad})


def test_the_staged_call_checks_its_arguments():
    x = np.ones((2, H), np.float32)
    g = np.ones(H, np.float32)
    for args in [
        (x.astype(np.float64), None, -1),
        (x, np.ones((2, H + 1), np.float32), -1),
        (x.astype(np.uint8), None, 0),  # (int8 declared)
        (x.astype(np.uint8), x, 1),  # (codes with a residual)
        (np.ones((2, H + 1), np.float32), None, -1),  # (not whole rows)
    ]:
        with pytest.raises(ValueError, match="^layer_norm_staged"):
            _core.layer_norm_staged(*args, 0.1, 0, g, None, 1e-5, -1, 0.1, 0)
    with pytest.raises(ValueError, match="out_type"):
        _core.layer_norm_staged(x, None, -1, 0.1, 0, g, None, 1e-5, 3, 0.1, 0)
