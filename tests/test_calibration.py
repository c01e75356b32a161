"""test_calibration.py: quantize(calibration=...): X^T X from the float model, attention masks, shared weights, sequential mode, bits_budget, the CLI's --calibration, and every bad input."""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs the test extra (onnx)")
ort = pytest.importorskip("onnxruntime", reason="needs the test extra (onnxruntime)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import quantmatmul.cli as cli  # noqa: E402
import quantmatmul.onnx as qo  # noqa: E402
from quantmatmul.onnx import _calibrate  # noqa: E402
from quantmatmul.onnx._quantize import BITS_KEY, QuantizedNode, quantize_model  # noqa: E402
from quantmatmul.quantize_nbits import quantize_nbits  # noqa: E402

K, H, N = 64, 96, 32


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((K, H)).astype(np.float32), rng.standard_normal((H, N)).astype(np.float32)


def _model(nodes, inputs, initializers, dims=("batch", "seq", N)):
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _x(name="x", dims=("batch", "seq", K)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _mask():
    return helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])


def two_layers(mask=False):
    """x [batch, seq, K] -> MatMul W1 -> Relu -> MatMul W2 -> y (times the mask, when it has one)."""
    W1, W2 = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y0" if mask else "y"], name="mm2"),
    ]
    inputs = [_x()]
    if mask:
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
            helper.make_node("Unsqueeze", ["m", "axis"], ["m3"], name="unsqueeze"),
            helper.make_node("Mul", ["y0", "m3"], ["y"], name="masked"),
        ]
        inputs.append(_mask())
    inits = {"W1": W1, "W2": W2}
    if mask:
        inits["axis"] = np.array([-1], np.int64)
    return _model(nodes, inputs, inits)


def _feeds(n=3, batch=2, seq=5, mask=False, seed=1):
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        feed = {"x": rng.standard_normal((batch, seq, K)).astype(np.float32)}
        if mask:
            m = np.ones((batch, seq), np.int64)
            m[0, rng.integers(1, seq) :] = 0
            feed["attention_mask"] = m
        feeds.append(feed)
    return feeds


def _gram(rows):
    x = np.asarray(rows, np.float64).reshape(-1, np.shape(rows)[-1])
    return x.T @ x, x.shape[0]


def _stats_equal(stats, xtx, rows):
    assert stats.rows == rows
    np.testing.assert_allclose(stats.xtx, xtx, rtol=1e-9, atol=1e-9)


def _rows(model, **kwargs):
    return {r.node: r for r in quantize_model(model, **kwargs)[1] if isinstance(r, QuantizedNode)}


# ---------------------------------------------------------------------------------------------------
# X^T X


def test_xtx_equals_numpy_on_the_full_activations():
    model, feeds = two_layers(), _feeds()
    W1, _ = _weights()
    stats = _calibrate.statistics(model, feeds)
    x = np.concatenate([f["x"].reshape(-1, K) for f in feeds])
    _stats_equal(stats[("W1", 0, 1.0)], *_gram(x))
    relu = np.maximum(x.astype(np.float64) @ W1.astype(np.float64), 0)
    xtx, rows = _gram(relu)
    s = stats[("W2", 0, 1.0)]
    assert s.rows == rows
    np.testing.assert_allclose(s.xtx, xtx, rtol=1e-5)  # h computed in float32 by ONNX Runtime


def test_attention_mask_leaves_padded_positions_out():
    model, feeds = two_layers(mask=True), _feeds(mask=True)
    assert any((f["attention_mask"] == 0).any() for f in feeds)
    stats = _calibrate.statistics(model, feeds)
    kept = np.concatenate([f["x"][f["attention_mask"] != 0] for f in feeds])
    _stats_equal(stats[("W1", 0, 1.0)], *_gram(kept))
    assert stats[("W2", 0, 1.0)].rows == len(kept)


def test_row_mask_rules():
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    keep = mask.ravel() != 0
    assert (_calibrate.row_mask((2, 3), mask) == keep).all()  # [batch, seq]
    assert (_calibrate.row_mask((6,), mask) == keep).all()  # [batch * seq]
    heads = _calibrate.row_mask((2, 4, 3), mask)  # [batch, heads, seq]: each head row of a token
    assert (heads.reshape(2, 4, 3) == (mask != 0)[:, None, :]).all()
    assert (_calibrate.row_mask((3, 2), mask) == (mask.T != 0).ravel()).all()  # [seq, batch]
    assert _calibrate.row_mask((5, 7), mask) is None  # nothing matches: every row counts
    assert _calibrate.row_mask((2, 3), None) is None


def test_shared_weight_sums_its_inputs_and_gemm_trans_b():
    rng = np.random.default_rng(2)
    W = rng.standard_normal((K, K)).astype(np.float32)
    Wt = rng.standard_normal((N, K)).astype(np.float32)  # Gemm's B with transB=1: the weight is Wt.T
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="first"),
        helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "W"], ["b"], name="second"),  # the same W, another input
        helper.make_node("Gemm", ["b", "Wt", "C"], ["y"], name="gemm", transB=1, alpha=0.5),
    ]
    C = rng.standard_normal(N).astype(np.float32)
    model = _model(nodes, [_x(dims=("rows", K))], {"W": W, "Wt": Wt, "C": C}, dims=("rows", N))
    feeds = [{"x": rng.standard_normal((7, K)).astype(np.float32)} for _ in range(2)]
    stats = _calibrate.statistics(model, feeds)
    x = np.concatenate([f["x"] for f in feeds]).astype(np.float64)
    t = np.tanh(x @ W.astype(np.float64))
    xtx1, n1 = _gram(x)
    xtx2, n2 = _gram(t)
    s = stats[("W", 0, 1.0)]
    assert s.rows == n1 + n2 == 28
    np.testing.assert_allclose(s.xtx, xtx1 + xtx2, rtol=1e-5, atol=1e-4)
    b = t @ W.astype(np.float64)
    np.testing.assert_allclose(stats[("Wt", 1, 0.5)].xtx, _gram(b)[0], rtol=1e-4, atol=1e-3)
    # the quantized model: W quantized once, both nodes reading it; the Gemm's output error is for 0.5 * Wt.T
    quantized, rows = quantize_model(model, bits=4, block_size=16, method="rtn", calibration=feeds)
    rows = {r.node: r for r in rows}
    assert rows["second"].shared and not rows["first"].shared
    assert rows["first"].output_error == rows["second"].output_error
    Wg = (0.5 * Wt.T).astype(np.float32)
    deq = quantize_nbits(Wg, bits=4, block_size=16, method="rtn").dequantize().astype(np.float64)
    d = b @ (deq - Wg.astype(np.float64))
    expected = (d * d).sum() / ((b @ Wg.astype(np.float64)) ** 2).sum()
    assert rows["gemm"].output_error == pytest.approx(expected, rel=1e-3)
    assert rows["gemm"].output_error == rows["gemm"].output_error_rtn  # rtn: nothing to compare it with
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, feeds[0])[0].shape == (7, N)


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader protocol, without importing it."""

    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def test_calibration_data_reader_is_accepted():
    model, feeds = two_layers(mask=True), _feeds(mask=True)
    from_list = _rows(model, method="mse", calibration=feeds)
    from_reader = _rows(model, method="mse", calibration=_Reader(feeds))
    assert {k: r.output_error for k, r in from_list.items()} == {k: r.output_error for k, r in from_reader.items()}
    from onnxruntime.quantization import CalibrationDataReader

    class OrtReader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    from_ort = _rows(model, method="mse", calibration=OrtReader())
    assert from_ort["mm2"].output_error == from_list["mm2"].output_error
    from_generator = _rows(model, method="mse", calibration=(f for f in feeds))
    assert from_generator["mm1"].output_error == from_list["mm1"].output_error


def test_output_errors_without_calibration_are_absent_and_rtn_is_unchanged():
    model = two_layers()
    plain = quantize_model(model, bits=4, block_size=32, method="rtn")[0]
    calibrated, rows = quantize_model(model, bits=4, block_size=32, method="rtn", calibration=_feeds())
    assert plain.SerializeToString() == calibrated.SerializeToString()  # rtn ignores the statistics
    assert all(r.output_error is not None and r.output_error > 0 for r in rows)
    assert all(r.output_error is None for r in quantize_model(model, method="rtn")[1])


def test_sequential_uses_quantized_upstream_outputs():
    model, feeds = two_layers(), _feeds()
    W1, W2 = _weights()
    deq1 = quantize_nbits(W1, bits=2, block_size=16, method="rtn").dequantize().astype(np.float32)
    x = np.concatenate([f["x"].reshape(-1, K) for f in feeds])

    def expected(first):
        r = np.maximum(x @ first, 0).astype(np.float64)
        deq2 = quantize_nbits(W2, bits=2, block_size=16, method="rtn").dequantize().astype(np.float64)
        d, y = r @ (deq2 - W2), r @ W2.astype(np.float64)
        return (d * d).sum() / (y * y).sum()

    plain = _rows(model, bits=2, block_size=16, method="rtn", calibration=feeds)
    sequential = _rows(model, bits=2, block_size=16, method="rtn", calibration=feeds, sequential=True)
    assert plain["mm2"].output_error == pytest.approx(expected(W1), rel=1e-4)
    assert sequential["mm2"].output_error == pytest.approx(expected(deq1), rel=1e-4)
    assert sequential["mm2"].output_error != pytest.approx(plain["mm2"].output_error, rel=1e-3)
    assert sequential["mm1"].output_error == plain["mm1"].output_error  # the first group sees the float model
    stats = _calibrate.statistics(model, feeds, weights={("W1", 0, 1.0): deq1})
    r = np.maximum(x @ deq1, 0)
    np.testing.assert_allclose(stats[("W2", 0, 1.0)].xtx, _gram(r)[0], rtol=1e-5, atol=1e-4)


def test_sequential_groups_follow_the_graph():
    model = two_layers()
    targets, _ = _calibrate._targets(qo._quantize.plan(model, frozenset()))
    _calibrate._levels(model.graph, targets)
    assert [t.level for t in targets] == [0, 1]


# ---------------------------------------------------------------------------------------------------
# Mixed precision


def three_branches(loud=1):
    """y = x @ W0 + x @ W1 + x @ W2, with W[loud] 30 times the others: its error dominates the output."""
    rng = np.random.default_rng(3)
    Ws = {f"W{i}": rng.standard_normal((K, N)).astype(np.float32) * (30 if i == loud else 1) for i in range(3)}
    nodes = [helper.make_node("MatMul", ["x", f"W{i}"], [f"p{i}"], name=f"branch{i}") for i in range(3)]
    nodes += [
        helper.make_node("Add", ["p0", "p1"], ["s"], name="add0"),
        helper.make_node("Add", ["s", "p2"], ["y"], name="add1"),
    ]
    return _model(nodes, [_x()], Ws)


@pytest.mark.parametrize("loud", [0, 2])
def test_bits_budget_raises_the_most_sensitive_node(loud):
    model = three_branches(loud)
    q, rows = quantize_model(model, bits=2, block_size=16, method="rtn", calibration=_feeds(), bits_budget=4.0)
    bits = {r.node: r.bits for r in rows}
    assert bits == {f"branch{i}": 8 if i == loud else 2 for i in range(3)}
    sens = {r.node: r.sensitivity for r in rows}
    assert max(sens, key=sens.get) == f"branch{loud}"
    meta = json.loads(next(p.value for p in q.metadata_props if p.key == BITS_KEY))
    assert meta["nodes"] == bits and meta["bits"] == 2 and meta["bits_budget"] == 4.0
    assert meta["average_bits"] == pytest.approx(4.0) and meta["average_bits"] <= 4.0
    node = next(n for n in q.graph.node if n.name == f"branch{loud}_Q8")
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "bits")) == 8
    assert q.graph.initializer[0].name  # the model is whole: it runs in ONNX Runtime at 2 and 8 bits
    session = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, _feeds(1)[0])[0].shape == (2, 5, N)


def test_bits_budget_is_respected():
    model, feeds = three_branches(), _feeds()
    for budget, raised in ((2.0, 0), (3.9, 0), (4.0, 1), (5.99, 1), (6.0, 2), (8.0, 3), (9.5, 3)):
        q, rows = quantize_model(model, bits=2, block_size=16, method="rtn", calibration=feeds, bits_budget=budget)
        meta = json.loads(next(p.value for p in q.metadata_props if p.key == BITS_KEY))
        assert sum(r.bits == 8 for r in rows) == raised, budget
        assert meta["average_bits"] <= budget + 1e-9
    assert not any(p.key == BITS_KEY for p in quantize_model(model, calibration=feeds)[0].metadata_props)


def test_choose_bits_passes_over_a_weight_that_does_not_fit():
    T = _calibrate.Target
    big = T(("big",), np.zeros((64, 64)), 1, [0], ["x"], ["big"])
    small = T(("small",), np.zeros((16, 16)), 1, [1], ["x"], ["small"])
    chosen, average = _calibrate.choose_bits([big, small], 0, {("big",): 1.0, ("small",): 0.5}, 4, 4.5)
    assert chosen == {("big",): 4, ("small",): 8} and average <= 4.5


# ---------------------------------------------------------------------------------------------------
# GPTQ (quantize_nbits(method="gptq"))


def test_gptq_lowers_each_nodes_output_error():
    model, feeds = two_layers(mask=True), _feeds(n=4, seq=16, mask=True)
    rows = _rows(model, bits=3, block_size=16, method="gptq", calibration=feeds)
    for r in rows.values():
        assert r.method == "gptq" and r.output_error < r.output_error_rtn


def test_gptq_desc_act_runs_in_onnxruntime():
    model, feeds = two_layers(), _feeds(n=2, seq=8)
    q = qo.quantize(model, bits=4, block_size=16, method="gptq", calibration=feeds, desc_act=True, symmetric=True)
    session = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = qo.InferenceSession(q).run(None, feeds[0])[0]
    np.testing.assert_allclose(session.run(None, feeds[0])[0], ours, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# The CLI


def test_cli_quantize_with_calibration(tmp_path, capsys):
    model = two_layers(mask=True)
    path, out, npz = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "feeds.npz"
    onnx.save(model, path)
    rng = np.random.default_rng(5)
    mask = np.ones((6, 5), np.int64)
    mask[::2, 3:] = 0
    np.savez(npz, x=rng.standard_normal((6, 5, K)).astype(np.float32), attention_mask=mask)
    argv = ["quantize", str(path), str(out), "--method", "mse", "--bits", "2", "--block-size", "16"]
    argv += ["--calibration", str(npz), "--calibration-batch", "4", "--bits-budget", "5"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "out error rtn" in captured.out and "out error mse" in captured.out
    assert "calibration: 2 runs (6 samples)" in captured.out
    assert "node(s) raised to 8 bits" in captured.out
    assert "collecting X^T X" in captured.err and "measuring sensitivity" in captured.err
    q = onnx.load(out)
    meta = json.loads(next(p.value for p in q.metadata_props if p.key == BITS_KEY))
    lines = {line.split()[0]: line.split() for line in captured.out.splitlines() if line.startswith("mm")}
    assert {name: int(lines[name][3]) for name in ("mm1", "mm2")} == meta["nodes"]
    assert sorted(meta["nodes"].values()) == [2, 8]
    # bad calibration files: exit status 2 and one line naming the problem
    np.savez(npz, x=rng.standard_normal((6, 5, K)).astype(np.float32), attention_mask=mask[:4])
    assert cli.main(argv) == 2
    assert "quantize: --calibration arrays must hold the same number of samples" in capsys.readouterr().err
    np.savez(npz, x=rng.standard_normal((6, 5, K)).astype(np.float64), attention_mask=mask)
    assert cli.main(argv) == 2
    assert "quantize: calibration feed 0: input 'x' must be tensor(float)" in capsys.readouterr().err
    assert cli.main(argv[:2] + [str(tmp_path / "q2.onnx"), "--method", "mse", "--bits-budget", "5"]) == 2
    assert "quantize: bits_budget needs calibration data" in capsys.readouterr().err
    npz.write_bytes(b"")  # an empty file: numpy's EOFError, one clear line
    assert cli.main(argv) == 2
    assert "quantize: cannot read --calibration" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Bad input


def _error(kind, match, model, **kwargs):
    with pytest.raises(kind, match=match) as info:
        qo.quantize(model, **kwargs)
    assert str(info.value).startswith("quantize: ")


def test_bad_calibration_is_one_clear_error():
    model = two_layers(mask=True)
    feeds = _feeds(mask=True)
    before = model.SerializeToString()
    copies = [{k: v.copy() for k, v in f.items()} for f in feeds]
    _error(ValueError, "method 'gptq' needs calibration data", model, method="gptq")
    _error(ValueError, "sequential needs calibration data", model, sequential=True)
    _error(ValueError, "bits_budget needs calibration data", model, bits_budget=4.5)
    _error(ValueError, "desc_act applies to method 'gptq' only", model, calibration=feeds, desc_act=True)
    missing = [{"x": feeds[0]["x"]}]
    _error(ValueError, "calibration feed 0: input 'attention_mask' is missing", model, calibration=missing)
    unknown = [feeds[0], {**feeds[1], "token_type_ids": feeds[1]["attention_mask"]}]
    _error(ValueError, "calibration feed 1: the model has no input named 'token_type_ids'", model, calibration=unknown)
    wrong_type = [{**feeds[0], "x": feeds[0]["x"].astype(np.float64)}]
    _error(TypeError, r"calibration feed 0: input 'x' must be tensor\(float\)", model, calibration=wrong_type)
    wrong_rank = [{**feeds[0], "x": feeds[0]["x"][0]}]
    _error(ValueError, "calibration feed 0: input 'x' must have shape", model, calibration=wrong_rank)
    _error(ValueError, "calibration holds no feeds", model, calibration=[])
    _error(ValueError, "calibration holds no feeds", model, calibration=_Reader([]))
    _error(TypeError, "calibration must be an iterable of input feeds", model, calibration=feeds[0])
    _error(TypeError, "calibration must be an iterable of input feeds", model, calibration=3)
    _error(TypeError, "calibration feed 0 must be a dict", model, calibration=[feeds[0]["x"]])
    _error(ValueError, "bits_budget 3.5 is below bits=4", model, calibration=feeds, bits_budget=3.5)
    _error(TypeError, "bits_budget must be None or a number", model, calibration=feeds, bits_budget="4.5")
    _error(TypeError, "bits_budget must be None or a number", model, calibration=feeds, bits_budget=True)
    _error(ValueError, "bits_budget must be a finite number", model, calibration=feeds, bits_budget=float("nan"))
    _error(TypeError, "sequential must be a bool", model, calibration=feeds, sequential="yes")
    all_masked = [{**f, "attention_mask": np.zeros_like(f["attention_mask"])} for f in feeds]
    _error(ValueError, "reaches mm1 with no rows", model, calibration=all_masked)
    # nothing the caller gave was modified
    assert model.SerializeToString() == before
    qo.quantize(model, method="rtn", calibration=feeds, bits_budget=4.5, sequential=True)
    assert model.SerializeToString() == before
    for f, c in zip(feeds, copies):
        assert f.keys() == c.keys() and all(np.array_equal(f[k], c[k]) for k in f)


def test_model_without_float_outputs_cannot_take_a_budget():
    W1, _ = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("ArgMax", ["h"], ["y"], name="argmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [_x()],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", "seq"])],
        [numpy_helper.from_array(W1, "W1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _error(ValueError, "measures the model's float outputs", model, calibration=_feeds(), bits_budget=6)
    assert qo.quantize(model, calibration=_feeds())  # without a budget it needs none


# ---------------------------------------------------------------------------------------------------
# MiniLM


def test_minilm_gptq_beats_mse():
    """Layers 0 and 1 of all-MiniLM-L6-v2 (12 MatMuls; the rest left float, to keep it fast) at 3 bits, block 32,
    calibrated on 160 sentences of the demo's text (about 2,800 tokens; with 32 sentences, fewer rows than the
    1536 inputs of the MLP's second MatMul, gptq came out below mse): gptq keeps the embeddings closer."""
    from quantmatmul import _demo_minilm
    from quantmatmul.models import minilm
    from quantmatmul.models.sentences import SENTENCES

    try:
        model = minilm.onnx_model()
        feeds = minilm.tokenize(SENTENCES)
    except minilm.MiniLMUnavailable as error:
        pytest.skip(str(error))
    calibration = _demo_minilm.calibration_feeds(limit=160)
    exclude = [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and not n.name.startswith(("encoder.layer.0.", "encoder.layer.1."))
    ]
    session = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])  # noqa: E731
    reference = session(model).run(None, feeds)[0].astype(np.float64)

    def cos(m):
        e = qo.InferenceSession(m).run(None, feeds)[0].astype(np.float64)  # 3 bits: ORT has no kernel
        return float(((e * reference).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(reference, axis=1)).mean())

    options = dict(bits=3, block_size=32, exclude=exclude)
    gptq = cos(qo.quantize(model, method="gptq", calibration=calibration, **options))
    mse = cos(qo.quantize(model, method="mse", **options))
    assert gptq > mse
