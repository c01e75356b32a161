"""test_onnx_api.py: quantmatmul.onnx: quantize() against ONNX Runtime's MatMulNBitsQuantizer byte for byte, InferenceSession and compare() on models made by ORT's quantizers, the CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from peer_deviations import deviation

import quantmatmul
import quantmatmul.cli as cli
import quantmatmul.onnx as qo
from quantmatmul import peers
from quantmatmul.quantize_nbits import quantize_nbits
from quantmatmul.reference import matmul_nbits as oracle

F32, F16 = np.float32, np.float16
SATURATES = peers.onnxruntime_u8s8_saturates()  # ORT's u8·s8 AVX2 kernel without VNNI (onnxruntime#16105)


# ---------------------------------------------------------------------------------------------------
# Models, made with onnx.helper


def make_model(nodes, inputs, outputs, weights, opset=21):
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def mlp(dtype=F32, K=200, H=48, N=32, seed=0):
    """x [batch, K] -> MatMul W1 (K not a multiple of the block sizes) -> Relu -> MatMul W2 -> y."""
    rng = np.random.default_rng(seed)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = {"W1": rng.normal(size=(K, H)).astype(dtype), "W2": (rng.normal(size=(H, N)) / 4).astype(dtype)}
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"),
    ]
    return make_model(nodes, [("x", t, ["batch", K])], [("y", t, ["batch", N])], weights)


def mixed(seed=1):
    """A shared weight (two MatMuls), a float16 branch, a Gemm with transB=1 and C, a Gemm with alpha/beta, a
    Gemm with transA=1 (not quantized) and a MatMul of two activations."""
    rng = np.random.default_rng(seed)
    w = {
        "Ws": rng.normal(size=(64, 40)).astype(F32),
        "W16": rng.normal(size=(40, 24)).astype(F16),
        "Wt": rng.normal(size=(24, 40)).astype(F32),  # Gemm transB=1: [N, K]
        "C": rng.normal(size=(24,)).astype(F32),
        "Wg": rng.normal(size=(24, 16)).astype(F32),
        "C2": rng.normal(size=(1, 16)).astype(F32),
        "Wb": rng.normal(size=(16, 16)).astype(F32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "Ws"], ["s1"], name="shared_a"),
        helper.make_node("MatMul", ["x", "Ws"], ["s2"], name="shared_b"),
        helper.make_node("Add", ["s1", "s2"], ["s"], name="add"),
        helper.make_node("Cast", ["s"], ["s16"], to=TensorProto.FLOAT16, name="cast16"),
        helper.make_node("MatMul", ["s16", "W16"], ["h16"], name="half"),
        helper.make_node("Cast", ["h16"], ["h"], to=TensorProto.FLOAT, name="cast32"),
        helper.make_node("Gemm", ["s", "Wt", "C"], ["g1"], name="gemm_t", transB=1),
        helper.make_node("Add", ["g1", "h"], ["g"], name="add2"),
        helper.make_node("Gemm", ["g", "Wg", "C2"], ["z"], name="gemm_ab", alpha=0.5, beta=2.0),
        helper.make_node("Transpose", ["z"], ["zt"], name="transpose"),
        helper.make_node("Gemm", ["zt", "Wb"], ["u"], name="gemm_ta", transA=1),
        helper.make_node("MatMul", ["u", "zt"], ["y"], name="two_activations"),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, [3, 64])], [("y", TensorProto.FLOAT, [3, 3])], w)


def ort_quantizer(model, **kw):
    """The model as ONNX Runtime's MatMulNBitsQuantizer (1.32) writes it (it modifies its argument: a copy)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    q = MatMulNBitsQuantizer(copy, **kw)
    q.process()
    return q.model.model


def run_ort(model, feed):
    return peers.session(model).run(None, feed)


def x_for(model, batch=3, seed=5):
    arg = qo.InferenceSession(model).get_inputs()[0]
    shape = [batch if not isinstance(d, int) else d for d in arg.shape]
    dtype = {"tensor(float)": F32, "tensor(float16)": F16}[arg.type]
    return {arg.name: np.random.default_rng(seed).normal(size=shape).astype(dtype)}


# ---------------------------------------------------------------------------------------------------
# quantize()


@pytest.mark.parametrize(
    "bits, block_size, symmetric, accuracy_level",
    [
        (4, 32, False, None),
        (4, 128, True, 4),
        (2, 16, False, None),
        (2, 64, True, 0),
        (8, 32, False, 4),
        (8, 256, True, None),
        (4, 16, False, 1),
    ],
)
@pytest.mark.parametrize("dtype", [F32, F16])
def test_rtn_is_onnxruntime_quantizer_byte_for_byte(bits, block_size, symmetric, accuracy_level, dtype):
    model = mlp(dtype)
    ours = qo.quantize(
        model, bits=bits, block_size=block_size, method="rtn", symmetric=symmetric, accuracy_level=accuracy_level
    )
    onnx.checker.check_model(ours)
    ref = ort_quantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level)
    ours_inits = {t.name: t for t in ours.graph.initializer}
    ref_inits = {t.name: t for t in ref.graph.initializer}
    assert list(ours_inits) == list(ref_inits)
    for name, tensor in ref_inits.items():
        assert ours_inits[name].SerializeToString() == tensor.SerializeToString(), name
    for a, b in zip(ours.graph.node, ref.graph.node, strict=True):
        assert a == b  # op type, domain, name, inputs, outputs, every attribute
    assert ours.opset_import == ref.opset_import and ours.graph.input == ref.graph.input
    assert ours.SerializeToString() == ref.SerializeToString()  # the whole model, nothing else differs


def test_shared_weight_quantized_once_and_gemm_forms():
    model = mixed()
    ours, rows = qo._quantize.quantize_model(model, bits=4, block_size=16, method="rtn")
    onnx.checker.check_model(ours)
    names = [t.name for t in ours.graph.initializer]
    assert len(names) == len(set(names))
    assert names.count("Ws_Q4") == 1 and "Ws" not in names and "W16" not in names
    users = [n.name for n in ours.graph.node if "Ws_Q4" in n.input]
    assert users == ["shared_a_Q4", "shared_b_Q4"]
    by_node = {r.node: r for r in rows}
    assert not by_node["shared_a"].shared and by_node["shared_b"].shared
    assert (by_node["gemm_t"].K, by_node["gemm_t"].N) == (40, 24)  # transB=1: B [N, K] quantized as B.T
    assert "transA" in by_node["gemm_ta"].reason and "two_activations" in by_node
    assert "not a constant initializer" in by_node["two_activations"].reason
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("MatMulNBits") == 5 and ops.count("Gemm") == 1
    # the same weights through ORT's quantizer where it has them (MatMul only): same bytes
    ref = {t.name: t for t in ort_quantizer(model, bits=4, block_size=16).graph.initializer}
    for t in ours.graph.initializer:
        if t.name in ref and t.name.startswith(("Ws_", "W16_")):
            assert t.SerializeToString() == ref[t.name].SerializeToString()
    # 8 bits: the float model (alpha folded into the weight, beta into C) to within the quantization error
    feed = x_for(model)
    (y_float,) = run_ort(model, feed)
    fine = qo.quantize(model, bits=8, block_size=16)
    for y in (qo.InferenceSession(fine).run(None, feed)[0], run_ort(fine, feed)[0]):
        assert np.linalg.norm(y - y_float) <= 0.02 * np.linalg.norm(y_float)
    assert qo.compare(ours, feed).ok


def test_exclude_and_logged_reasons(caplog):
    model = mlp()
    with caplog.at_level(logging.INFO, logger="quantmatmul.onnx"):
        ours = qo.quantize(model, block_size=32, exclude=["mm2"])
    ops = {n.name: n.op_type for n in ours.graph.node}
    assert ops == {"mm1_Q4": "MatMulNBits", "relu": "Relu", "mm2": "MatMul"}
    assert {t.name for t in ours.graph.initializer} == {"W1_Q4", "W1_scales", "W1_zero_points", "W2"}
    assert "mm2: excluded" in caplog.text
    q = qo.quantize(model, block_size=32, exclude="mm1")  # one name
    assert [n.op_type for n in q.graph.node] == ["MatMul", "Relu", "MatMulNBits"]


def test_input_model_never_modified(tmp_path):
    model = mixed()
    before = model.SerializeToString()
    qo.quantize(model, block_size=16)
    qo.InferenceSession(model).run(None, x_for(model))
    assert model.SerializeToString() == before
    # a path with an external data file: read with it, both files untouched
    path = tmp_path / "ext.onnx"
    onnx.save(mlp(), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    files = {p: p.read_bytes() for p in tmp_path.iterdir()}
    q = qo.quantize(str(path), block_size=32, method="rtn")
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert q.SerializeToString() == qo.quantize(mlp(), block_size=32, method="rtn").SerializeToString()
    quantized = tmp_path / "q.onnx"
    onnx.save(q, quantized)
    before = quantized.read_bytes()
    qo.compare(quantized)
    qo.InferenceSession(quantized).run(None, x_for(q))
    assert quantized.read_bytes() == before


@pytest.mark.parametrize("method, bits", [("mse", 4), ("hqq", 4), ("mse", 2), ("mse", 8), ("hqq", 2)])
def test_mse_and_hqq_models_run_in_onnxruntime(method, bits):
    model = mlp()
    q = qo.quantize(model, bits=bits, block_size=32, method=method)
    onnx.checker.check_model(q)
    rtn = qo.quantize(model, bits=bits, block_size=32, method="rtn")
    errors = {
        m: [r.error for r in qo._quantize.quantize_model(model, bits=bits, block_size=32, method=m)[1]]
        for m in (method, "rtn")
    }
    assert all(a <= b for a, b in zip(errors[method], errors["rtn"]))  # never worse than rtn
    report = qo.compare(q, x_for(q))
    assert report.ok, str(report)
    assert [r["op_type"] for r in report.rows] == ["MatMulNBits", "MatMulNBits"]
    assert len(q.graph.initializer) == len(rtn.graph.initializer)


@pytest.mark.parametrize("bits", [3, 6])
def test_widths_onnxruntime_lacks_run_here(bits):
    q = qo.quantize(mlp(), bits=bits, block_size=32)
    onnx.checker.check_model(q)
    feed = x_for(q)
    (y,) = qo.InferenceSession(q).run(None, feed)
    # the float model with the weights MatMulNBits dequantizes
    w = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    W1, W2 = (
        quantmatmul.dequantize_nbits(w[f"{n}_Q{bits}"], w[f"{n}_scales"], w[f"{n}_zero_points"], K=K, N=N, bits=bits,
                                     block_size=32)
        for n, K, N in (("W1", 200, 48), ("W2", 48, 32))
    )  # fmt: skip
    want = np.maximum(feed["x"] @ W1, 0) @ W2
    assert np.linalg.norm(y - want) <= 1e-5 * np.linalg.norm(want)
    with pytest.raises(ValueError, match="^compare: ONNX Runtime cannot run the model"):
        qo.compare(q, feed)


def test_quantize_bad_input(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n" * 10)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    no_weights = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [("a", TensorProto.FLOAT, [2, 3]), ("b", TensorProto.FLOAT, [3, 4])],
        [("y", TensorProto.FLOAT, [2, 4])],
        {},
    )
    cases = [
        (dict(model=str(text)), ValueError, "is not an ONNX model"),
        (dict(model=str(empty)), ValueError, "is not an ONNX model"),
        (dict(model=str(tmp_path / "missing.onnx")), ValueError, "is not a file"),
        (dict(model=42), TypeError, "model must be"),
        (dict(model=no_weights), ValueError, "no quantizable node.*mm: B is not a constant"),
        (dict(model=mlp(), bits=9), ValueError, "bits must be in 2..8"),
        (dict(model=mlp(), bits=4.0), TypeError, "bits must be an integer"),
        (dict(model=mlp(), block_size=48), ValueError, "block_size must be a power of two"),
        (dict(model=mlp(), method="gptq"), ValueError, "method .gptq. needs calibration data"),
        (dict(model=mlp(), method="hqq", symmetric=True), ValueError, "cannot be symmetric"),
        (dict(model=mlp(), accuracy_level=5), ValueError, "accuracy_level"),
        (dict(model=mlp(), exclude=["mm9"]), ValueError, "exclude names nodes the model does not have: 'mm9'"),
        (dict(model=mlp(), exclude=["mm1", "mm2"]), ValueError, "no quantizable node"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match="^quantize: .*" + message):
            qo.quantize(**kwargs)


# ---------------------------------------------------------------------------------------------------
# InferenceSession


def expose(model, op_types):
    """A copy of model with every output of the op_types nodes added as a graph output."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type in op_types:
            copy.graph.output.extend(onnx.ValueInfoProto(name=o) for o in node.output)
    return copy


def test_session_on_matmul_nbits_within_the_documented_bound():
    q = qo.quantize(mlp(K=200, H=48), bits=4, block_size=32, accuracy_level=4)
    q.graph.node.pop()  # one layer: the model output is the MatMulNBits output
    q.graph.node.pop()
    q.graph.output[0].name = "h"
    q.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 48
    feed = x_for(q, batch=5)
    session = qo.InferenceSession(q)
    assert [(a.name, a.shape, a.type) for a in session.get_inputs()] == [("x", ["batch", 200], "tensor(float)")]
    assert [(a.name, a.shape, a.type) for a in session.get_outputs()] == [("h", ["batch", 48], "tensor(float)")]
    (ours,) = session.run(None, feed)
    (theirs,) = run_ort(q, feed)
    assert held(session) == [quantmatmul.MatMulNBits]  # the constant weight is held, prepared once
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    args = (feed["x"], inits["W1_Q4"], inits["W1_scales"], inits["W1_zero_points"])
    layout = dict(K=200, N=48, bits=4, block_size=32)
    exact = oracle.matmul_nbits(*args, **layout)
    bound = oracle.error_bound(*args, **layout, level=4, out_dtype=F32)
    assert np.all(np.abs(ours - exact) <= bound) and np.all(np.abs(theirs - exact) <= bound)


def held(session):
    """The classes of the weights the session's QLinearMatMul / MatMulNBits nodes hold (packed once)."""
    return [type(op._held) for op in session._evaluator.rt_nodes_ if op.op_type in ("QLinearMatMul", "MatMulNBits")]


class Batches:
    """A CalibrationDataReader over a few random batches."""

    def __init__(self, name, K, n=4, seed=0):
        rng = np.random.default_rng(seed)
        self.batches = iter([{name: rng.normal(size=(4, K)).astype(F32)} for _ in range(n)])

    def get_next(self):
        return next(self.batches, None)


def ort_quantized(kind, tmp_path, **options):
    """mlp() through ONNX Runtime's quantize_dynamic or quantize_static (QOperator or QDQ)."""
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    src, dst = tmp_path / f"float_{kind}.onnx", tmp_path / f"{kind}.onnx"
    onnx.save(mlp(), src)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # ORT's quantizers log advice at WARNING on the root logger
    try:
        if kind == "dynamic":
            quantize_dynamic(src, dst, **options)
        else:
            fmt = QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator
            quantize_static(src, dst, Batches("x", 200), quant_format=fmt, **options)
    finally:
        root.setLevel(level)
    return onnx.load(dst)


@pytest.mark.parametrize("per_channel", [False, True])
def test_session_on_quantize_dynamic(per_channel, tmp_path):
    from onnxruntime.quantization import QuantType

    # int8 weights: reduce_range keeps them in 7 bits, where ORT's u8·s8 kernel cannot saturate; per channel:
    # uint8 weights (u8·u8, per-column zero points). Bit for bit everywhere.
    options = {"weight_type": QuantType.QUInt8, "per_channel": True} if per_channel else {"reduce_range": SATURATES}
    model = ort_quantized("dynamic", tmp_path, **options)
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= {n.op_type for n in model.graph.node}
    exposed = expose(model, ("MatMulInteger", "DynamicQuantizeLinear"))
    feed = x_for(model, batch=6)
    ours = qo.InferenceSession(exposed).run(None, feed)
    theirs = run_ort(exposed, feed)
    names = [o.name for o in exposed.graph.output]
    for name, a, b in zip(names, ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype.kind in "iu" or a.ndim == 0:  # int32 sums, uint8 codes, scales and zero points
            assert a.tobytes() == b.tobytes(), name
        else:
            assert np.allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max()), name
    report = qo.compare(model, feed)
    assert report.ok, str(report)
    assert [r["op_type"] for r in report.rows] == ["DynamicQuantizeLinear", "MatMulInteger"] * 2


def test_compare_names_saturated_nodes(tmp_path):
    """u8 activations near 255 times s8 weights of -127: adjacent pairs sum to -64770, beyond int16."""
    w = {"W": -np.ones((64, 8), F32)}
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [("x", TensorProto.FLOAT, [2, 64])],
        [("y", TensorProto.FLOAT, [2, 8])],
        w,
    )
    from onnxruntime.quantization import quantize_dynamic

    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "d.onnx")
    feed = {"x": np.full((2, 64), 0.9, F32)}
    report = qo.compare(tmp_path / "d.onnx", feed)
    (row,) = [r for r in report.rows if r["op_type"] == "MatMulInteger"]
    assert report.ok is (not SATURATES) and row["ok"] is (not SATURATES)
    if SATURATES:
        assert row["differing"] == 16 and "saturates" in row["note"] and "onnxruntime#16105" in str(report)
        assert report.differing_nodes == [row["node"]]
    (y,) = qo.InferenceSession(tmp_path / "d.onnx").run(None, feed)
    assert np.allclose(y, -0.9 * 64, rtol=1e-2)  # the spec's sum


@pytest.mark.parametrize("kind", ["qoperator", "qdq"])
@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_session_on_quantize_static(kind, activation, per_channel, tmp_path):
    from onnxruntime.quantization import QuantType

    # On CPUs where ORT's u8·s8 kernel saturates, 7-bit weights (reduce_range): uint8 activations go through
    # that kernel, and so do int8 ones in ORT's fused QDQ path (a per-channel int8 QDQ model without
    # reduce_range came out 6.6 % off quantmatmul and off ORT's own unfused run, which agree bit for bit)
    model = ort_quantized(
        kind,
        tmp_path,
        per_channel=per_channel,
        activation_type=getattr(QuantType, activation),
        weight_type=QuantType.QInt8,
        reduce_range=SATURATES,
    )
    ops = {n.op_type for n in model.graph.node}
    assert ("QLinearMatMul" in ops) == (kind == "qoperator") and "QuantizeLinear" in ops
    feed = x_for(model, batch=7)
    (ours,) = qo.InferenceSession(model).run(None, feed)
    (theirs,) = run_ort(model, feed)
    # integer all the way: bit for bit (QDQ: both sessions fuse DQ -> MatMul -> Q into QLinearMatMul)
    assert ours.tobytes() == theirs.tobytes()
    assert held(qo.InferenceSession(model)) == [quantmatmul.QLinearMatMul] * 2
    if kind == "qdq":
        assert qo.InferenceSession(model).fused == ["mm1", "mm2"]
        # the graph as written (fuse_qdq=False) rounds a float32 sum instead: the first layer's quantized
        # output at most one step from ORT's fused one (later layers carry it on)
        (first,) = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r"]
        exposed = expose(model, ())
        exposed.graph.output.append(onnx.ValueInfoProto(name=first))
        written = qo.InferenceSession(exposed, fuse_qdq=False)
        assert written.fused == [] and held(written) == []
        a, b = written.run([first], feed)[0], run_ort(exposed, feed)[1]
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
        (unfused,) = written.run(["y"], feed)
        assert np.linalg.norm(unfused - theirs) <= 0.05 * np.linalg.norm(theirs)
    report = qo.compare(model, feed, numerics="onnxruntime")
    assert report.ok, str(report)
    quantized = [n.name for n in model.graph.node if n.op_type in qo._compare.COMPARED]
    # QDQ: then a row per group the session fuses, checked on the codes ORT's optimized run feeds it
    groups = ["mm1", "mm2"] if kind == "qdq" else []
    assert [r["node"] for r in report.rows] == quantized + groups
    for row in report.rows[len(quantized) :]:  # int8: ORT on x86 fuses through its int8-to-uint8 pairs
        assert row["op_type"] == "QDQ MatMul -> QLinearMatMul"
        assert row["ok"] is (True if activation == "QUInt8" else None)
    text = str(report)
    assert text.splitlines()[0].split()[:3] == ["node", "op_type", "elements"]
    assert all(name in text for name in quantized) and "all agree" in text


def test_session_numerics_reach_qlinear_matmul():
    """y = a * 1/6 with a = 3: a tie, 10 in the 'onnxruntime' and 'exact' numerics, 11 in 'onnx-reference'."""
    f, u = np.float32, np.uint8
    inits = {
        "b": np.array([[1]], u),
        "one": np.array(1, f),
        "zero": np.array(0, u),
        "six": np.array(6, f),
        "ten": np.array(10, u),
    }
    node = helper.make_node("QLinearMatMul", ["a", "one", "zero", "b", "one", "zero", "six", "ten"], ["y"])
    model = make_model([node], [("a", TensorProto.UINT8, [1, 1])], [("y", TensorProto.UINT8, [1, 1])], inits)
    a = {"a": np.array([[3]], u)}
    got = {
        n: int(qo.InferenceSession(model, numerics=n).run(None, a)[0].item())
        for n in ("onnxruntime", "exact", "onnx-reference")
    }
    assert got == {"onnxruntime": 10, "exact": 10, "onnx-reference": 11}


def test_session_bad_input():
    session = qo.InferenceSession(mlp())
    good = {"x": np.zeros((2, 200), F32)}
    cases = [
        ({"x": np.zeros((2, 200), np.float64)}, None, TypeError, "input 'x' must be tensor\\(float\\)"),
        ({"x": np.zeros((2, 100), F32)}, None, ValueError, "input 'x' must have shape \\[batch, 200\\]"),
        ({"x": np.zeros(200, F32)}, None, ValueError, "input 'x' must have shape"),
        ({}, None, ValueError, "input 'x' is missing"),
        ({**good, "z": good["x"]}, None, ValueError, "no input named 'z'"),
        (good, ["h"], ValueError, "no output named 'h'"),
        ([good["x"]], None, TypeError, "input_feed must be a dict"),
    ]
    for feed, outputs, error, message in cases:
        with pytest.raises(error, match="^InferenceSession.run: (the model has )?" + message):
            session.run(outputs, feed)
    with pytest.raises(ValueError, match="^InferenceSession: numerics must be"):
        qo.InferenceSession(mlp(), numerics="fast")
    node = helper.make_node("QLinearMatMul", ["a", "s", "z", "b", "s", "z", "s", "z"], ["y"], name="qmm")
    bad = make_model(
        [node],
        [("a", TensorProto.UINT8, [1, 2])],
        [("y", TensorProto.UINT8, [1, 3])],
        {"b": np.ones((3, 3), np.uint8), "s": np.array(1, F32), "z": np.array(0, np.uint8)},
    )
    with pytest.raises(ValueError, match="^InferenceSession.run: node 'qmm' \\(QLinearMatMul\\): .*inner dimensions"):
        qo.InferenceSession(bad).run(None, {"a": np.ones((1, 2), np.uint8)})


def test_dynamic_quantize_linear_as_onnxruntime():
    rng = np.random.default_rng(3)
    inf = np.inf
    cases = [
        rng.normal(size=(5, 7)).astype(F32),
        np.zeros((3,), F32),
        np.abs(rng.normal(size=9)).astype(F32),
        -np.abs(rng.normal(size=9)).astype(F32),
        np.array([1e-30, -2e-30], F32),
        np.zeros((0, 4), F32),
        np.array([-0.0, 0.0, -0.0], F32),
        # a range past FLT_MAX (scale inf), a scale that underflows to 0: the zero point's NaN quotient is 255
        np.array([3e38, -3e38, 1.0], F32),
        np.array([1e-45, 3e-45], F32),
        # infinities: scale inf, x / inf and inf / inf (NaN: 0)
        np.array([1, inf, -2], F32),
        np.array([1, -inf, -2], F32),
        np.array([inf, -inf], F32),
        np.array([-inf], F32),
        # the range pass and the quantization in tasks over the threads, lengths off the vector steps
        (rng.normal(size=(3, 70001)) * 5 + 2).astype(F32),
        rng.normal(size=(17,)).astype(F32) - 9,
    ]
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    for x in cases:
        model = make_model(
            [node],
            [("x", TensorProto.FLOAT, list(x.shape))],
            [("y", TensorProto.UINT8, list(x.shape)), ("s", TensorProto.FLOAT, []), ("z", TensorProto.UINT8, [])],
            {},
            opset=11,
        )
        ours = qo.InferenceSession(model).run(None, {"x": x})
        theirs = run_ort(model, {"x": x})
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), x


def test_dynamic_quantize_linear_leaves_nan_out_of_the_range():
    # ONNX Runtime's NaN handling follows its vector loop's lanes (a NaN counts or not by where it
    # sits); quantmatmul leaves every NaN out of min and max, and quantizes it to 0, as ORT does.
    from quantmatmul.onnx._session import dynamic_quantize_linear

    rng = np.random.default_rng(8)
    for n in (3, 16, 41, 200003):
        x = rng.normal(size=n).astype(F32)
        with_nan = x.copy()
        with_nan[rng.integers(0, n, 1 + n // 10)] = np.nan
        y, scale, zero_point = dynamic_quantize_linear(with_nan)
        want = dynamic_quantize_linear(with_nan[~np.isnan(with_nan)])
        assert scale.tobytes() == want[1].tobytes() and zero_point == want[2]
        assert np.all(y[np.isnan(with_nan)] == 0)
        assert np.array_equal(y[~np.isnan(with_nan)], want[0])
    y, scale, zero_point = dynamic_quantize_linear(np.full(40, np.nan, F32))  # no value: the range [0, 0]
    assert scale == 1 and zero_point == 0 and not y.any()
    with pytest.raises(TypeError, match="^dynamic_quantize_linear: x must be float32"):
        dynamic_quantize_linear(np.ones(3, np.float64))


def erf_model(tensor_type, shape):
    node = helper.make_node("Erf", ["x"], ["y"])
    return make_model([node], [("x", tensor_type, shape)], [("y", tensor_type, shape)], {}, opset=13)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16], ids=["float32", "float16", "float64", "bfloat16"]
)
def test_erf_is_onnx_reference_bit_for_bit(dtype):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(11)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 1e-20, 3.9, -3.92, 10.0, 0.5, -1.0, 65504.0]
    values = np.concatenate([rng.normal(size=150001) * 2, rng.uniform(-6, 6, 20000), special]).astype(dtype)
    model = erf_model(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [values.size])
    want = ReferenceEvaluator(model).run(None, {"x": values})[0]
    got = qo.InferenceSession(model).run(None, {"x": values})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    if sys.version_info >= (3, 11):  # math.erf is the C library's erf from CPython 3.11 on
        assert got.tobytes() == want.tobytes()
    else:
        assert np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=2**-22, atol=0, equal_nan=True)


def layer_norm_model(x_type, x_shape, scale_shape, bias_shape, attributes, outputs=3):
    inputs = [("x", x_type, list(x_shape)), ("scale", x_type, list(scale_shape))]
    if bias_shape is not None:
        inputs.append(("bias", x_type, list(bias_shape)))
    names = ["y", "mean", "inv_std_dev"][:outputs]
    axis = attributes.get("axis", -1) % len(x_shape)
    reduced = list(x_shape[:axis]) + [1] * (len(x_shape) - axis)
    shapes = [list(x_shape), reduced, reduced][:outputs]
    node = helper.make_node("LayerNormalization", [n for n, _, _ in inputs], names, **attributes)
    return make_model([node], inputs, [(n, x_type, shape) for n, shape in zip(names, shapes)], {}, opset=17)


def test_layer_normalization_is_onnx_reference_bit_for_bit(monkeypatch):
    """The session's LayerNormalization (C++: numpy's pairwise float32 sums, then numpy's float32 steps)
    gives onnx.reference's bits on every output: rows of 1 to 1000 columns (numpy's sum one after
    another below 8, eight running sums up to 128, halves above), an axis before the last, a scale of
    leading ones, no bias, epsilon 0 on a constant row (1 / 0), rows of -0.0 (numpy's sum +0.0), inf
    and NaN; the other cases (float16 x, a broadcast scalar scale) onnx.reference's own code."""
    from quantmatmul.onnx import _session

    native = []
    layer_norm_rows = _session._core.layer_norm_rows
    monkeypatch.setattr(
        _session._core, "layer_norm_rows", lambda *a: native.append(1) or layer_norm_rows(*a), raising=True
    )
    rng = np.random.default_rng(17)
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    cases = [  # x type, x shape, scale, bias, attributes, the C++ path
        (f32, (8, 16, 384), (384,), (384,), {"epsilon": 1e-12}, True),
        (f32, (8, 16, 384), (384,), None, {}, True),
        (f32, (3, 5, 7), (5, 7), (5, 7), {"axis": 1}, True),
        (f32, (4, 129), (129,), (129,), {"axis": -1, "epsilon": 1e-3}, True),
        (f32, (2, 3, 128), (1, 128), (128,), {}, True),
        (f32, (6, 1000), (1000,), (1000,), {"axis": 1}, True),
        (f32, (7, 1, 3), (3,), (3,), {"axis": -2}, True),
        (f32, (6, 8), (8,), (8,), {"epsilon": 0.0}, True),
        (f32, (5, 7), (1,), (7,), {}, False),  # a scale broadcast from one value
        (f16, (4, 33), (33,), (33,), {}, False),
    ]
    for x_type, x_shape, scale_shape, bias_shape, attributes, in_cpp in cases:
        dtype = helper.tensor_dtype_to_np_dtype(x_type)
        x = (rng.standard_normal(x_shape) * rng.choice([1e-3, 1.0, 50.0], size=x_shape)).astype(dtype)
        if x_shape == (6, 8):
            x[0], x[1], x[2], x[3, 1], x[4, 2] = -0.0, 0.0, 3.0, np.inf, np.nan
        feed = {"x": x, "scale": rng.standard_normal(scale_shape).astype(dtype)}
        if bias_shape is not None:
            feed["bias"] = rng.standard_normal(bias_shape).astype(dtype)
        for outputs in (1, 3):
            model = layer_norm_model(x_type, x_shape, scale_shape, bias_shape, attributes, outputs)
            with np.errstate(all="ignore"):
                want = ReferenceEvaluator(model).run(None, feed)
            native.clear()
            got = qo.InferenceSession(model).run(None, feed)
            assert bool(native) == in_cpp, (x_shape, attributes)
            for w, g in zip(want, got, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), (x_shape, attributes)


def test_reshape_is_onnx_references(monkeypatch):
    """The session's Reshape (np.reshape on the shape's values, not onnx.reference's per-call copies) gives
    onnx.reference's result: -1, a 0 copying the input's dimension, allowzero with an empty input, and
    numpy's errors; a 0 past the input's dimensions is a ValueError naming the node."""
    from quantmatmul.onnx import _session

    referred = []
    reference_op = _session._reference_op
    monkeypatch.setattr(_session, "_reference_op", lambda op: referred.append(op) or reference_op(op))
    cases = [  # input shape, shape, allowzero
        ((8, 16, 384), [8, 16, 12, 32], 0),
        ((8, 16, 384), [-1, 384], 0),
        ((2, 3, 4), [0, -1], 0),
        ((8, 16, 384), [0, 0, 12, 32], 0),
        ((2, 3, 4), [0, 0, 0, -1], 0),
        ((2, 12), [0, 3, 4], 0),
        ((0, 3), [0, 3, 1], 1),
        ((6,), [6, 1, 1], 0),
    ]
    for x_shape, shape, allowzero in cases:
        node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=allowzero)
        y_shape = ["d"] * len(shape)
        model = make_model(
            [node],
            [("x", TensorProto.UINT8, list(x_shape)), ("shape", TensorProto.INT64, [len(shape)])],
            [("y", TensorProto.UINT8, y_shape)],
            {},
            opset=14,
        )
        x = np.arange(np.prod(x_shape), dtype=np.uint8).reshape(x_shape)
        feed = {"x": x, "shape": np.array(shape, np.int64)}
        want = ReferenceEvaluator(model).run(None, feed)[0]
        got = qo.InferenceSession(model).run(None, feed)[0]
        assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want), (x_shape, shape)
    assert not referred
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = make_model(
        [node],
        [("x", TensorProto.UINT8, [6]), ("shape", TensorProto.INT64, [1])],
        [("y", TensorProto.UINT8, ["d"])],
        {},
        opset=14,
    )
    with pytest.raises(ValueError, match="cannot reshape array of size 6"):
        qo.InferenceSession(model).run(None, {"x": np.zeros(6, np.uint8), "shape": np.array([4], np.int64)})
    model = make_model(  # a 0 past the input's dimensions (onnx.reference: an IndexError naming nothing)
        [node],
        [("x", TensorProto.UINT8, [6]), ("shape", TensorProto.INT64, [2])],
        [("y", TensorProto.UINT8, ["d", "e"])],
        {},
        opset=14,
    )
    with pytest.raises(ValueError, match=r"^InferenceSession.run: a Reshape node: Reshape: shape \[6, 0\] has a 0"):
        qo.InferenceSession(model).run(None, {"x": np.zeros(6, np.uint8), "shape": np.array([6, 0], np.int64)})
    assert not referred


def test_erf_paths_are_the_c_library_bit_for_bit():
    # Every path of the session's Erf against the C library's erf (the "libm" path) on a stride
    # through all 2^32 float32 bit patterns (NaN ones included), the edges of the kernel's
    # intervals, the saturation and the small-|x| limit, and random values of both signs; a path
    # off this CPU is refused. (Every float32 was checked once too: docs/onnx.md.)
    from quantmatmul import _core

    paths = _core.erf_paths()
    assert paths[0] == "libm" and set(paths) <= {"libm", "avx512", "avx512-emulated"}
    saturate = np.float32(3.9192059)
    edges = [0.5 * i for i in range(9)] + [2.0**-20, float(saturate)]
    near = np.array([np.nextafter(np.float32(e), np.float32(np.inf * s)) for e in edges for s in (1, -1)], F32)
    rng = np.random.default_rng(13)
    x = np.concatenate(
        [
            np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(F32),
            np.array(edges, F32),
            near,
            -np.array(edges, F32),
            (rng.standard_normal(300000) * 2).astype(F32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-38], F32),
        ]
    )
    want = np.empty_like(x)
    assert _core.erf(x, want, "libm")
    assert np.isnan(want[np.isnan(x)]).all() and want[x == saturate] == 1
    for path in paths:
        got = np.full_like(x, 7.0)
        assert _core.erf(x, got, path)
        assert got.tobytes() == want.tobytes(), path
        assert _core.erf(x[:13], got[:13], path)  # shorter than one vector
        assert got[:13].tobytes() == want[:13].tobytes(), path
    assert not _core.erf(x, np.empty_like(x), "no such path")
    if "avx512" not in paths:
        assert not _core.erf(x, np.empty_like(x), "avx512")


def test_erf_path_follows_the_kernel_level():
    from quantmatmul import _core

    before = quantmatmul.cpu_info()["isa"]
    try:
        quantmatmul.set_isa("avx2" if "avx2" in quantmatmul.cpu_info()["available_isas"] else "portable")
        assert _core.erf_path() == "libm"
        quantmatmul.set_isa(quantmatmul.cpu_info()["best_isa"])
        assert _core.erf_path() == ("avx512" if "avx512" in _core.erf_paths() else "libm")
    finally:
        quantmatmul.set_isa(before)


@pytest.mark.parametrize(
    "variable, value",
    [("MALLOC_TOP_PAD_", "131072"), ("MALLOC_TRIM_THRESHOLD_", "0"), ("GLIBC_TUNABLES", "glibc.malloc.top_pad=0")],
)
def test_the_first_session_keeps_the_heap_unless_the_environment_tunes_malloc(monkeypatch, variable, value):
    import platform

    from quantmatmul import _core
    from quantmatmul.onnx import _session

    calls = []
    monkeypatch.setattr(_session._core, "keep_heap", lambda *sizes: calls.append(sizes) or True)
    for name in (*_session._MALLOC_ENVIRONMENT, "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_session, "_heap_kept", False)
    monkeypatch.setenv(variable, value)  # the user's own setting: malloc left alone
    qo.InferenceSession(mlp())
    assert calls == []
    monkeypatch.setattr(_session, "_heap_kept", False)
    monkeypatch.delenv(variable)
    qo.InferenceSession(mlp())
    qo.InferenceSession(mlp())  # once per process
    assert calls == [(_session.HEAP_TOP_PAD, _session.HEAP_MMAP_THRESHOLD)] == [(256 << 20, 32 << 20)]
    monkeypatch.undo()
    assert _core.keep_heap(-1, 0) is False and _core.keep_heap(0, 2**31) is False  # out of range: nothing set
    if platform.libc_ver()[0] == "glibc":
        assert _core.keep_heap(_session.HEAP_TOP_PAD, _session.HEAP_MMAP_THRESHOLD) is True


def test_erf_in_a_model_reads_views_and_keeps_shapes():
    # Erf after a Transpose (a view in onnx.reference): read in place of its strides, shape kept
    x = np.random.default_rng(12).normal(size=(3, 4, 5)).astype(F32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]), helper.make_node("Erf", ["t"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 4, 5])], [("y", TensorProto.FLOAT, [5, 3, 4])], {})
    got = qo.InferenceSession(model).run(None, {"x": x})[0]
    want = np.vectorize(__import__("math").erf, otypes=["f"])(x.transpose(2, 0, 1))
    assert got.shape == (5, 3, 4) and np.array_equal(got, want)


def test_matmul_integer_is_exact_int32():
    from quantmatmul.onnx._session import matmul_integer

    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (3, 5, 33)).astype(np.uint8)
    b = rng.integers(-128, 128, (33, 6)).astype(np.int8)
    a_zp, b_zp = np.uint8(7), rng.integers(-128, 128, 6).astype(np.int8)
    want = (a.astype(np.int64) - 7) @ (b.astype(np.int64) - b_zp.astype(np.int64))
    assert np.array_equal(matmul_integer(a, b, a_zp, b_zp), want.astype(np.int32))
    # past int32 the sum wraps as the spec's int32 accumulator does
    big = matmul_integer(np.full((1, 40000), 255, np.uint8), np.full((40000, 1), 255, np.uint8))
    assert int(big.item()) == (40000 * 255 * 255 + 2**31) % 2**32 - 2**31


def _matmul_integer_oracle(a, b, a_zp, b_zp):
    exact = np.matmul(a.astype(np.int64) - a_zp.astype(np.int64), b.astype(np.int64) - b_zp.astype(np.int64))
    return ((exact + 2**31) % 2**32 - 2**31).astype(np.int32)


def test_matmul_integer_on_every_table_shape_and_zero_point_form(isa):
    """MatMulInteger runs on the int8 GEMM kernels (QLinearMatMul's sums without requantization): every
    signedness pair, zero points per tensor, per row of a, per column of b (batched too), 1-D operands,
    batch broadcasting, K across the layouts' k-groups, and a constant b packed once (the session's
    op) give the exact int32 sums."""
    from quantmatmul.onnx._session import _integer_operand, _matmul_integer, matmul_integer

    rng = np.random.default_rng(5)
    i8, u8 = np.dtype(np.int8), np.dtype(np.uint8)

    def ints(t, shape):
        return rng.integers(np.iinfo(t).min, int(np.iinfo(t).max) + 1, shape).astype(t)

    cases = [
        ((7, 65), (65, 33), "tensor"),
        ((2, 3, 5, 4), (4, 17), "row"),
        ((2, 3, 5, 40), (40, 17), "tensor"),  # a's leading dimensions fold into its rows
        ((3, 4, 50), (50, 20), "column"),
        ((0, 4, 9), (9, 5), "tensor"),
        ((9, 300), (300, 40), "column"),
        ((2, 1, 3, 70), (4, 70, 9), "batched column"),
        ((1,), (1, 5), "tensor"),
        ((6, 129), (129,), "row"),
        ((33,), (33,), "tensor"),
    ]
    for a_t in (u8, i8):
        for b_t in (u8, i8):
            for a_shape, b_shape, form in cases:
                a, b = ints(a_t, a_shape), ints(b_t, b_shape)
                a_zp, b_zp = ints(a_t, ()), ints(b_t, ())
                a_zp_full, b_zp_full = a_zp, b_zp
                if form == "row":
                    a_zp = ints(a_t, (a_shape[-2],))
                    a_zp_full = a_zp.reshape(-1, 1)
                elif form == "column":
                    b_zp = b_zp_full = ints(b_t, (b_shape[-1],))
                elif form == "batched column":
                    b_zp = ints(b_t, b_shape[:-2] + (b_shape[-1],))
                    b_zp_full = b_zp[..., None, :]
                want = _matmul_integer_oracle(a, b, a_zp_full, b_zp_full)
                what = (a_t, b_t, a_shape, b_shape, form)
                got = matmul_integer(a, b, a_zp, b_zp)
                assert got.dtype == np.int32 and got.shape == want.shape and np.array_equal(got, want), what
                held = _integer_operand("b", b, b_zp, "MatMulInteger", pack=True)
                got = _matmul_integer(_integer_operand("a", a, a_zp, "MatMulInteger"), held)
                assert np.array_equal(got, want), what + ("packed b",)
    empty = matmul_integer(np.zeros((3, 0), u8), np.zeros((0, 4), i8))
    assert empty.shape == (3, 4) and not empty.any()
    assert matmul_integer(np.zeros((0, 5), u8), np.zeros((5, 4), u8)).shape == (0, 4)


# ---------------------------------------------------------------------------------------------------
# compare()


def test_compare_bad_input(tmp_path):
    q = qo.quantize(mlp(), block_size=32)
    cases = [
        (dict(model=mlp()), ValueError, "no quantized node"),
        (dict(model=q, input_feed={"z": np.zeros(3, F32)}), ValueError, "no input named 'z'"),
        (dict(model=q, input_feed={"x": np.zeros((2, 200), F16)}), TypeError, "input 'x' must be"),
        (dict(model=q, dims={"seq": 4}), ValueError, "no input has a dimension named 'seq'"),
        (dict(model=q, numerics="fast"), ValueError, "numerics must be"),
        (dict(model=str(tmp_path)), ValueError, "is not a file"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match="^compare: .*" + message):
            qo.compare(**kwargs)


def test_compare_random_inputs_follow_dims_and_gather_tables():
    rng = np.random.default_rng(6)
    w = {"E": rng.normal(size=(30, 64)).astype(F32), "W": rng.normal(size=(64, 16)).astype(F32)}
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["e"], name="embed"),
        helper.make_node("Mul", ["e", "m"], ["em"], name="mask"),
        helper.make_node("MatMul", ["em", "W"], ["y"], name="proj"),
    ]
    model = make_model(
        nodes,
        [("ids", TensorProto.INT64, ["batch", "seq"]), ("m", TensorProto.FLOAT, ["batch", "seq", 1])],
        [("y", TensorProto.FLOAT, ["batch", "seq", 16])],
        w,
    )
    q = qo.quantize(model, block_size=16)
    report = qo.compare(q, dims={"batch": 2, "seq": 5})
    assert report.ok and report.rows[0]["elements"] == 2 * 5 * 16
    ids = report.inputs["ids"]
    assert ids.shape == (2, 5) and ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 30
    given = {"ids": np.array([[1, 2, 3]], np.int64)}  # binds batch=1, seq=3 for the other input
    report = qo.compare(q, given)
    assert report.inputs["m"].shape == (1, 3, 1) and report.rows[0]["elements"] == 3 * 16


# ---------------------------------------------------------------------------------------------------
# CLI


def g_idx_model():
    """A 4-bit MatMulNBits with uint8 zero points and a g_idx: ONNX Runtime 1.32 ignores the zero points
    (docs/matmul_nbits.md, deviation 1), so compare finds a difference on every CPU."""
    rng = np.random.default_rng(8)
    w = quantize_nbits(rng.normal(size=(64, 8)).astype(F32) + 1, bits=4, block_size=16, method="rtn")
    g_idx = rng.integers(0, w.k_blocks, 64).astype(np.int32)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "s", "z", "g"],
        ["Y"],
        domain="com.microsoft",
        name="nbits",
        K=64,
        N=8,
        bits=4,
        block_size=16,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])],
        [
            numpy_helper.from_array(np.asarray(v), k)
            for k, v in (("B", w.B), ("s", w.scales), ("z", w.zero_points), ("g", g_idx))
        ],
    )
    return helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


def test_cli_quantize_compare_run(tmp_path, capsys):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(mlp(), src)
    before = src.read_bytes()
    assert (
        cli.main(
            [
                "quantize",
                str(src),
                str(dst),
                "--bits",
                "4",
                "--block-size",
                "32",
                "--method",
                "rtn",
                "--accuracy-level",
                "4",
                "--exclude",
                "mm2",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert src.read_bytes() == before and dst.exists()
    assert "mm1" in out.out and "200x48" in out.out and "excluded" in out.out and "[1/1]" in out.err
    assert (
        qo.quantize(mlp(), bits=4, block_size=32, method="rtn", accuracy_level=4, exclude=["mm2"]).SerializeToString()
        == dst.read_bytes()
    )

    x = np.random.default_rng(0).normal(size=(3, 200)).astype(F32)
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["compare", str(dst), "--input", f"x={tmp_path / 'x.npy'}", "--numerics", "exact"]) == 0
    out = capsys.readouterr().out
    assert "mm1_Q4" in out and "all agree" in out
    assert cli.main(["compare", str(dst), "--dim", "batch=4"]) == 0
    assert "elements" in capsys.readouterr().out

    outdir = tmp_path / "out"
    assert cli.main(["run", str(dst), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(outdir)]) == 0
    assert "y" in capsys.readouterr().out
    (want,) = qo.InferenceSession(dst).run(None, {"x": x})
    assert np.load(outdir / "y.npy").tobytes() == want.tobytes()

    gidx = tmp_path / "gidx.onnx"
    onnx.save(g_idx_model(), gidx)
    code = cli.main(["compare", str(gidx)])
    assert "nbits" in capsys.readouterr().out
    deviation("ort-nbits-g-idx-uint8-zp", code == 1)


def test_cli_bad_input_exits_2(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(mlp(), src)
    junk = tmp_path / "junk.onnx"
    junk.write_text("hello")
    np.save(tmp_path / "x64.npy", np.zeros((3, 200)))
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    cases = [
        ["quantize", str(junk), str(tmp_path / "o.onnx")],
        ["quantize", str(src), str(src)],
        ["quantize", str(src), str(tmp_path / "o.onnx"), "--exclude", "nope"],
        ["compare", str(src)],  # nothing quantized
        ["compare", str(junk)],
        ["run", str(src), "--input", f"x={tmp_path / 'x64.npy'}"],
        ["run", str(src), "--input", f"nope={tmp_path / 'x64.npy'}"],
        ["run", str(src), "--input", "x=missing.npy"],
        ["run", str(src), "--input", f"x={empty}"],  # an empty file: numpy's EOFError
        ["run", str(src), "--input", "x"],
        ["compare", str(src), "--dim", "batch=two"],
    ]
    for argv in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "quantmatmul: error: " in err and "Traceback" not in err, (argv, err)
    assert src.read_bytes() == onnx.load(src).SerializeToString()


def test_missing_onnx_is_a_clear_import_error():
    code = "import sys; sys.modules['onnx'] = None\ntry:\n import quantmatmul.onnx\nexcept ImportError as e: print(e)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    ).stdout
    assert "quantmatmul.onnx needs the onnx package: pip install onnx" in out


def test_bfloat16_weights_follow_onnxruntime_quantizer():
    model = mlp(ml_dtypes.bfloat16)
    ours = qo.quantize(model, block_size=32, method="rtn")
    ref = ort_quantizer(model, block_size=32)
    assert ours.SerializeToString() == ref.SerializeToString()
    feed = {"x": np.random.default_rng(0).normal(size=(2, 200)).astype(ml_dtypes.bfloat16)}
    assert qo.InferenceSession(ours).run(None, feed)[0].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 2, -1])
def test_session_softmax_family_before_opset_13_flattens(op, opset, axis):
    """Before opset 13 these coerce the input to 2-D at axis (default 1) and normalize each row; onnx.reference
    applies the one-axis reading of opset 13 to every version, so the session runs its own."""
    x = np.random.default_rng(3).normal(size=(2, 3, 4)).astype(F32) * 2
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = make_model([node], [("x", TensorProto.FLOAT, [2, 3, 4])], [("y", TensorProto.FLOAT, [2, 3, 4])], {}, opset)
    (ours,) = qo.InferenceSession(model).run(None, {"x": x})
    (theirs,) = run_ort(model, {"x": x})
    if opset < 13 and axis in (None, 0):  # where the coercion spans more than the axis: onnx.reference's own
        (reference,) = ReferenceEvaluator(model).run(None, {"x": x})
        deviation("onnx-softmax-before-13", not np.allclose(reference, theirs, rtol=1e-5, atol=1e-6))
    k = (1 if opset < 13 else -1) if axis is None else axis
    if opset < 13:  # the rows of the 2-D coercion
        rows = x.reshape(int(np.prod(x.shape[: k % 3])), -1)
        e = np.exp(rows - rows.max(axis=1, keepdims=True))
        want = {"Softmax": e / e.sum(axis=1, keepdims=True), "LogSoftmax": np.log(e / e.sum(axis=1, keepdims=True))}
        want["Hardmax"] = (rows == rows.max(axis=1, keepdims=True)).astype(F32)
        assert ours.tobytes() == want[op].reshape(x.shape).astype(F32).tobytes()  # onnx.reference's numpy ops
    assert ours.shape == x.shape and np.allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_session_lets_values_go_after_their_last_reader():
    """The run loop drops each intermediate after the last node reading it: a value read twice (early and
    late), a graph output also read later, a value only an If branch reads, all still there when needed."""
    x = np.arange(6, dtype=F32).reshape(2, 3)
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["t"])], "then", [], [helper.make_tensor_value_info("t", 1, None)]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["a", "b"], ["e"])], "else", [], [helper.make_tensor_value_info("e", 1, None)]
    )
    nodes = [
        helper.make_node("Neg", ["x"], ["a"]),  # read by Mul, by the If's branches and last by Sub
        helper.make_node("Mul", ["a", "x"], ["b"]),  # a graph output, read later by the branches
        helper.make_node("ReduceSum", ["b"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["branch"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Sub", ["branch", "a"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3]), ("b", TensorProto.FLOAT, [2, 3])],
        {"zero": np.array(0, F32)},
    )
    session = qo.InferenceSession(model)
    assert not any("a" in step[4] for step in session._plan[:5])  # a: last read by the Sub (its values let go)
    y, b = session.run(None, {"x": x})
    a = -x
    assert np.array_equal(b, a * x) and np.array_equal(y, (a - a * x) - a)  # sum(-x*x) < 0: the else branch
    assert all(np.array_equal(u, v) for u, v in zip(session.run(None, {"x": x}), run_ort(model, {"x": x})))


def test_session_out_of_order_graph_is_a_clear_error():
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="first"), helper.make_node("Neg", ["x"], ["a"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="^InferenceSession.run: node 'first' \\(Neg\\) reads 'a', which no node"):
        qo.InferenceSession(model).run(None, {"x": np.ones(2, F32)})


def test_nodes_of_every_kind_run_as_onnx_reference_runs_them():
    """The session calls plain nodes' _run directly with their attributes read once (ReduceSum's keepdims,
    Softmax's axis 0: a lost attribute changes the values); a model-local function and an If with subgraphs
    keep OpRun.run. All give onnx.reference's values, a 0-d output included, as arrays."""
    from onnx.reference import ReferenceEvaluator

    fn = onnx.helper.make_function(
        "custom",
        "AddTimes",
        ["a", "b"],
        ["c"],
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["c"])],
        [helper.make_opsetid("", 17)],
    )
    then_graph = helper.make_graph(
        [helper.make_node("Neg", ["f"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Abs", ["f"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])],
    )
    nodes = [
        helper.make_node("AddTimes", ["x", "y"], ["f"], domain="custom"),
        helper.make_node("ReduceSum", ["f"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["g"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Softmax", ["g"], ["h"], axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "kinds",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")],
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.float32(0), "zero")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
        functions=[fn],
        ir_version=8,
    )
    onnx.checker.check_model(model)
    session = qo.InferenceSession(model)
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(3)
    for _ in range(4):
        feed = {n: rng.normal(size=(2, 3)).astype(F32) for n in ("x", "y")}
        ours, theirs = session.run(None, feed), reference.run(None, feed)
        for a, b in zip(ours, theirs):
            assert isinstance(a, np.ndarray) and a.shape == np.shape(b) and a.tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("folded", [False, True])
def test_an_omitted_output_is_not_an_absent_input(folded):
    """A LayerNormalization's omitted Mean output (named "") and a later Clip's omitted min (also ""): the
    min stays absent, as ONNX Runtime reads it; onnx.reference 1.23 stores the Mean under "" and clips with it
    (a peer deviation). Folded (the normalization reads initializers alone) or run."""
    weights = {"g": np.ones(4, F32), "hi": np.array(10.0, F32)}
    x = np.arange(8, dtype=F32).reshape(2, 4)
    if folded:
        weights["x0"] = x
    nodes = [
        helper.make_node("LayerNormalization", ["x0" if folded else "x", "g"], ["y", "", "inv"], name="ln"),
        helper.make_node("Clip", ["y", "", "hi"], ["z"], name="clip"),
        helper.make_node("Identity", ["x"], ["x_out"]),  # (a graph input whatever is folded)
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [2, 4])],
        [("z", TensorProto.FLOAT, [2, 4]), ("x_out", TensorProto.FLOAT, [2, 4])],
        weights,
        opset=17,
    )
    ours = qo.InferenceSession(model).run(None, {"x": x})[0]
    theirs = run_ort(model, {"x": x})[0]
    (reference, _) = ReferenceEvaluator(model).run(None, {"x": x})
    assert ours.min() < 0 and np.allclose(ours, theirs, rtol=1e-6, atol=1e-6)  # (not clipped from below)
    deviation("onnx-omitted-output-read-as-input", not np.allclose(reference, theirs, rtol=1e-6, atol=1e-6))
