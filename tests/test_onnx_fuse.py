"""test_onnx_fuse.py: InferenceSession's QDQ fusion (DequantizeLinear -> MatMul -> QuantizeLinear as one QLinearMatMul): which groups fuse, the bits they give (quantmatmul's QLinearMatMul, ONNX Runtime's fused run), what stays as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_bits import optimized_session
from peer_deviations import pinned_only
from qdq_chain import Chain

import quantmatmul
import quantmatmul.onnx as qo
from quantmatmul import peers
from quantmatmul.onnx._fuse import fuse_qdq

F32, U8, S8 = np.float32, np.uint8, np.int8
# QLinearAdd / QLinearMul / QLinearSoftmax reproduce the pinned ONNX Runtime's kernels (onnx/_qlinear_ops.py):
# the element-wise fusions are compared with that release's optimizer only
ORT_PINNED = pinned_only("onnxruntime", "compared with the optimizer of")
SATURATES = peers.onnxruntime_u8s8_saturates()  # ORT's u8·s8 AVX2 kernel without VNNI (onnxruntime#16105)
M, K, N = 5, 24, 16
ELEM = {np.dtype(F32): TensorProto.FLOAT, np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8}


def qdq_model(
    *,
    a_type=U8,
    w_type=S8,
    y_type=U8,
    w_scale=None,
    w_axis=None,
    zero_points=True,
    relu=False,
    y_zero_point=None,
    scales=(0.05, 0.02, 0.3),
    extra_outputs=(),
    extra_nodes=(),
    batched=False,
    seed=0,
):
    """x (float) -> QuantizeLinear -> DequantizeLinear -> MatMul (W: DequantizeLinear of an initializer, or
    with batched, a second quantized input w) [-> Relu] -> QuantizeLinear -> y_q -> DequantizeLinear -> y."""
    rng = np.random.default_rng(seed)
    a_s, w_s, y_s = scales
    inits = {"a_s": np.array(a_s, F32), "y_s": np.array(y_s, F32)}
    if zero_points:
        inits["a_z"] = np.array(3 if a_type == U8 else -2, a_type)
        inits["w_z"] = np.array(0, w_type)
        inits["y_z"] = np.array(y_zero_point if y_zero_point is not None else (100 if y_type == U8 else 5), y_type)
    z = lambda name: name if zero_points else ""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_s", z("a_z")], ["x_q"], name="qx"),
        helper.make_node("DequantizeLinear", ["x_q", "a_s", z("a_z")], ["x_dq"], name="dqx"),
    ]
    inputs = [("x", TensorProto.FLOAT, [M, K] if not batched else [3, M, K])]
    if batched:  # an activation times an activation, per tensor: [3, M, K] @ [3, K, N]
        inits["w_s"] = np.array(w_s, F32)
        inputs.append(("w", TensorProto.FLOAT, [3, K, N]))
        nodes.append(helper.make_node("QuantizeLinear", ["w", "w_s", z("w_z")], ["w_q"], name="qw"))
    else:
        info = np.iinfo(w_type)
        inits["W"] = rng.integers(info.min, info.max + 1, (K, N)).astype(w_type)
        inits["w_s"] = np.array(w_s, F32) if w_scale is None else np.asarray(w_scale, F32)
        if zero_points and w_scale is not None:
            inits["w_z"] = np.zeros(inits["w_s"].shape, w_type)
    w_source = "w_q" if batched else "W"
    attrs = {} if w_axis is None else {"axis": w_axis}
    nodes.append(helper.make_node("DequantizeLinear", [w_source, "w_s", z("w_z")], ["w_dq"], name="dqw", **attrs))
    nodes.append(helper.make_node("MatMul", ["x_dq", "w_dq"], ["h"], name="mm"))
    if relu:
        nodes.append(helper.make_node("Relu", ["h"], ["r"], name="relu"))
    nodes.append(helper.make_node("QuantizeLinear", ["r" if relu else "h", "y_s", z("y_z")], ["y_q"], name="qy"))
    nodes.append(helper.make_node("DequantizeLinear", ["y_q", "y_s", z("y_z")], ["y"], name="dqy"))
    nodes.extend(extra_nodes)
    out_shape = [M, N] if not batched else [3, M, N]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)]
    outputs += [helper.make_tensor_value_info(n, t, shape) for n, t, shape in extra_outputs]
    outputs.append(helper.make_tensor_value_info("y_q", ELEM[np.dtype(y_type)], out_shape))
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    return model, inits


def feed_for(model, seed=1, scale=2.0):
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feed[value.name] = (rng.normal(size=shape) * scale).astype(F32)
    return feed


def ops_run(session):
    return [node.op_type for node in session._evaluator.rt_nodes_]


def expected(model, inits, feed, numerics="onnxruntime", y_zero_point_name="y_z"):
    """y_q as quantmatmul.qlinear_matmul computes the fused group: the definition of the fused node."""
    x_q = quantmatmul.quantize_linear(feed["x"], inits["a_s"], inits.get("a_z", np.array(0, U8)))
    if "w" in feed:
        w_q = quantmatmul.quantize_linear(feed["w"], inits["w_s"], inits.get("w_z", np.array(0, U8)))
    else:
        w_q = inits["W"]
    w_z = inits.get("w_z", np.zeros((), w_q.dtype))
    return quantmatmul.qlinear_matmul(
        x_q,
        inits["a_s"],
        inits.get("a_z", np.zeros((), x_q.dtype)),
        w_q,
        inits["w_s"],
        w_z,
        inits["y_s"],
        inits.get(y_zero_point_name, np.array(0, U8)),
        numerics=numerics,
    )


@pytest.mark.parametrize("numerics", ["onnxruntime", "exact", "onnx-reference"])
@pytest.mark.parametrize(
    "types", [(U8, S8, U8), (S8, S8, S8), (U8, U8, U8), (S8, U8, U8)], ids=["u8s8", "s8s8", "u8u8", "s8u8-u8"]
)
def test_fused_group_is_qlinear_matmul(types, numerics):
    a_type, w_type, y_type = types
    model, inits = qdq_model(a_type=a_type, w_type=w_type, y_type=y_type)
    feed = feed_for(model)
    session = qo.InferenceSession(model, numerics=numerics)
    assert session.fused == ["mm"]
    # the MatMul, its QuantizeLinear and both of its DequantizeLinear nodes are one held QLinearMatMul
    assert ops_run(session) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    assert type(session._evaluator.rt_nodes_[1]._held) is quantmatmul.QLinearMatMul
    y, y_q = session.run(None, feed)
    assert y_q.dtype == y_type and y_q.tobytes() == expected(model, inits, feed, numerics).tobytes()
    # as written: a float32 sum rounded, at most a step of y's scale from the fused one
    written_y, written_q = qo.InferenceSession(model, numerics=numerics, fuse_qdq=False).run(None, feed)
    assert np.abs(written_q.astype(int) - y_q.astype(int)).max() <= 1


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("a_type", [U8, S8])
def test_fused_session_is_onnxruntime_bit_for_bit(a_type, per_channel):
    """ORT's graph optimizer fuses the same groups (u8·s8 and s8·s8) into its QLinearMatMul."""
    w_scale = np.linspace(0.01, 0.03, N) if per_channel else None
    model, inits = qdq_model(a_type=a_type, y_type=a_type, w_scale=w_scale, scales=(0.05, 0.02, 0.5))
    feed = feed_for(model, scale=1.0 if not SATURATES else 0.3)
    ours = qo.InferenceSession(model).run(None, feed)
    theirs = peers.session(model).run(None, feed)
    if SATURATES and a_type == U8:
        pytest.skip("ORT's u8·s8 kernel saturates on this CPU (onnxruntime#16105)")
    for a, b in zip(ours, theirs):
        assert a.tobytes() == b.tobytes()


def test_per_column_weight_fuses_and_per_row_does_not():
    model, inits = qdq_model(w_scale=np.linspace(0.01, 0.03, N), w_axis=1)
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"]
    assert session.run(["y_q"], feed)[0].tobytes() == expected(model, inits, feed).tobytes()
    # a scale per k (axis 0) is not a QLinearMatMul parameter: as written
    model, _ = qdq_model(w_scale=np.linspace(0.01, 0.03, K), w_axis=0)
    assert qo.InferenceSession(model).fused == []


def test_missing_zero_points_are_zeros():
    """DequantizeLinear / QuantizeLinear without zero points: uint8 zeros (new initializers in the copy)."""
    model, inits = qdq_model(zero_points=False, w_type=U8)
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"]
    y_q = session.run(["y_q"], feed)[0]
    assert y_q.dtype == U8 and y_q.tobytes() == expected(model, inits, feed).tobytes()
    assert y_q.tobytes() == peers.session(model).run(["y_q"], feed)[0].tobytes()


@pytest.mark.parametrize("y_type", [U8, S8])
def test_relu_made_redundant_by_the_quantization_fuses(y_type):
    qmin = np.iinfo(y_type).min
    model, inits = qdq_model(relu=True, y_type=y_type, y_zero_point=qmin)
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"] and "Relu" not in ops_run(session)
    y_q = session.run(["y_q"], feed)[0]
    assert y_q.tobytes() == expected(model, inits, feed).tobytes() and (y_q == qmin).any()
    # a zero point above the type's minimum keeps codes for negative values: the Relu matters
    model, _ = qdq_model(relu=True, y_type=y_type, y_zero_point=qmin + 10)
    assert qo.InferenceSession(model).fused == []


def test_batched_activations_fuse():
    model, inits = qdq_model(batched=True, w_type=U8)
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"]
    y_q = session.run(["y_q"], feed)[0]
    assert y_q.shape == (3, M, N) and y_q.tobytes() == expected(model, inits, feed).tobytes()


def test_shared_and_still_read_dequantize_nodes():
    """One DequantizeLinear feeding two MatMuls: both fuse and it goes; one also read by an Add stays."""
    model, inits = qdq_model(
        extra_nodes=[
            helper.make_node("MatMul", ["x_dq", "w_dq"], ["h2"], name="mm2"),
            helper.make_node("QuantizeLinear", ["h2", "y_s", "y_z"], ["y2_q"], name="qy2"),
        ],
        extra_outputs=[("y2_q", TensorProto.UINT8, [M, N])],
    )
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm", "mm2"]
    assert ops_run(session) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear", "QLinearMatMul"]  # dqy
    y, y2, y_q = session.run(None, feed)
    assert y2.tobytes() == y_q.tobytes() == expected(model, inits, feed).tobytes()

    model, inits = qdq_model(
        extra_nodes=[helper.make_node("Add", ["x_dq", "x_dq"], ["twice"], name="add")],
        extra_outputs=[("twice", TensorProto.FLOAT, [M, K])],
    )
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"] and ops_run(session).count("DequantizeLinear") == 2  # x's, y's
    y, twice, y_q = session.run(None, feed)
    x_dq = quantmatmul.dequantize_linear(
        quantmatmul.quantize_linear(feed["x"], inits["a_s"], inits["a_z"]), inits["a_s"], inits["a_z"]
    )
    assert np.array_equal(twice, x_dq + x_dq) and y_q.tobytes() == expected(model, inits, feed).tobytes()


def test_dequantized_graph_output_stays():
    """The weight's DequantizeLinear output is also a graph output: the group fuses, the node stays."""
    model, inits = qdq_model(extra_outputs=[("w_dq", TensorProto.FLOAT, [K, N])])
    feed = feed_for(model)
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"] and ops_run(session).count("DequantizeLinear") == 2  # W's, y's
    y, w_dq, y_q = session.run(None, feed)
    assert np.array_equal(w_dq, (inits["W"].astype(F32) - inits["w_z"]) * inits["w_s"])
    assert y_q.tobytes() == expected(model, inits, feed).tobytes()


def test_groups_that_stay_as_written():
    cases = {
        # the MatMul's output is read by another node too, or is a graph output
        "read twice": qdq_model(
            extra_nodes=[helper.make_node("Neg", ["h"], ["minus_h"])],
            extra_outputs=[("minus_h", TensorProto.FLOAT, [M, N])],
        ),
        "graph output": qdq_model(extra_outputs=[("h", TensorProto.FLOAT, [M, N])]),
        # a multiplier past float32, which the integer kernels' numerics cannot take
        "multiplier overflows": qdq_model(scales=(1e30, 1e30, 1e-30)),
    }
    for label, (model, _) in cases.items():
        session = qo.InferenceSession(model)
        assert session.fused == [], label
        assert "MatMul" in ops_run(session), label
        written = qo.InferenceSession(model, fuse_qdq=False).run(None, feed_for(model))
        for a, b in zip(session.run(None, feed_for(model)), written):
            assert a.tobytes() == b.tobytes(), label


def test_zero_scale_stays_as_written():
    """QLinearMatMul refuses a zero scale when the session holds the weight; as written, the node that
    meets it says so when the session runs."""
    model, _ = qdq_model(scales=(0.05, 0.0, 0.3))
    session = qo.InferenceSession(model)
    assert session.fused == []
    with pytest.raises(ValueError, match="^InferenceSession.run: node 'dqw' \\(DequantizeLinear\\): .*nonzero"):
        session.run(None, feed_for(model))


def test_scales_computed_at_run_time_or_not_float32_stay_as_written():
    model, _ = qdq_model()
    # y's scale from a graph input: not an initializer
    model.graph.input.append(helper.make_tensor_value_info("y_s_in", TensorProto.FLOAT, []))
    for node in model.graph.node:
        if node.name == "qy":
            node.input[1] = "y_s_in"
    assert qo.InferenceSession(model).fused == []
    # a float16 scale (opset 19+ allows it): QLinearMatMul's scales are float32 here
    model, _ = qdq_model()
    (w_s,) = [t for t in model.graph.initializer if t.name == "w_s"]
    w_s.CopyFrom(numpy_helper.from_array(np.array(0.02, np.float16), "w_s"))
    assert qo.InferenceSession(model).fused == []


def test_int32_and_16_bit_operands_stay_as_written():
    model, _ = qdq_model()
    for t in model.graph.initializer:
        if t.name in ("W", "w_z"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.int32), t.name))
    assert qo.InferenceSession(model).fused == []
    model, _ = qdq_model()
    for t in model.graph.initializer:
        if t.name in ("a_z",):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.uint16), t.name))
    assert qo.InferenceSession(model).fused == []


def test_subgraph_reading_the_product_keeps_it():
    """An If branch that reads the MatMul's output from the outer scope: the output must stay."""
    model, _ = qdq_model()
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["h_out"])], "then", [], [helper.make_tensor_value_info("h_out", 1, None)]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["h_neg"])], "else", [], [helper.make_tensor_value_info("h_neg", 1, None)]
    )
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    model.graph.node.append(helper.make_node("If", ["c"], ["branch"], then_branch=then_graph, else_branch=else_graph))
    model.graph.output.append(helper.make_tensor_value_info("branch", TensorProto.FLOAT, None))
    session = qo.InferenceSession(model)
    assert session.fused == []
    feed = {**feed_for(model), "c": np.array(True)}
    outputs = session.run(None, feed)
    assert outputs[-1].shape == (M, N)


def test_the_callers_model_is_not_modified(tmp_path):
    model, inits = qdq_model()
    before = model.SerializeToString()
    session = qo.InferenceSession(model)
    assert session.fused == ["mm"] and model.SerializeToString() == before
    rewritten, fused = fuse_qdq(model)
    assert fused == ["mm"] and rewritten is not model and model.SerializeToString() == before
    # a path: the session's own copy, rewritten where it lies; the file unchanged
    path = tmp_path / "qdq.onnx"
    onnx.save(model, path)
    feed = feed_for(model)
    from_path = qo.InferenceSession(path)
    assert from_path.fused == ["mm"] and path.read_bytes() == before
    assert from_path.run(["y_q"], feed)[0].tobytes() == expected(model, inits, feed).tobytes()
    assert [i.name for i in from_path.get_inputs()] == ["x"]
    assert [o.name for o in from_path.get_outputs()] == ["y", "y_q"]


def test_fuse_qdq_bad_input():
    model, _ = qdq_model()
    with pytest.raises(TypeError, match="^InferenceSession: fuse_qdq must be True or False, got str"):
        qo.InferenceSession(model, fuse_qdq="yes")


def test_cli_run_fuses_unless_told_not_to(tmp_path, capsys):
    import quantmatmul.cli as cli

    model, inits = qdq_model()
    path, x = tmp_path / "qdq.onnx", tmp_path / "x.npy"
    onnx.save(model, path)
    feed = feed_for(model)
    np.save(x, feed["x"])
    for flags, note in (([], "1 QDQ group fused into QLinearMatMul / QGemm"), (["--no-fuse-qdq"], None)):
        out_dir = tmp_path / ("out" + "".join(flags))
        assert cli.main(["run", str(path), "--input", f"x={x}", "--output-dir", str(out_dir), *flags]) == 0
        text = capsys.readouterr().out
        assert (note in text) if note else ("QLinearMatMul" not in text)
        want = qo.InferenceSession(model, fuse_qdq=not flags).run(["y_q"], feed)[0]
        assert np.load(out_dir / "y_q.npy").tobytes() == want.tobytes()


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_int32_dequantize_before_opset_19_runs(opset):
    """A QDQ model's quantized bias (int32) goes to onnx.reference's DequantizeLinear, which has versions
    from 19 on only: an older opset's node runs the latest (int32 means the same in every version)."""
    bias = np.array([-7, 0, 123456, -(2**31)], np.int32)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["b", "s", "z"], ["y"]), helper.make_node("Add", ["y", "x"], ["out"])],
        "bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(bias, "b"),
            numpy_helper.from_array(np.array(0.125, F32), "s"),
            numpy_helper.from_array(np.array(0, np.int32), "z"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    x = np.ones(4, F32)
    (out,) = qo.InferenceSession(model).run(None, {"x": x})
    assert out.tobytes() == (bias.astype(F32) * F32(0.125) + x).tobytes()
    assert out.tobytes() == peers.session(model).run(None, {"x": x})[0].tobytes()


# ---------------------------------------------------------------------------------------------------
# Element-wise groups: DequantizeLinear -> Add / Mul / Softmax -> QuantizeLinear


def elementwise_model(op, dtype=U8, *, opset=17, relu=False, y_zero_point=None, axis=None, shape=(4, 6, 10)):
    """x, z (float) -> QuantizeLinear -> DequantizeLinear -> op (Add / Mul of both, Softmax of x) [-> Relu]
    -> QuantizeLinear -> y_q, and y_q's DequantizeLinear as y."""
    softmax = op == "Softmax"
    zps = {"x": 7, "z": 200, "y": 90} if dtype == U8 else {"x": -5, "z": 60, "y": -20}
    if y_zero_point is not None:
        zps["y"] = y_zero_point
    scales = {"x": 0.031, "z": 0.047, "y": 1 / 256 if softmax else (0.06 if op == "Add" else 0.08)}
    inits = {f"{k}_s": np.array(v, F32) for k, v in scales.items()}
    inits |= {f"{k}_z": np.array(v, dtype) for k, v in zps.items()}
    names = ["x"] if softmax else ["x", "z"]
    nodes = []
    for n in names:
        nodes += [
            helper.make_node("QuantizeLinear", [n, f"{n}_s", f"{n}_z"], [f"{n}_q"]),
            helper.make_node("DequantizeLinear", [f"{n}_q", f"{n}_s", f"{n}_z"], [f"{n}_dq"]),
        ]
    attrs = {} if axis is None else {"axis": axis}
    nodes.append(helper.make_node(op, [f"{n}_dq" for n in names], ["h"], name="op", **attrs))
    if relu:
        nodes.append(helper.make_node("Relu", ["h"], ["r"]))
    nodes += [
        helper.make_node("QuantizeLinear", ["r" if relu else "h", "y_s", "y_z"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"]),
    ]
    elem = ELEM[np.dtype(dtype)]
    graph = helper.make_graph(
        nodes,
        "elementwise",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in names],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("y_q", elem, list(shape)),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model)
    rng = np.random.default_rng(len(op) + opset)
    feed = {n: (rng.normal(size=shape) * 3).astype(F32) for n in names}
    return model, feed


@ORT_PINNED
@pytest.mark.parametrize("op", ["Add", "Mul", "Softmax"])
def test_uint8_elementwise_groups_fuse_as_onnxruntime(op):
    model, feed = elementwise_model(op)
    session = qo.InferenceSession(model)
    assert session.fused == ["op"]
    assert f"QLinear{op}" in ops_run(session) and op not in ops_run(session)
    ours = session.run(None, feed)
    theirs = peers.session(model).run(None, feed)
    for a, b in zip(ours, theirs):
        assert a.tobytes() == b.tobytes()
    written = qo.InferenceSession(model, fuse_qdq=False).run(["y_q"], feed)[0]
    assert np.abs(written.astype(int) - ours[1].astype(int)).max() <= 1
    if op == "Add":  # ORT's QLinearAdd rounds otherwise than the float graph: the test sees the fusion
        assert (written != ours[1]).any()


def test_elementwise_groups_that_stay_as_written():
    cases = {
        "int8": elementwise_model("Add", S8),
        "int8 softmax": elementwise_model("Softmax", S8),
        "needed relu": elementwise_model("Add", relu=True, y_zero_point=10),
    }
    for label, (model, feed) in cases.items():
        session = qo.InferenceSession(model)
        assert session.fused == [], label
        (a,) = session.run(["y_q"], feed)
        assert a.tobytes() == qo.InferenceSession(model, fuse_qdq=False).run(["y_q"], feed)[0].tobytes(), label


@ORT_PINNED
def test_redundant_relu_and_softmax_axis_defaults():
    model, feed = elementwise_model("Add", relu=True, y_zero_point=0)
    session = qo.InferenceSession(model)
    assert session.fused == ["op"] and "Relu" not in ops_run(session)
    assert session.run(["y_q"], feed)[0].tobytes() == peers.session(model).run(["y_q"], feed)[0].tobytes()
    # Softmax-11 softmaxes the flattened [4, 60] at its default axis 1; from 13 along the last axis alone
    for opset in (11, 13):
        model, feed = elementwise_model("Softmax", opset=opset)
        session = qo.InferenceSession(model)
        fused = [n for n in session._evaluator.rt_nodes_ if n.op_type == "QLinearSoftmax"][0]
        assert (fused._axis, fused._opset) == (1 if opset < 13 else -1, opset)
        ours = session.run(["y_q"], feed)[0]
        assert ours.tobytes() == peers.session(model).run(["y_q"], feed)[0].tobytes()
        written = qo.InferenceSession(model, fuse_qdq=False).run(["y_q"], feed)[0]
        assert np.abs(ours.astype(int) - written.astype(int)).max() <= 1


@pytest.mark.parametrize("dtype", [U8, S8])
def test_data_movement_between_equal_quantizations_moves_the_codes(dtype):
    """DequantizeLinear -> Transpose / Reshape -> QuantizeLinear of one scale and zero point: the node runs
    on the 8-bit codes (ORT's drop-QDQ rule), the same bits as the float round trip; other parameters
    keep the pair."""

    def model_for(q_scale):
        inits = {
            "s": np.array(0.05, F32),
            "z": np.array(9, dtype),
            "s2": np.array(q_scale, F32),
            "shape": np.array([4, 30], np.int64),
        }
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
            helper.make_node("Transpose", ["x_dq"], ["t"], perm=[0, 2, 1], name="transpose"),
            helper.make_node("QuantizeLinear", ["t", "s2", "z"], ["t_q"]),
            helper.make_node("DequantizeLinear", ["t_q", "s2", "z"], ["t_dq"]),
            helper.make_node("Reshape", ["t_dq", "shape"], ["r"], name="reshape"),
            helper.make_node("QuantizeLinear", ["r", "s2", "z"], ["y_q"]),
        ]
        graph = helper.make_graph(
            nodes,
            "moves",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 5])],
            [helper.make_tensor_value_info("y_q", ELEM[np.dtype(dtype)], [4, 30])],
            [numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    x = {"x": np.random.default_rng(2).normal(size=(4, 6, 5)).astype(F32) * 4}
    model = model_for(0.05)
    session = qo.InferenceSession(model)
    assert session.fused == ["transpose", "reshape"]
    assert ops_run(session) == ["QuantizeLinear", "Transpose", "Reshape"]
    (ours,) = session.run(None, x)
    assert ours.tobytes() == qo.InferenceSession(model, fuse_qdq=False).run(None, x)[0].tobytes()
    assert ours.tobytes() == peers.session(model).run(None, x)[0].tobytes()
    # the Transpose requantizes at another scale: its pair stays; the Reshape's (0.07 both sides) goes
    session = qo.InferenceSession(model_for(0.07))
    assert session.fused == ["reshape"]
    assert ops_run(session).count("DequantizeLinear") == 1 and ops_run(session).count("QuantizeLinear") == 2


# ---------------------------------------------------------------------------------------------------
# Random QDQ chains against ONNX Runtime's optimizer


def random_qdq_chain(seed):
    """x [M, K] quantized (uint8) and run through 2-5 random steps, each dequantizing the previous codes and
    quantizing its result at a fresh uint8 scale and zero point: MatMul by an int8 or uint8 weight (per
    tensor or per column, maybe a redundant Relu), Add / Mul with a second quantized input, Softmax,
    Transpose or Reshape (same quantization both sides, or not). Every step's codes are graph outputs."""
    chain = Chain(seed)
    rng, inits, nodes = chain.rng, chain.inits, chain.nodes
    rows, cols = int(rng.integers(2, 65)), int(rng.integers(3, 65))
    shape = [rows, cols]
    chain.input("x", shape)
    quantize, dequantize = chain.quantize, chain.dequantize

    codes = quantize("x", "q0", 0.05, 128)
    for step in range(1, int(rng.integers(3, 7))):
        kind = rng.choice(["MatMul", "MatMul", "Add", "Mul", "Softmax", "Transpose", "Reshape"])
        a, out = dequantize(codes), f"h{step}"
        scale = zero = None
        if kind == "MatMul":
            n = int(rng.integers(3, 40))
            w_type = S8 if rng.random() < 0.6 else U8
            lo, hi = (-64, 64) if (SATURATES and w_type == S8) else (np.iinfo(w_type).min, np.iinfo(w_type).max + 1)
            per_column = rng.random() < 0.5
            inits[f"W{step}"] = rng.integers(lo, hi, (shape[1], n)).astype(w_type)
            inits[f"W{step}_s"] = rng.uniform(0.002, 0.02, (n,) if per_column else ()).astype(F32)
            inits[f"W{step}_z"] = (
                rng.integers(0, 3, (n,) if per_column else ()) + (0 if w_type == S8 else 120)
            ).astype(w_type)
            nodes.append(
                helper.make_node("DequantizeLinear", [f"W{step}", f"W{step}_s", f"W{step}_z"], [f"W{step}_dq"], axis=1)
            )
            nodes.append(helper.make_node("MatMul", [a, f"W{step}_dq"], [out]))
            shape = [shape[0], n]
            if rng.random() < 0.3:  # a Relu the quantization makes redundant (zero point 0)
                nodes.append(helper.make_node("Relu", [out], [out + "r"]))
                out, zero = out + "r", 0
        elif kind in ("Add", "Mul"):
            chain.input(f"z{step}", shape)
            other = dequantize(quantize(f"z{step}", f"zq{step}"))
            nodes.append(helper.make_node(kind, [a, other], [out]))
        elif kind == "Softmax":
            nodes.append(helper.make_node("Softmax", [a], [out], axis=-1))
            scale, zero = 1 / 256, 0
        else:
            same = rng.random() < 0.7
            scale, zero = (inits[f"{codes}_s"].item(), inits[f"{codes}_z"].item()) if same else (None, None)
            if kind == "Transpose":
                nodes.append(helper.make_node("Transpose", [a], [out], perm=[1, 0]))
                shape = shape[::-1]
            else:
                inits[f"shape{step}"] = np.array([shape[1], shape[0]], np.int64)
                nodes.append(helper.make_node("Reshape", [a, f"shape{step}"], [out]))
                shape = shape[::-1]
        codes = quantize(out, f"q{step}", scale, zero)
        chain.output(codes, shape)
    return chain.finish("chain")


@ORT_PINNED
def test_random_qdq_chains_are_onnxruntime_bit_for_bit():
    """40 random uint8 QDQ chains: the session's rewritten graph runs the operators ONNX Runtime's optimized
    graph runs (as many QLinearMatMul / QLinearAdd / QLinearMul / QLinearSoftmax, QuantizeLinear and
    DequantizeLinear: the rules meet ORT's), and gives ORT's codes at every step. (The graph as written
    agrees as well on these small chains: a float sum landing on the other side of a step is rare.)"""

    counted = ("QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSoftmax", "QuantizeLinear", "DequantizeLinear")
    fused = 0
    for seed in range(40):
        model, feed = random_qdq_chain(seed)
        session = qo.InferenceSession(model)
        fused += bool(session.fused)
        ort_session, ort_ops = optimized_session(model)
        ours_ops = ops_run(session)
        assert {op: ours_ops.count(op) for op in counted} == {op: ort_ops.count(op) for op in counted}, seed
        ours, theirs = session.run(None, feed), ort_session.run(None, feed)
        for output, a, b in zip(model.graph.output, ours, theirs):
            assert a.tobytes() == b.tobytes(), (seed, output.name, session.fused)
    assert fused >= 35


def test_compare_checks_each_fused_group_on_onnxruntime_codes():
    """compare() adds a row per group the session fuses: the fused node on the codes ONNX Runtime's optimized
    run feeds it, against the codes it writes; a group ORT's optimizer leaves (int8 activations times a
    uint8 weight: ORT's x86 rules) is listed, not compared."""
    model, _ = qdq_model()
    report = qo.compare(model, feed_for(model))
    (row,) = [r for r in report.rows if r["op_type"].startswith("QDQ")]
    assert report.ok and row["node"] == "mm" and row["op_type"] == "QDQ MatMul -> QLinearMatMul"
    assert row["ok"] is True and row["differing"] == 0 and row["elements"] == M * N
    model, _ = qdq_model(a_type=S8, w_type=U8, y_type=S8)
    report = qo.compare(model, feed_for(model))
    (row,) = [r for r in report.rows if r["op_type"].startswith("QDQ")]
    assert report.ok and row["ok"] is None and "does not make this group one node" in row["note"]
    assert "does not make this group one node" in str(report)
