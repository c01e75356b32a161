"""test_onnx_dynamic.py: the session's quantize_dynamic products (onnx/_dynamic.py), MatMulInteger -> Cast -> Mul(scale) (-> Add(bias)) as one call: the nodes' bits on each kernel level, which chains fuse, and the calls that run the nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_bound import taken

import quantmatmul.onnx as qo
from quantmatmul.onnx import _dynamic, _session
from quantmatmul.onnx._dynamic import ScaledMatMulInteger

F32 = TensorProto.FLOAT


def dynamic_model(K, N, *, per_channel=False, w_dtype=np.int8, scale_first=False, bias="after", cast_to=F32, x_rank=3):
    """quantize_dynamic's form of x @ W + bias: DynamicQuantizeLinear(x), Mul(x_scale, w_scale), MatMulInteger(x_q,
    W_q, x_zp, w_zp) -> Cast -> Mul(that scale) -> Add(bias) (bias "after" the product, "before" it, or None)."""
    rng = np.random.default_rng(K + N)
    info = np.iinfo(w_dtype)
    w = {
        "w_q": rng.integers(info.min, info.max + 1, (K, N)).astype(w_dtype),
        "w_s": (rng.uniform(0.001, 0.01, N) if per_channel else np.float32(0.004)).astype(np.float32),
        "w_z": (rng.integers(info.min, info.max + 1, N) if per_channel else np.zeros(())).astype(w_dtype),
        "bias": rng.standard_normal(N).astype(np.float32),
    }
    cast = helper.make_node("Cast", ["acc"], ["acc_f"], to=cast_to)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_z"]),
        helper.make_node("Mul", ["x_s", "w_s"], ["s"]),
        helper.make_node("MatMulInteger", ["x_q", "w_q", "x_z", "w_z"], ["acc"], name="mmi"),
        cast,
        helper.make_node("Mul", ["s", "acc_f"] if scale_first else ["acc_f", "s"], ["p"]),
    ]
    if bias is not None:
        nodes.append(helper.make_node("Add", ["bias", "p"] if bias == "before" else ["p", "bias"], ["y"]))
    out = "y" if bias is not None else "p"
    x_shape = ["batch", "S", K] if x_rank == 3 else ["M", K]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", F32, x_shape)],
        [helper.make_tensor_value_info(out, F32 if cast_to == F32 else TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in w.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def fused_in(session) -> list:
    return [entry[0] for entry in session._plan if isinstance(entry[0], ScaledMatMulInteger)]


@pytest.fixture
def unfused(monkeypatch):
    def make(model):
        with monkeypatch.context() as patch:
            patch.setattr(_session, "scaled_matmuls", lambda entries, *_: entries)
            patch.setattr(_session, "float_chains", lambda entries, *_: entries)
            patch.setattr(_session, "sibling_products", lambda entries, *_: entries)
            return qo.InferenceSession(model)

    return make


def inputs(shape, seed):
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -0.0, 1e-30]
    return x


@pytest.fixture
def fused_calls(monkeypatch):
    """The fused products' kernel calls (csrc matmul_integer_scaled, matmul_integer_scaled_rows) the sessions
    make and complete: a's shape as the call takes it."""
    calls = []
    core = _session._core

    class Core:
        def __getattr__(self, name):
            if name in ("matmul_integer_scaled", "matmul_integer_scaled_rows"):
                return lambda *a: (getattr(core, name)(*a), calls.append(a[0].shape))[0]
            return getattr(core, name)

    monkeypatch.setattr(_session, "_core", Core())
    monkeypatch.setattr(_dynamic, "_core", Core())
    return calls


@pytest.mark.parametrize(
    "per_channel, w_dtype, scale_first, bias",
    [
        (False, np.int8, False, "after"),
        (True, np.int8, True, "before"),
        (True, np.uint8, False, None),
        (False, np.uint8, True, "after"),
    ],
)
def test_the_fused_product_gives_the_nodes_bits(per_channel, w_dtype, scale_first, bias, isa, unfused, fused_calls):
    """Per-tensor and per-channel weights (zero points too), both Mul operand orders, the bias on either side
    or none, int8 and uint8 weights, x of rank 2 and 3 with row counts off the kernels' tiles."""
    cases = [(64, 96, (2, 5, 64)), (40, 37, (13, 40)), (384, 130, (1, 16, 384)), (256, 1000, (4, 128, 256))]
    for seed, (K, N, x_shape) in enumerate(cases):
        model = dynamic_model(
            K, N, per_channel=per_channel, w_dtype=w_dtype, scale_first=scale_first, bias=bias, x_rank=len(x_shape)
        )
        session, plain = qo.InferenceSession(model), unfused(model)
        assert len(fused_in(session)) == 1 and not fused_in(plain) and fused_in(session)[0].scale_product
        assert len(session._plan) == len(plain._plan) - (4 if bias else 3)  # (the scale's Mul joins too)
        x = inputs(x_shape, seed)
        before = x.copy()
        fused_calls.clear()
        got = session.run(None, {"x": x})[0]
        assert len(fused_calls) == 1  # (the fused call took it: not the nodes)
        want = plain.run(None, {"x": x})[0]
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), (K, N)
        assert np.array_equal(x, before)


def test_what_does_not_fuse(unfused):
    """A Cast to another type; a value of the chain read twice; a MatMulInteger without a constant b."""
    model = dynamic_model(32, 16, cast_to=TensorProto.DOUBLE, bias=None)
    assert not fused_in(qo.InferenceSession(model))
    model = dynamic_model(32, 16)
    model.graph.output.append(helper.make_tensor_value_info("acc_f", F32, None))  # the Cast's value read outside
    assert not fused_in(qo.InferenceSession(model))
    model = dynamic_model(32, 16)
    model.graph.node.append(helper.make_node("Neg", ["p"], ["q"]))  # the Mul's value read twice: no Add in it
    model.graph.output.append(helper.make_tensor_value_info("q", F32, None))
    (fused,) = fused_in(qo.InferenceSession(model))
    assert fused.add is None
    x = inputs((3, 4, 32), 1)
    for got, want in zip(
        qo.InferenceSession(model).run(None, {"x": x}), unfused(model).run(None, {"x": x}), strict=True
    ):
        assert got.tobytes() == want.tobytes()
    model = dynamic_model(32, 16)
    model.graph.node.append(helper.make_node("Neg", ["s"], ["s2"]))  # the scale read twice: its Mul stays a node
    model.graph.output.append(helper.make_tensor_value_info("s2", F32, None))
    (fused,) = fused_in(qo.InferenceSession(model))
    assert fused.scale_product is None and fused.add is not None
    for got, want in zip(
        qo.InferenceSession(model).run(None, {"x": x}), unfused(model).run(None, {"x": x}), strict=True
    ):
        assert got.tobytes() == want.tobytes()
    model = dynamic_model(32, 16)
    weight = next(t for t in model.graph.initializer if t.name == "w_q")
    model.graph.initializer.remove(weight)
    model.graph.input.append(helper.make_tensor_value_info("w_q", TensorProto.INT8, [32, 16]))
    assert not fused_in(qo.InferenceSession(model))


def test_a_call_the_fused_product_does_not_take_runs_the_nodes(unfused):
    """A scale of another shape than one value or one per column (a Mul that broadcasts to a new dimension)
    runs the nodes; a bad a raises the node's error, naming it."""
    model = dynamic_model(24, 8, x_rank=2)
    scale = next(t for t in model.graph.initializer if t.name == "w_s")
    model.graph.initializer.remove(scale)
    model.graph.initializer.append(numpy_helper.from_array(np.full((3, 1, 1), 0.01, np.float32), "w_s"))
    session = qo.InferenceSession(model)
    assert len(fused_in(session)) == 1
    x = inputs((5, 24), 2)
    got, want = session.run(None, {"x": x})[0], unfused(model).run(None, {"x": x})[0]
    assert got.shape == want.shape == (3, 5, 8) and got.tobytes() == want.tobytes()
    model = dynamic_model(24, 8, x_rank=2)
    model.graph.node[2].input[0] = "x_bad"
    model.graph.input.append(helper.make_tensor_value_info("x_bad", F32, ["M", 24]))
    with pytest.raises(TypeError, match="^InferenceSession.run: node 'mmi' .*must be int8 or uint8"):
        qo.InferenceSession(model).run(None, {"x": x, "x_bad": x})


def test_an_ort_quantize_dynamic_model_fuses_every_product(unfused):
    """ONNX Runtime's quantize_dynamic on a two-layer MLP: both products fuse, the nodes' bits."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    w = {"w1": rng.standard_normal((48, 64)).astype(np.float32), "b1": rng.standard_normal(64).astype(np.float32)}
    w |= {"w2": rng.standard_normal((64, 10)).astype(np.float32), "b2": rng.standard_normal(10).astype(np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", F32, ["batch", 48])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    with tempfile.TemporaryDirectory() as folder:
        onnx.save(model, Path(folder) / "f.onnx")
        quantize_dynamic(Path(folder) / "f.onnx", Path(folder) / "q.onnx", weight_type=QuantType.QInt8)
        quantized = onnx.load(Path(folder) / "q.onnx")
    session = qo.InferenceSession(quantized)
    assert len(fused_in(session)) == 2
    x = inputs((7, 48), 4)
    assert session.run(None, {"x": x})[0].tobytes() == unfused(quantized).run(None, {"x": x})[0].tobytes()


@pytest.mark.parametrize("blocking", [dict(task_panel_bytes=1), dict(task_rows=1, k_block=1), {}])
def test_no_blocking_changes_the_fused_bits(blocking, unfused):
    """The driver's blocking (one panel of columns a task, a row group, a k-group a kernel call) and the
    thread count decide who computes which outputs, never their bits (the epilogue's scale and bias per
    column block)."""
    import quantmatmul as qm
    from quantmatmul import _core

    model = dynamic_model(96, 200, per_channel=True)
    session, plain = qo.InferenceSession(model), unfused(model)
    x = inputs((2, 37, 96), 5)
    want = plain.run(None, {"x": x})[0]
    threads = qm.get_num_threads()
    try:
        _core.set_qgemm_blocking(**blocking)
        for n in (1, 3):
            qm.set_num_threads(n)
            assert session.run(None, {"x": x})[0].tobytes() == want.tobytes(), (blocking, n)
    finally:
        _core.set_qgemm_blocking()
        qm.set_num_threads(threads)


@pytest.mark.parametrize("a_dtype, b_dtype", [(np.uint8, np.int8), (np.int8, np.uint8)])
def test_a_matmul_integer_with_a_constant_b_is_the_int64_product(a_dtype, b_dtype, isa):
    """The session's MatMulInteger with a constant b (bound: a's rows folded, its zero point per tensor) and
    the general call it leaves the rest to (a zero point per row), against numpy's int64 product."""
    rng = np.random.default_rng(6)
    K, N = 70, 45
    b = rng.integers(np.iinfo(b_dtype).min, np.iinfo(b_dtype).max + 1, (K, N)).astype(b_dtype)
    b_zp = rng.integers(0, 100, N).astype(b_dtype)
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"], name="mmi")]
    graph = helper.make_graph(
        nodes,
        "mmi",
        [
            helper.make_tensor_value_info("a", helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype)), None),
            helper.make_tensor_value_info("a_zp", helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype)), None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(b_zp, "b_zp")],
    )
    session = qo.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    info = np.iinfo(a_dtype)
    for a_shape, zp_shape in [((5, K), ()), ((2, 9, K), (1,)), ((1, 1, 3, K), ()), ((6, K), (6,))]:
        a = rng.integers(info.min, info.max + 1, a_shape).astype(a_dtype)
        a_zp = rng.integers(info.min, info.max + 1, zp_shape).astype(a_dtype)
        rows = a_zp.reshape(-1, 1) if zp_shape == (6,) else a_zp.reshape(())
        want = (a.astype(np.int64) - rows.astype(np.int64)) @ (b.astype(np.int64) - b_zp.astype(np.int64))
        got = session.run(None, {"a": a, "a_zp": a_zp})[0]
        assert got.dtype == np.int32 and got.shape == want.shape and np.array_equal(got, want), (a_shape, zp_shape)


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
def test_the_fused_product_of_graph_inputs(a_dtype, unfused, fused_calls):
    """a, its zero point and its scale fed by the caller: a zero point of one value (0-d or [1]) and a scale of
    one value take the one call (matmul_integer_scaled_rows); a zero point per row (MatMulInteger allows [M])
    and a strided a run the nodes, with their bits; none changes the inputs."""
    K, N = 48, 20
    t = helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype))
    model = dynamic_model(K, N, per_channel=True)
    graph = model.graph
    graph.node.remove(graph.node[0])  # (the DynamicQuantizeLinear: x_q, x_z and x_s come from the caller)
    del graph.input[:]
    graph.input.extend(
        [
            helper.make_tensor_value_info("x_q", t, None),
            helper.make_tensor_value_info("x_z", t, None),
            helper.make_tensor_value_info("x_s", F32, None),
        ]
    )
    session, plain = qo.InferenceSession(model), unfused(model)
    assert len(fused_in(session)) == 1
    rng = np.random.default_rng(7)
    info = np.iinfo(a_dtype)
    for zp_shape, took in [((), 1), ((1,), 1), ((9,), 0), ("strided", 0)]:
        q = rng.integers(info.min, info.max + 1, (9, K if zp_shape != "strided" else 2 * K)).astype(a_dtype)
        q = q[:, ::2] if zp_shape == "strided" else q
        z = rng.integers(info.min, info.max + 1, () if zp_shape == "strided" else zp_shape).astype(a_dtype)
        feed = {"x_q": q, "x_z": z, "x_s": np.array(0.0173, np.float32)}
        before = {k: v.copy() for k, v in feed.items()}
        fused_calls.clear()
        got = session.run(None, feed)[0]
        assert len(fused_calls) == took, zp_shape
        want = plain.run(None, feed)[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert all(np.array_equal(feed[k], before[k]) for k in feed)


def sibling_model(widths=(40, 24, 40), biases=(True, True, True), w_dtype=np.int8, K=64):
    """One DynamicQuantizeLinear of x read by a product per width (quantize_dynamic's query, key and value),
    each with its own weight, per-channel or per-tensor scale and optional bias."""
    rng = np.random.default_rng(11)
    info = np.iinfo(w_dtype)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_z"])]
    weights, outputs = {}, []
    for i, (N, bias) in enumerate(zip(widths, biases, strict=True)):
        weights[f"w{i}"] = rng.integers(info.min, info.max + 1, (K, N)).astype(w_dtype)
        weights[f"s{i}"] = (rng.uniform(0.001, 0.01, N) if i % 2 else np.float32(0.004)).astype(np.float32)
        weights[f"z{i}"] = (rng.integers(info.min, info.max + 1, N) if i % 2 else np.zeros(())).astype(w_dtype)
        weights[f"b{i}"] = rng.standard_normal(N).astype(np.float32)
        nodes += [
            helper.make_node("Mul", ["x_s", f"s{i}"], [f"scale{i}"]),
            helper.make_node("MatMulInteger", ["x_q", f"w{i}", "x_z", f"z{i}"], [f"acc{i}"], name=f"mmi{i}"),
            helper.make_node("Cast", [f"acc{i}"], [f"acc_f{i}"], to=F32),
            helper.make_node("Mul", [f"acc_f{i}", f"scale{i}"], [f"p{i}"]),
        ]
        if bias:
            nodes.append(helper.make_node("Add", [f"p{i}", f"b{i}"], [f"y{i}"]))
        outputs.append(f"y{i}" if bias else f"p{i}")
    graph = helper.make_graph(
        nodes,
        "siblings",
        [helper.make_tensor_value_info("x", F32, ["batch", "S", K])],
        [helper.make_tensor_value_info(name, F32, None) for name in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def siblings_in(session) -> list:
    return [entry[0] for entry in session._plan if isinstance(entry[0], _dynamic.SiblingProducts)]


@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
def test_sibling_products_give_the_products_bits(w_dtype, isa, unfused, fused_calls):
    """Products of one a as one call, their outputs apart: the unfused nodes' bits, widths off the kernels'
    panels, per-tensor and per-channel scales and zero points side by side."""
    model = sibling_model(w_dtype=w_dtype)
    session, plain = qo.InferenceSession(model), unfused(model)
    (group,) = siblings_in(session)
    assert group.widths == [40, 24, 40] and not siblings_in(plain)
    for seed, shape in enumerate([(2, 5, 64), (1, 16, 64), (3, 1, 64)]):
        x = inputs(shape, seed)
        fused_calls.clear()
        got = session.run(None, {"x": x})
        assert len(fused_calls) == 1  # (one call for the three)
        want = plain.run(None, {"x": x})
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
            assert g.flags.c_contiguous


def test_which_products_are_siblings(unfused):
    """All or none with a bias (an Add of 0 would turn -0.0 into +0.0); a call the one product does not take
    (a zero point per row) runs the products' nodes, with their bits."""
    model = sibling_model(widths=(16, 16, 16), biases=(True, False, True))
    (group,) = siblings_in(qo.InferenceSession(model))
    assert group.widths == [16, 16]
    model = sibling_model(widths=(16, 24), biases=(True, True))
    graph = model.graph
    graph.node.remove(graph.node[0])  # (a, its zero point and its scale from the caller)
    del graph.input[:]
    graph.input.extend(
        [helper.make_tensor_value_info(n, t, None) for n, t in (("x_q", TensorProto.UINT8), ("x_z", TensorProto.UINT8))]
        + [helper.make_tensor_value_info("x_s", F32, None)]
    )
    session, plain = qo.InferenceSession(model), unfused(model)
    assert len(siblings_in(session)) == 1
    calls = taken(session)
    rng = np.random.default_rng(12)
    q = rng.integers(0, 256, (5, 64)).astype(np.uint8)
    for zp, took in [(np.array(3, np.uint8), True), (rng.integers(0, 256, 5).astype(np.uint8), False)]:
        feed = {"x_q": q, "x_z": zp, "x_s": np.array(0.02, np.float32)}
        calls.clear()
        got, want = session.run(None, feed), plain.run(None, feed)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.tobytes() == w.tobytes()
        assert list(calls.values()) == [[took]]
