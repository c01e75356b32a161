"""test_onnx_float_chains.py: the session's chains of float element-wise nodes (onnx/_float_chains.py, csrc float_chain) and its bound Softmax (csrc softmax_*_rows around np.exp): onnx.reference's bits, what chains and what does not, and the calls the fused forms leave to the nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_onnx_bound import fused_entries, same_bits, session_without, taken
from test_onnx_tables import model

import quantmatmul.onnx as qo
from quantmatmul import _core
from quantmatmul.onnx import _float_chains, _session

F32 = TensorProto.FLOAT
ADD, SUB, MUL, DIV, ERF, SQRT, NEG = range(7)
V = -1  # the chain's value


def plain_session(m):
    """The session with no float chains and the Softmax unbound: the nodes one by one."""
    return session_without(m, "float_chains", unbound=(_session._AxisSoftmax,))


def chains(session) -> dict:
    return fused_entries(session, _float_chains.FloatChain)


def same_but_nan_signs(got, want):
    """same_bits, except that a NaN matches any NaN: numpy's max returns a row's NaN as it is from its scalar loop
    and the default NaN from its vector one (rows past 16 values on AVX-512), and the Softmax rows keep the row's
    (docs/onnx.md)."""
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert got[~nan].tobytes() == want[~nan].tobytes()


def special(rng, shape, scale=3.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1)
    values = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-42, -3e-39, 3e38, -1e30, 5.0, -4.0]
    flat[: min(flat.size, len(values))] = values[: flat.size]
    return x


def bert_layer(S=None, hidden=32, heads=4, ffn=64):
    """A BERT encoder layer's float operators as quantize_dynamic leaves them around its products (here float
    MatMuls): the attention's scaling, mask add and Softmax, and the erf-GELU."""
    rng = np.random.default_rng(0)
    d = hidden // heads
    w = {
        "wq": rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.2,
        "wk": rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.2,
        "w1": rng.standard_normal((hidden, ffn)).astype(np.float32) * 0.2,
        "split": np.array([0, 0, heads, d], np.int64),
        "sqrt_d": np.array(np.sqrt(d), np.float32),
        "sqrt2": np.array(1.4142135, np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [  # (the mask's bias as a graph input: a model's is shared by its layers)
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="mq"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="mk"),
        helper.make_node("Reshape", ["q", "split"], ["qh"], name="rq"),
        helper.make_node("Reshape", ["k", "split"], ["kh"], name="rk"),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3], name="tq"),
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1], name="tk"),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="scores"),
        helper.make_node("Div", ["scores", "sqrt_d"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "bias"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="m1"),
        helper.make_node("Div", ["h", "sqrt2"], ["g_div"], name="gelu_div"),
        helper.make_node("Erf", ["g_div"], ["g_erf"], name="gelu_erf"),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"], name="gelu_add"),
        helper.make_node("Mul", ["h", "g_add"], ["g_mul"], name="gelu_mul"),
        helper.make_node("Mul", ["g_mul", "half"], ["gelu"], name="gelu_half"),
    ]
    inputs = [("x", F32, ["batch", S, hidden]), ("bias", F32, ["batch", 1, 1, S])]
    return model(nodes, inputs, [("probs", F32, None), ("gelu", F32, None)], w)


def test_a_bert_layers_float_operators_chained_give_the_nodes_bits(isa):
    m = bert_layer()
    session, plain = qo.InferenceSession(m), plain_session(m)
    assert chains(session) == {"scale": "Div+Add", "gelu_div": "Div+Erf+Add+Mul+Mul"}
    calls = taken(session)
    rng = np.random.default_rng(1)
    for batch, S in [(2, 7), (1, 1), (3, 16), (1, 40)]:
        x = special(rng, (batch, S, 32))
        bias = np.where(rng.random((batch, 1, 1, S)) < 0.8, 0, -3.4028235e38).astype(np.float32)
        before = x.copy()
        calls.clear()
        got, want = session.run(None, {"x": x, "bias": bias}), plain.run(None, {"x": x, "bias": bias})
        for g, w in zip(got, want, strict=True):
            same_bits(g, w)
        assert np.array_equal(x, before, equal_nan=True)
        # none fell back (the float MatMuls too: onnx.reference's numpy function)
        names = ("rq", "rk", "scale", "softmax", "gelu_div", "mq", "mk", "scores", "m1")
        assert calls == {n: [True] for n in names}
    # and onnx.reference itself, as the session's unfused nodes are checked against it elsewhere
    ref = ReferenceEvaluator(m)
    feed = {"x": special(rng, (2, 5, 32)), "bias": np.zeros((2, 1, 1, 5), np.float32)}
    with np.errstate(all="ignore"):
        for g, w in zip(session.run(None, feed), ref.run(None, feed), strict=True):
            same_bits(g, w)


def chain_model(nodes, outputs=("y",), inputs=("x",), t=F32, weights=None):
    return model(nodes, [(n, t, None) for n in inputs], [(n, t, None) for n in outputs], weights or {})


def test_what_chains_and_what_does_not():
    c = {"c": np.array(2.0, np.float32)}
    links = [
        helper.make_node("Add", ["x", "c"], ["a"], name="a"),
        helper.make_node("Sqrt", ["a"], ["b"], name="b"),
        helper.make_node("Neg", ["b"], ["y"], name="c"),
    ]
    assert chains(qo.InferenceSession(chain_model(links, weights=c))) == {"a": "Add+Sqrt+Neg"}
    # a value read twice ends the chain before its readers; so does a graph output
    twice = links + [helper.make_node("Mul", ["b", "b"], ["z"], name="d")]
    assert chains(qo.InferenceSession(chain_model(twice, ("y", "z"), weights=c))) == {"a": "Add+Sqrt"}
    out = chain_model(links, ("y", "b"), weights=c)
    assert chains(qo.InferenceSession(out)) == {"a": "Add+Sqrt"}
    # another operator (Relu) between links; a lone node
    cut = [links[0], helper.make_node("Relu", ["a"], ["r"], name="r"), helper.make_node("Sqrt", ["r"], ["y"], name="s")]
    assert chains(qo.InferenceSession(chain_model(cut, weights=c))) == {}
    # a node reading the value before it twice (Mul(v, v)), and an operand made between the links
    square = [
        links[0],
        helper.make_node("Abs", ["x"], ["m"], name="abs"),
        helper.make_node("Mul", ["a", "a"], ["sq"], name="sq"),
        helper.make_node("Sub", ["m", "sq"], ["y"], name="sub"),
    ]
    session, plain = qo.InferenceSession(chain_model(square, weights=c)), plain_session(chain_model(square, weights=c))
    assert chains(session) == {"a": "Add+Mul+Sub"}
    x = special(np.random.default_rng(2), (3, 5))
    same_bits(session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_other_types_run_the_nodes(dtype):
    """A chain of another type than float32 runs its nodes (int32 Div truncates): their values and types."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = {"c": np.array([3, -2, 5], dtype), "z": np.array(7, dtype)}
    nodes = [
        helper.make_node("Mul", ["x", "c"], ["a"], name="mul"),
        helper.make_node("Div", ["a", "z"], ["b"], name="div"),
        helper.make_node("Sub", ["b", "x"], ["y"], name="sub"),
    ]
    m = chain_model(nodes, t=t, weights=w)
    session, plain = qo.InferenceSession(m), plain_session(m)
    assert chains(session) == {"mul": "Mul+Div+Sub"}
    calls = taken(session)
    x = (np.arange(12).reshape(4, 3) - 5).astype(dtype)
    with np.errstate(all="ignore"):
        same_bits(session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
    assert calls == {"mul": [False]}


def test_broadcasting_strides_and_errors():
    nodes = [
        helper.make_node("Transpose", ["u"], ["ut"], perm=[1, 0], name="t"),  # a strided operand
        helper.make_node("Sub", ["x", "ut"], ["a"], name="sub"),
        helper.make_node("Div", ["a", "w"], ["y"], name="div"),
    ]
    m = chain_model(nodes, inputs=("x", "u", "w"))
    session, plain = qo.InferenceSession(m), plain_session(m)
    assert chains(session) == {"sub": "Sub+Div"}
    rng = np.random.default_rng(3)
    cases = [
        ((4, 5), (5, 4), (1,)),
        ((2, 1, 5), (5, 3), (2, 1, 1)),  # the output grows to [2, 3, 5]
        ((5,), (5, 1), (1, 1, 1, 1)),
        ((), (1, 1), ()),
        ((0, 5), (5, 1), (1,)),
        ((3, 300), (300, 3), (3, 1)),
        ((1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2), (1, 1), (2,)),  # past the C++ rank: the nodes
    ]
    for xs, us, ws in cases:
        feed = {"x": special(rng, xs), "u": special(rng, us), "w": special(rng, ws)}
        with np.errstate(all="ignore"):
            same_bits(session.run(None, feed)[0], plain.run(None, feed)[0])
    bad = {"x": np.ones((3, 4), np.float32), "u": np.ones((5, 3), np.float32), "w": np.ones(1, np.float32)}
    with pytest.raises(ValueError) as got:
        session.run(None, bad)
    with pytest.raises(ValueError) as want:
        plain.run(None, bad)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("path", _core.erf_paths())
def test_the_chains_operations_are_numpys(path):
    rng = np.random.default_rng(4)
    x = special(rng, (3, 1000))
    y = special(rng, (1000,), 10.0)
    s = np.array(-1.5, np.float32)
    erf = np.empty_like(x)
    assert _core.erf(x.reshape(-1), erf.reshape(-1), path)
    with np.errstate(all="ignore"):
        cases = {
            ((ADD, 0, 1),): x + y,
            ((SUB, 1, 0),): y - x,
            ((MUL, 0, 2),): x * s,
            ((DIV, 2, 0),): s / x,
            ((ERF, 0, 0), (ADD, V, 2)): erf + s,
            ((SQRT, 0, 0), (NEG, V, V)): -np.sqrt(x),
            ((DIV, 0, 1), (SUB, V, V), (ADD, 0, V)): x + (x / y - x / y),
        }
        for steps, want in cases.items():
            same_bits(_core.float_chain([x, y, s], np.array(steps, np.int32), path), want)


def test_the_chains_steps_are_checked():
    x = np.ones(3, np.float32)
    for steps in ([(ADD, V, 0)], [(ADD, 0, 1)], [(7, 0, 0)], [(ERF, -2, 0)], []):
        with pytest.raises(ValueError, match="float_chain"):
            _core.float_chain([x], np.array(steps, np.int32).reshape(-1, 3))
    with pytest.raises(ValueError, match="float32"):
        _core.float_chain([x.astype(np.float64)], np.array([[NEG, 0, 0]], np.int32))


def softmax_model(opset, axis=None):
    kw = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="sm", **kw)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F32, None)], [helper.make_tensor_value_info("y", F32, None)]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize(("opset", "axis"), [(13, None), (13, -1), (13, 2), (11, None), (11, -1), (11, 2), (13, 1)])
def test_the_bound_softmax_is_the_nodes(opset, axis):
    """Over the last axis, C-contiguous float32: the bound rows; any other axis or a strided x: the node."""
    m = softmax_model(opset, axis)
    session, plain = qo.InferenceSession(m), plain_session(m)
    calls = taken(session)
    rng = np.random.default_rng(5)
    last = axis in (-1, 2) or (axis is None and opset >= 13)
    for shape in [(2, 3, 17), (1, 1, 1), (4, 2, 300), (1, 2, 9000)]:
        x = special(rng, shape, 20.0)
        x[1 % shape[0], -1, :] = -np.inf
        calls.clear()
        same_but_nan_signs(session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
        assert calls == {"sm": [last]}
    strided = special(rng, (3, 4, 10)).transpose(0, 2, 1)
    same_bits(session.run(None, {"x": strided})[0], plain.run(None, {"x": strided})[0])


def test_softmax_rows_match_numpy_on_every_length():
    rng = np.random.default_rng(6)
    for cols in [*range(1, 140), 255, 256, 257, 1000, 1031, 4096, 8193, 20000]:
        x = (rng.standard_normal((3, cols)) * 8).astype(np.float32)
        x[1, 0] = -0.0
        x[2, cols // 2] = np.nan if cols % 2 else -np.float32(np.nan)
        with np.errstate(all="ignore"):
            tmp = x - x.max(axis=-1, keepdims=1)
            want = np.exp(tmp)
            want /= want.sum(axis=-1, keepdims=1)
        y = np.empty_like(x)
        _core.softmax_shift_rows(x, y)
        same_but_nan_signs(y, tmp)
        same_bits(y[:2], tmp[:2])
        with np.errstate(all="ignore"):
            np.exp(y, out=y)
        _core.softmax_normalize_rows(y)
        same_but_nan_signs(y, want)
        same_bits(y[:2], want[:2])


def test_the_chain_reads_any_strides():
    """Reversed, stepped, transposed and broadcast (stride 0, read-only) operands, as numpy reads them."""
    x = special(np.random.default_rng(7), (4, 6))
    two = np.array(2, np.float32)
    for a in [x[::-1], x[:, ::-2], np.broadcast_to(np.float32(3), (4, 6)), x.T[::-1], x[None, :, None, :]]:
        b = x[1, : a.shape[-1]]
        with np.errstate(all="ignore"):
            same_bits(_core.float_chain([a, two, b], np.array([[DIV, 0, 1], [SUB, V, 2]], np.int32)), a / two - b)


def test_random_chains_are_their_nodes():
    """Random chains (2 to 6 links of every operator, the value on either side, operands of random broadcast
    shapes: scalars, rows, columns, a new leading dimension, the full shape) against the nodes one by one."""
    rng = np.random.default_rng(8)
    ops = ["Add", "Sub", "Mul", "Div", "Erf", "Sqrt", "Neg"]
    for case in range(40):
        shape = tuple(int(d) for d in rng.integers(1, 7, rng.integers(1, 4)))
        shapes = [(), (1,), shape[-1:], shape, (2, *shape), shape[:-1] + (1,)]
        nodes, inputs, feed, value = [], [("x", F32, None)], {"x": special(rng, shape)}, "x"
        for link in range(int(rng.integers(2, 7))):
            op = ops[int(rng.integers(len(ops)))]
            out = f"v{link}"
            if op in ("Erf", "Sqrt", "Neg"):
                nodes.append(helper.make_node(op, [value], [out], name=f"n{link}"))
            else:
                operand = f"o{link}"
                operand_shape = shapes[int(rng.integers(len(shapes)))]
                inputs.append((operand, F32, None))
                feed[operand] = special(rng, operand_shape, 2.0) if operand_shape else np.array(1.5, np.float32)
                pair = [value, operand] if rng.integers(2) else [operand, value]
                nodes.append(helper.make_node(op, pair, [out], name=f"n{link}"))
            value = out
        m = model(nodes, inputs, [(value, F32, None)], {})
        session, plain = qo.InferenceSession(m), plain_session(m)
        assert list(chains(session)) == ["n0"], case
        with np.errstate(all="ignore"):
            got, want = session.run(None, feed)[0], plain.run(None, feed)[0]
        # (two NaNs of different signs meeting in one addition or product: x86 returns one operand's, and
        # which, the compiled loop's operand order decides, numpy's as ours: the sign may differ there)
        same_but_nan_signs(got, want)
