"""test_onnx_bound.py: the session's nodes bound to the inputs they read on every run (their parameters checked once: _Op._bind, QLinearMatMul._bind) and the nodes folded into constants (_fold): the same bits as the unbound calls, and the calls a bound node does not take run the general path."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from peer_deviations import pinned_only
from test_onnx_tables import model

import quantmatmul as qm
import quantmatmul.onnx as qo
from quantmatmul import peers, qlinear
from quantmatmul.onnx import _qlinear_ops, _qlinear_pool, _session
from quantmatmul.quantize_linear import _bind_dequantize, _bind_quantize, dequantize_linear, quantize_linear

ORT_PINNED = pinned_only("onnxruntime", "reproduces the kernels of")

MS = "com.microsoft"
U8, I8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT
BOUND = (
    _session._QLinearMatMul,
    _session._QuantizeLinear,
    _session._DequantizeLinear,
    _session._LayerNormalization,
    _session._QLinearSoftmax,
    _session._Reshape,
    _session._Flatten,
    _session._QLinearGlobalAveragePool,
    _session._QLinearConv,
    _session._AxisSoftmax,
)


def attention_model(N=48, heads=4):
    """An attention-like block of quantize_static's operators, every parameter an initializer: x (float) ->
    LayerNormalization (its weights given as DequantizeLinear of int8 codes, as a QDQ model has them) ->
    QuantizeLinear -> QLinearMatMul (constant b) -> two per-head views -> QLinearMatMul of the two (both
    operands per call) -> QLinearSoftmax -> DequantizeLinear -> y."""
    rng = np.random.default_rng(0)
    d = N // heads
    w = {
        "g_q": rng.integers(-127, 128, N).astype(np.int8),
        "g_s": np.float32(0.01),
        "g_z": np.int8(0),
        "b_q": rng.integers(-127, 128, N).astype(np.int8),
        "b_s": np.float32(0.004),
        "b_z": np.int8(0),
        "xs": np.float32(0.03),
        "xz": np.uint8(120),
        "w": rng.integers(-127, 128, (N, N)).astype(np.int8),
        "ws": np.float32(0.012),
        "wz": np.int8(0),
        "ps": np.float32(0.2),
        "pz": np.uint8(128),
        "shape": np.array([0, 0, heads, d], np.int64),
        "ss": np.float32(0.5),
        "sz": np.uint8(100),
        "ys": np.float32(1 / 256),
        "yz": np.uint8(0),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["g_q", "g_s", "g_z"], ["gamma"], name="dq_gamma"),
        helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["beta"], name="dq_beta"),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="ln", epsilon=1e-5),
        helper.make_node("QuantizeLinear", ["n", "xs", "xz"], ["nq"], name="q"),
        helper.make_node("QLinearMatMul", ["nq", "xs", "xz", "w", "ws", "wz", "ps", "pz"], ["p"], name="mm"),
        helper.make_node("Reshape", ["p", "shape"], ["ph"], name="heads"),
        helper.make_node("Transpose", ["ph"], ["pt"], perm=[0, 2, 1, 3], name="t"),
        helper.make_node("Transpose", ["ph"], ["pk"], perm=[0, 2, 3, 1], name="tk"),
        helper.make_node("QLinearMatMul", ["pt", "ps", "pz", "pk", "ps", "pz", "ss", "sz"], ["s"], name="scores"),
        helper.make_node("QLinearSoftmax", ["s", "ss", "sz", "ys", "yz"], ["sm"], name="softmax", domain=MS, opset=13),
        helper.make_node("DequantizeLinear", ["sm", "ys", "yz"], ["y"], name="dq_y"),
    ]
    return model(nodes, [("x", F32, ["batch", "S", N])], [("y", F32, None)], w)


@pytest.fixture
def unbound(monkeypatch):
    """Sessions made inside run every node unbound (the general calls), fold nothing and chain no float nodes."""

    def make(m):
        with monkeypatch.context() as patch:
            for cls in BOUND:
                patch.setattr(cls, "_bind", lambda self: None)
            patch.setattr(qlinear.QLinearMatMul, "_bind", lambda self, *a: None)
            patch.setattr(_session, "_fold", lambda entries, *_: entries)
            patch.setattr(_session, "_NUMPY_BINARY", {})
            patch.setattr(_session, "float_chains", lambda entries, *_: entries)
            patch.setattr(_session, "layer_norm_groups", lambda entries, *_: entries)
            return qo.InferenceSession(m)

    return make


def session_without(m, *fusions, unbound=()):
    """A session of m without the plan's fusions named (functions of onnx/_session.py, as identities) and with
    the classes in unbound left unbound: the nodes one by one, to compare a fused session with."""
    with pytest.MonkeyPatch.context() as patch:
        for name in fusions:
            patch.setattr(_session, name, lambda entries, *_: entries)
        for cls in unbound:
            patch.setattr(cls, "_bind", lambda self: None)
        return qo.InferenceSession(m)


def fused_entries(session, cls) -> dict:
    """{the first node's name: the entry's operators} for the session's plan entries of class cls."""
    return {e[0].onnx_node.name: e[0].op_type for e in session._plan if isinstance(e[0], cls)}


def same_bits(got, want):
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def bound_nodes(session) -> dict:
    """{node name: whether the plan calls it bound} for the plan's nodes of BOUND's operators."""
    return {entry[0].onnx_node.name: entry[5] is not None for entry in session._plan if isinstance(entry[0], BOUND)}


def taken(session) -> dict:
    """Spies on the session's bound calls: {node name: [whether each call took its inputs]}."""
    record = {}

    def spy(name, call):
        def run(inputs):
            outputs = call(inputs)
            record.setdefault(name, []).append(outputs is not None)
            return outputs

        return run

    session._plan = [e[:5] + ((spy(e[0].onnx_node.name, e[5]) if e[5] else None),) for e in session._plan]
    return record


def test_bound_nodes_and_folded_constants_give_the_unbound_bits(isa, unbound):
    """Each node bound on its own (the LayerNormalization with its QuantizeLinear as one call:
    test_onnx_layer_norms.py)."""
    m = attention_model()
    session = session_without(m, "layer_norm_groups")
    plain = unbound(m)
    calls = taken(session)
    assert sorted(session._folded) == ["beta", "gamma"] and plain._folded == {}
    assert bound_nodes(session) == {n: True for n in ("ln", "q", "mm", "heads", "scores", "softmax", "dq_y")}
    assert not any(bound_nodes(plain).values()) and "dq_gamma" in bound_nodes(plain)
    rng = np.random.default_rng(1)
    for shape in [(2, 7, 48), (1, 1, 48), (3, 16, 48)]:
        x = (rng.standard_normal(shape) * 2).astype(np.float32)
        x[0, 0, :5] = [np.inf, -np.inf, np.nan, 1e30, -0.0]
        before = x.copy()
        calls.clear()
        got, want = session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert np.array_equal(x, before, equal_nan=True)
        assert calls == {n: [True] for n in ("ln", "q", "mm", "heads", "scores", "softmax", "dq_y")}  # none fell back


@ORT_PINNED
def test_the_bound_block_is_onnxruntimes():
    m = attention_model()
    x = (np.random.default_rng(2).standard_normal((2, 9, 48)) * 2).astype(np.float32)
    got = qo.InferenceSession(m).run(None, {"x": x})[0]
    want = peers.session(m).run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()


def test_bound_quantize_and_dequantize_are_the_functions():
    rng = np.random.default_rng(3)
    x = np.concatenate([(rng.standard_normal(999) * 300).astype(np.float32), [np.nan, np.inf, -np.inf, -0.0]])
    x = x.astype(np.float32).reshape(1, 3, -1) if x.size % 3 == 0 else x.astype(np.float32)
    for scale, zero_point in [
        (np.float32(0.7), np.uint8(3)),
        (np.array([0.02], np.float32), np.array([-4], np.int8)),
        (np.float32(0.5), None),
        (np.float32(3.0), np.uint16(1000)),
        (np.float32(3.0), np.int16(-7)),
    ]:
        quantize = _bind_quantize(scale, zero_point, axis=1, block_size=0, saturate=True)
        q = quantize(x)
        want = quantize_linear(x, scale, zero_point)
        assert q.dtype == want.dtype and q.tobytes() == want.tobytes()
        dequantize = _bind_dequantize(scale, zero_point, axis=1, block_size=0)
        d = dequantize(q)
        assert d.tobytes() == dequantize_linear(q, scale, zero_point).tobytes()
        other = np.int8 if q.dtype != np.int8 else np.uint8
        assert (dequantize(q.view(other)) is None) == (zero_point is not None)
        assert dequantize(list(q.reshape(-1))) is None
    # what the per-tensor call never takes: a per-axis scale, a blocked one, a float8 or int4 zero point
    per_axis = np.array([0.1, 0.2, 0.3], np.float32)
    assert _bind_quantize(per_axis, np.zeros(3, np.uint8), axis=1, block_size=0, saturate=True) is None
    assert _bind_quantize(np.float32(1), np.uint8(0), axis=1, block_size=2, saturate=True) is None
    assert _bind_dequantize(np.float32(1), np.zeros((), ml_dtypes.float8_e4m3fn), axis=1, block_size=0) is None
    assert _bind_dequantize(np.float32(0), np.uint8(0), axis=1, block_size=0) is None  # (a zero scale)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_bound_global_average_pool_is_the_function(dtype):
    """The session's QLinearGlobalAveragePool with fixed parameters: the function's bits in both layouts (a
    channels-last view, as the convolutions pass, and the attribute), None for what it does not take."""
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    parameters = (
        np.float32(0.07),
        np.array(3, dtype),
        np.float32(0.02),
        np.array(-5 if dtype == np.int8 else 9, dtype),
    )
    for channels_last in (0, 1):
        pool = _qlinear_pool.bind_global_average_pool(*parameters, channels_last=channels_last)
        for shape in [(1, 7, 7, 40), (2, 3, 5, 1), (1, 1, 1, 1), (3, 9, 33), (1, 0, 4, 2)]:
            X = rng.integers(info.min, info.max + 1, shape).astype(dtype)
            if not channels_last:  # NCHW order over channels-last memory
                X = np.moveaxis(X, -1, 1)
            want = _qlinear_pool.qlinear_global_average_pool(X, *parameters, channels_last=channels_last)
            got = pool(X)
            assert got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes(), shape
        other = np.int8 if dtype == np.uint8 else np.uint8
        assert pool(X.view(other)) is None and pool(np.zeros((2, 3), dtype)) is None and pool([[[1]]]) is None
    assert _qlinear_pool.bind_global_average_pool(np.float32(1), None, np.float32(1), None) is None
    assert _qlinear_pool.bind_global_average_pool(np.float32(np.inf), parameters[1], *parameters[2:]) is None
    assert _qlinear_pool.bind_global_average_pool(*parameters, channels_last=2) is None


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (11, 1), (11, -1), (1, 0)])
def test_bound_softmax_is_the_function(opset, axis):
    rng = np.random.default_rng(opset + axis)
    parameters = (np.float32(0.08), np.uint8(3), np.float32(1 / 256), np.uint8(0))
    softmax = _qlinear_ops.bind_softmax(*parameters, axis=axis, opset=opset)
    for shape in [(2, 5, 7), (4, 33), (1, 1, 1)]:
        X = rng.integers(0, 256, shape).astype(np.uint8)
        got = softmax(X)
        want = _qlinear_ops.qlinear_softmax(X, *parameters, axis=axis, opset=opset)
        assert got.shape == want.shape and got.tobytes() == want.tobytes(), shape
        assert softmax(X.view(np.int8)) is None  # another type: the general call raises for it
    assert softmax(np.zeros((), np.uint8)) is None and softmax([1, 2]) is None
    if axis > 0:
        assert softmax(np.zeros(3, np.uint8)) is None  # (axis past a 1-D X)
    assert _qlinear_ops.bind_softmax(np.float32(-1), None, np.float32(1), None, axis=axis, opset=opset) is None
    assert _qlinear_ops.bind_softmax(*parameters, axis=True, opset=opset) is None


def test_bound_products_are_the_calls(isa):
    rng = np.random.default_rng(4)
    for b_dtype, per_column in [(np.int8, False), (np.int8, True), (np.uint8, True)]:
        K, N = 40, 37
        b = rng.integers(0, 128, (K, N)).astype(b_dtype)
        b_scale = rng.uniform(0.01, 0.02, N).astype(np.float32) if per_column else np.float32(0.013)
        b_zp = np.full(N, 5, b_dtype) if per_column else b_dtype(2)
        held = qm.QLinearMatMul(b, b_scale, b_zp)
        for a_dtype in (np.uint8, np.int8):
            parameters = (np.float32(0.02), a_dtype(1), np.float32(0.3), np.uint8(9))
            product = held._bind(*parameters)
            for shape in [(5, K), (2, 3, K), (0, K)]:
                a = rng.integers(0, 100, shape).astype(a_dtype)
                got = product(a)
                want = held(a, parameters[0], parameters[1], *parameters[2:])
                assert got.shape == want.shape and got.tobytes() == want.tobytes()
            other = np.int8 if a_dtype == np.uint8 else np.uint8
            assert product(np.zeros((2, K), other)) is None  # the general call refuses it
            assert product(np.zeros(K, a_dtype)) is None  # rank 1: the general call's
            assert product(np.zeros((2, K + 1), a_dtype)) is None
    assert held._bind(np.float32(0), np.uint8(0), np.float32(1), np.uint8(0)) is None  # a zero scale
    batched = qlinear._bind_batched(
        np.float32(0.02), np.uint8(1), np.float32(0.05), np.int8(0), np.float32(0.4), np.int8(3)
    )
    a = rng.integers(0, 256, (3, 4, 16, 8)).astype(np.uint8)
    b = rng.integers(-128, 128, (3, 4, 8, 16)).astype(np.int8)
    want = qm.qlinear_matmul(
        a, np.float32(0.02), np.uint8(1), b, np.float32(0.05), np.int8(0), np.float32(0.4), np.int8(3)
    )
    got = batched(a, b)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert batched(a, b[0, 0]) is None  # a matrix b: the general call's 2-D product
    assert batched(a, b.view(np.uint8)) is None and batched(a.view(np.int8), b) is None


def test_what_folds_and_what_does_not(unbound):
    """A Constant node and the nodes reading only constants fold; a random draw, a node writing a graph
    output and a node that fails stay in the plan (the failing one raises at the run, naming itself)."""
    w = {"c_q": np.array([1, 2, 3], np.int8), "c_s": np.float32(0.5), "shape": np.array([3, 1], np.int64)}
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("DequantizeLinear", ["c_q", "c_s"], ["c"], name="dq"),
        helper.make_node("Mul", ["c", "k"], ["c2"], name="mul"),
        helper.make_node("Add", ["x", "c2"], ["y"], name="add"),
        helper.make_node("RandomUniformLike", ["c"], ["r"], name="random", low=0.0, high=0.0),
        helper.make_node("Add", ["x", "r"], ["z"], name="add_r"),
        helper.make_node("Reshape", ["c", "shape"], ["out"], name="reshape"),
    ]
    m = model(nodes, [("x", F32, [3])], [("y", F32, None), ("z", F32, None), ("out", F32, None)], w)
    session, plain = qo.InferenceSession(m), unbound(m)
    assert sorted(session._folded) == ["c", "c2", "k"]
    kept = [entry[0].onnx_node.name for entry in session._plan]
    assert kept == ["add", "random", "add_r", "reshape"]
    x = np.array([1.0, -2.0, 0.25], np.float32)
    for got, want in zip(session.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
        assert got.tobytes() == want.tobytes()
    w["shape"] = np.array([2, 2], np.int64)  # a Reshape that cannot be: stays, and raises at the run
    m = model(nodes[1:2] + nodes[-1:], [("x", F32, [3])], [("out", F32, None)], w)
    session = qo.InferenceSession(m)
    assert [entry[0].onnx_node.name for entry in session._plan] == ["reshape"]
    with pytest.raises(ValueError, match="reshape|Reshape|shape"):
        session.run(None, {"x": x})


@pytest.mark.parametrize("allowzero", [0, 1])
def test_bound_reshape_is_the_node(allowzero, unbound):
    """Fixed shapes with a 0 (the input's dimension there, unless allowzero), a -1, an empty dimension; a 0
    past the input's rank is a ValueError naming the node, bound or not (onnx.reference's: an IndexError)."""
    shapes = {"s1": [0, -1], "s2": [2, 0, 3], "s3": [-1], "s4": [0, 0, 0, 0]}
    nodes = [helper.make_node("Reshape", ["x", s], [f"y_{s}"], name=s, allowzero=allowzero) for s in shapes]
    w = {k: np.array(v, np.int64) for k, v in shapes.items()}
    m = model(nodes[:3], [("x", F32, None)], [(f"y_{s}", F32, None) for s in list(shapes)[:3]], w)
    session, plain = qo.InferenceSession(m), unbound(m)
    assert all(bound_nodes(session).values()) and not any(bound_nodes(plain).values())
    for shape in [(6, 2), (2, 1, 3), (0, 6)] if not allowzero else [(2, 0, 3)]:
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        try:
            want = plain.run(None, {"x": x})
        except ValueError as error:
            with pytest.raises(ValueError, match=re.escape(str(error)[:40])):
                session.run(None, {"x": x})
            continue
        got = session.run(None, {"x": x})
        assert [g.shape for g in got] == [v.shape for v in want]
        assert all(g.tobytes() == v.tobytes() for g, v in zip(got, want, strict=True))
    m = model(nodes[3:], [("x", F32, None)], [("y_s4", F32, None)], w)
    session, plain = qo.InferenceSession(m), unbound(m)
    x = np.zeros((2, 3), np.float32)
    error = (
        "cannot reshape array of size 6" if allowzero else r"Reshape: shape \[0, 0, 0, 0\] has a 0 .* at dimension 2"
    )
    for s in (session, plain):
        with pytest.raises(ValueError, match=rf"^InferenceSession.run: node 's4' \(Reshape\): {error}"):
            s.run(None, {"x": x})


def _conv_chain(x_type, rng, group=1):
    """QLinearConv nodes on x (x_type, 8 channels): a 3x3 (read in place where the kernels can; of `group`
    groups), a 1x1 with a bias and one without, a depthwise 3x3 stride 2, a 3x3 over 6 channels (an im2col),
    each reading the one before."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
    info = np.iinfo(x_type)
    zp = lambda: np.asarray(rng.integers(info.min // 2, info.max // 2), x_type)  # noqa: E731
    w = {"s": np.float32(0.05), "ws": np.float32(0.01)}
    nodes, x = [], "x"
    layers = [("c3", 8, 8, group, 1, True), ("c1", 8, 8, 1, 1, True), ("c1n", 8, 6, 1, 1, False)]
    layers += [("dw", 6, 6, 6, 2, True), ("im", 6, 5, 1, 1, True)]
    for name, cin, cout, group, stride, bias in layers:
        k = 1 if name.startswith("c1") else 3
        w[f"{name}_w"] = rng.integers(-100, 100, (cout, cin // group, k, k)).astype(np.int8)
        w[f"{name}_xz"], w[f"{name}_yz"] = zp(), zp()
        inputs = [x, "s", f"{name}_xz", f"{name}_w", "ws", "wz_" + name, "s", f"{name}_yz"]
        w["wz_" + name] = np.int8(0)
        if bias:
            w[f"{name}_b"] = rng.integers(-3000, 3000, cout).astype(np.int32)
            inputs.append(f"{name}_b")
        # (each layer's x zero point is the previous layer's y zero point: the same codes' meaning)
        if nodes:
            w[f"{name}_xz"] = w[f"{layers[len(nodes) - 1][0]}_yz"]
        nodes.append(
            helper.make_node(
                "QLinearConv", inputs, [name], name=name, group=group, strides=[stride, stride], pads=[k // 2] * 4
            )
        )
        x = name
    return model(nodes, [("x", t, None)], [(n[0], t, None) for n in layers], w)


@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_bound_convolutions_give_the_unbound_bits(x_type, isa, unbound):
    """The session's QLinearConv bound call (its x checked and its arguments formed once per x shape and
    type): a 3x3 read in place, a 1x1, a depthwise one, an im2col, each the unbound node's bits; a
    grouped one declined to the node's call; x in C order (the first) and channels-last views (the rest); a
    second shape."""
    rng = np.random.default_rng(9)
    m = _conv_chain(x_type, rng)
    session, plain = qo.InferenceSession(m), unbound(m)
    assert all(bound_nodes(session).values()) and not any(bound_nodes(plain).values())
    calls = taken(session)
    info = np.iinfo(x_type)
    for shape in [(1, 8, 9, 11), (2, 8, 5, 4), (1, 8, 9, 11)]:
        x = rng.integers(info.min, info.max + 1, shape).astype(x_type)
        got, want = session.run(None, {"x": x}), plain.run(None, {"x": x})
        assert all(g.shape == w.shape and g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))
    # (a 3x3 is read in place where the level's products have a kernel over receptive fields, else an im2col)
    reads = qm._core.pack_b(np.zeros((1, 4, 1), np.int8), True, True).reads_receptive_fields
    assert calls == {"c3": [True] * 3, "c1": [True] * 3, "c1n": [True] * 3, "dw": [True] * 3, "im": [True] * 3}
    m = _conv_chain(x_type, rng, group=2)
    grouped = qo.InferenceSession(m)
    calls = taken(grouped)
    got, want = grouped.run(None, {"x": x}), unbound(m).run(None, {"x": x})
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))
    assert calls["c3"] == [False] and calls["dw"] == [True]  # a grouped convolution runs the node's call
    conv = session._plan[0][0]._call.bound()  # the call itself: what it declines
    assert conv([[1]]) is None and conv(np.zeros((1, 8, 3, 3), np.float32)) is None
    assert conv(np.zeros((1, 7, 3, 3), x_type)) is None  # (the node's call raises for 7 channels)
    odd = np.empty(8 * 4 * 4 + 1, x_type)[1:].reshape(1, 4, 4, 8).transpose(0, 3, 1, 2)  # channels-last, 1 byte off
    odd[...] = 3
    if reads and x_type == np.int8:  # (int8 x is read through an aligned copy, x + 128)
        assert conv(odd).tobytes() == session._plan[0][0]._call(odd, "channels_last").tobytes()
    elif reads:  # x not 4-byte aligned: the kernel over receptive fields declines it
        assert conv(odd) is None
    else:  # (an im2col copies it)
        assert conv(odd).tobytes() == session._plan[0][0]._call(odd, "channels_last").tobytes()


def test_bound_flatten_is_onnx_references():
    """Flatten at every axis of a 4-D input (negative ones too) and past it: onnx.reference's shapes and
    views, bound and unbound; an empty input refused as the reference refuses it."""
    from onnx.reference import ReferenceEvaluator

    axes = [0, 1, 2, 3, 4, -1, -3, -4]
    nodes = [helper.make_node("Flatten", ["x"], [f"y{i}"], name=f"f{i}", axis=a) for i, a in enumerate(axes)]
    m = model(nodes, [("x", F32, None)], [(f"y{i}", F32, None) for i in range(len(axes))], {})
    session, reference = qo.InferenceSession(m), ReferenceEvaluator(m)
    assert all(bound_nodes(session).values()) and len(bound_nodes(session)) == len(axes)
    calls = taken(session)
    for shape in [(2, 3, 4, 5), (1, 1280, 1, 1)]:
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)  # a channels-last view
        got, want = session.run(None, {"x": x}), reference.run(None, {"x": x})
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(all(v) for v in calls.values())
    empty = np.zeros((0, 3, 2, 2), np.float32)
    with pytest.raises(ValueError, match="cannot reshape array of size 0"):
        reference.run(None, {"x": empty})
    with pytest.raises(
        ValueError, match=r"^InferenceSession.run: node 'f1' \(Flatten\): cannot reshape array of size 0"
    ):
        session.run(None, {"x": empty})


@pytest.mark.parametrize("fn", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_bound_add_and_mul_are_the_functions(fn, dtype):
    """Shapes the C++ loop reads as they are (equal; one repeated over the other's leading dimensions; a
    one-element operand on either side, which makes A ORT's per-span scalar for the add) against the
    functions, each twice (the second from the per-shape cache); other layouts, types and refused
    parameters are left to the general call."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    parameters = (np.float32(0.05), dtype(3), np.float32(0.02), dtype(-2 if dtype == np.int8 else 250))
    parameters += (np.float32(0.04), dtype(9))
    function = _qlinear_ops.qlinear_add if fn == "QLinearAdd" else _qlinear_ops.qlinear_mul
    bound = _qlinear_ops.bind_binary(fn, _qlinear_ops.BinaryScalars(fn, *parameters))
    codes = lambda *shape: rng.integers(info.min, info.max + 1, shape).astype(dtype)  # noqa: E731
    for a_shape, b_shape in [
        ((2, 12, 16), (2, 12, 16)),
        ((1, 12, 16, 16), (1, 1, 1, 16)),
        ((3, 40), (40,)),
        ((), (5, 7)),
        ((1,), (4, 33)),
        ((16, 384), (1, 16, 384)),
        ((1, 1, 16), (3, 5, 16)),
    ]:
        for _ in range(2):
            A, B = codes(*a_shape), codes(*b_shape)
            got = bound(A, B)
            want = function(A, *parameters[:2], B, *parameters[2:])
            assert got is not None, (a_shape, b_shape)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (a_shape, b_shape)
    A = codes(4, 16)
    assert bound(A, codes(4, 1)) is None  # broadcast along the last axis: copied first, by the general call
    assert bound(A.T, codes(16, 4)) is None  # not C-contiguous
    assert bound(A, A.view(np.int8 if dtype == np.uint8 else np.uint8)) is None  # two types: the call raises
    assert bound(A, codes(5, 16)) is None  # no broadcast
    assert bound(A[:0], A[:0]) is None  # empty: the general call's
    refused = _qlinear_ops.bind_binary(
        fn, _qlinear_ops.BinaryScalars(fn, *parameters[:5], np.int16(0))
    )  # (a zero point of another type)
    assert refused(A, A) is None


def test_an_output_viewing_a_folded_value_is_the_callers_own():
    """A graph output that is a view of a folded value (a Reshape of a DequantizeLinear of initializers)
    comes back as a copy: writing into it changes nothing in the next run."""
    w = {"c_q": np.array([1, 2, 3, 4], np.int8), "c_s": np.float32(0.5), "shape": np.array([2, 2], np.int64)}
    nodes = [
        helper.make_node("DequantizeLinear", ["c_q", "c_s"], ["c"], name="dq"),
        helper.make_node("Reshape", ["c", "shape"], ["out"], name="reshape"),
        helper.make_node("Add", ["x", "x"], ["y"], name="add"),
    ]
    m = model(nodes, [("x", F32, [2])], [("out", F32, None), ("y", F32, None)], w)
    session = qo.InferenceSession(m)
    assert list(session._folded) == ["c"]
    first = session.run(None, {"x": np.ones(2, np.float32)})[0]
    first[...] = -7
    again = session.run(None, {"x": np.ones(2, np.float32)})[0]
    assert np.array_equal(again, [[0.5, 1.0], [1.5, 2.0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_float_matmul_bound_to_numpy_is_the_reference_node(dtype):
    """onnx.reference's MatMul called as its own numpy function for float operands of one type: 1-D by 1-D (a
    0-d array), 2-D by 1-D, batched with broadcasting (an attention's scores); integers run the node."""
    from onnx.reference import ReferenceEvaluator

    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = {"v": np.array([0.5, -1.0, 2.0], dtype), "k": (np.arange(3 * 5) % 7 - 3).astype(dtype).reshape(1, 3, 5)}
    nodes = [
        helper.make_node("MatMul", ["x", "v"], ["xv"], name="xv"),  # [2, 4, 3] x [3]
        helper.make_node("MatMul", ["v", "v"], ["vv"], name="vv"),  # 1-D x 1-D: 0-d
        helper.make_node("MatMul", ["x", "k"], ["xk"], name="xk"),  # [2, 4, 3] x [1, 3, 5]
    ]
    outputs = [("xv", t, None), ("vv", t, None), ("xk", t, None)]
    m = model(nodes, [("x", t, None)], outputs, w)
    session, reference = qo.InferenceSession(m), ReferenceEvaluator(m)
    calls = taken(session)
    x = (np.random.default_rng(3).standard_normal((2, 4, 3)) * 10).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[0, 0] = [np.nan, -0.0, np.inf]
    with np.errstate(all="ignore"):
        got, want = session.run(None, {"x": x}), reference.run(None, {"x": x})
    for g, v in zip(got, want, strict=True):
        assert type(g) is np.ndarray and g.dtype == v.dtype and g.shape == v.shape and g.tobytes() == v.tobytes()
    floats = np.dtype(dtype).kind == "f"
    assert calls == {"xv": [floats], "vv": [floats], "xk": [floats]}  # (vv: a graph output, not folded)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_float_add_sub_mul_div_bound_to_numpy_are_the_reference_nodes(dtype, unbound):
    """onnx.reference's Add, Sub, Mul, Div and two-input Max and Min called as their numpy functions for float
    operands of one type: the same values and types (NaN, -0.0), 0-d results as 0-d arrays; integers (Div
    truncates) run the nodes."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = {"c": np.array([1.5, -2.0, 0.0], dtype), "z": np.array(3, dtype)}
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Sub", ["z", "a"], ["s"], name="sub"),
        helper.make_node("Mul", ["s", "x"], ["m"], name="mul"),
        helper.make_node("Div", ["m", "c"], ["d"], name="div"),
        helper.make_node("Div", ["z", "z"], ["one"], name="div0"),  # 0-d by 0-d: a 0-d array
        helper.make_node("Max", ["d", "x"], ["hi"], name="max"),
        helper.make_node("Min", ["c", "d"], ["lo"], name="min"),
    ]
    outputs = [("d", t, None), ("one", t, None), ("hi", t, None), ("lo", t, None)]
    m = model(nodes, [("x", t, None)], outputs, w)
    session = session_without(m, "float_chains")  # (the nodes one by one: not as a chain, test_onnx_float_chains.py)
    plain = unbound(m)
    calls = taken(session)
    x = (np.arange(12).reshape(4, 3) - 5).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[0] = [np.nan, -0.0, np.inf]
    with np.errstate(all="ignore"):
        got, want = session.run(None, {"x": x}), plain.run(None, {"x": x})
    for g, v in zip(got, want, strict=True):
        assert type(g) is np.ndarray and g.dtype == v.dtype and g.shape == v.shape and g.tobytes() == v.tobytes()
    floats = np.dtype(dtype).kind == "f"
    names = ("add", "sub", "mul", "div", "div0", "max", "min")
    assert calls == {n: [floats] for n in names}  # (div0: a graph output, not folded)
