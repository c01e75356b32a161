"""onnx/_compare.py: compare(): runs a model once in ONNX Runtime with every quantized node's inputs and outputs exposed, and checks each of those nodes against quantmatmul on the same inputs."""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..matmul_nbits import matmul_nbits
from ..qlinear import NUMERICS, qlinear_matmul
from ..quantize_linear import _QUANT_TYPES as DEQUANTIZE_TYPES
from ..quantize_linear import dequantize_linear, quantize_linear
from ..reference import matmul_nbits as nbits_oracle
from ._common import (
    AVERAGE_POOL_ATTRIBUTES,
    CONV_ATTRIBUTES,
    MS_DOMAIN,
    attributes,
    check_feed,
    format_table,
    graph_inputs,
    load_model,
    np_dtype,
    to_array,
)
from ._fuse import fuse_qdq
from ._integer import _integer_operand, _matmul_integer, dynamic_quantize_linear
from ._qconv import conv_integer, qlinear_conv
from ._qgemm import qgemm
from ._qlinear_ops import qlinear_add, qlinear_mul, qlinear_softmax
from ._qlinear_pool import qlinear_average_pool, qlinear_global_average_pool
from ._qlinear_unary import qlinear_concat, qlinear_leaky_relu, qlinear_sigmoid

__all__ = ["compare", "CompareReport", "COMPARED"]

_FN = "compare"
COMPARED = (
    "QLinearMatMul",
    "MatMulInteger",
    "MatMulNBits",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSoftmax",
    "QLinearConv",
    "ConvInteger",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
)
_MS_OPS = (  # the com.microsoft ones
    "MatMulNBits",
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSoftmax",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
)
_SATURATION_NOTE = (
    "ONNX Runtime's u8·s8 AVX2 kernel saturates int16 pair sums on this CPU (onnxruntime#16105); "
    "quantmatmul gives the spec's int32 sum"
)


@dataclass
class CompareReport:
    """What compare() found. ``rows``: one dict per node compared, with keys ``node``, ``op_type``,
    ``elements``, ``differing`` (elements not bit-identical), ``max_abs_diff``, ``rel_err`` (float outputs:
    ``max|ours - ort| / max|exact|``; None for integer outputs), ``bound_ratio`` (MatMulNBits: the larger of
    ours' and ONNX Runtime's ``max |y - exact| / bound``, docs/matmul_nbits.md; else None), ``ok`` (True,
    False, or None where the node could not be compared) and ``note``. ``ok`` is True when no row is False.
    ``str(report)`` is a table."""

    rows: list = field(default_factory=list)
    numerics: str = "exact"
    onnxruntime_version: str = ""
    inputs: dict = field(default_factory=dict)  # the input feed the model ran on

    @property
    def ok(self) -> bool:
        return all(r["ok"] is not False for r in self.rows)

    @property
    def differing_nodes(self) -> list[str]:
        return [r["node"] for r in self.rows if r["ok"] is False]

    def __str__(self) -> str:
        notes: list[str] = []
        body = []
        for r in self.rows:
            mark = ""
            if r["note"]:
                if r["note"] not in notes:
                    notes.append(r["note"])
                mark = f" [{notes.index(r['note']) + 1}]"
            body.append(
                [
                    r["node"] or "(unnamed)",
                    r["op_type"],
                    r["elements"],
                    r["differing"],
                    _num(r["max_abs_diff"]),
                    _num(r["rel_err"]),
                    _num(r["bound_ratio"]),
                    {True: "ok", False: "DIFFERS", None: "-"}[r["ok"]] + mark,
                ]
            )
        table = format_table(
            ["node", "op_type", "elements", "differing", "max|diff|", "rel_err", "of bound", "ok"], body, "llrrrrrl"
        )
        bad = self.differing_nodes
        summary = (
            f"{len(self.rows)} quantized node{'s' if len(self.rows) != 1 else ''} compared with ONNX Runtime {self.onnxruntime_version} "
            f"(quantmatmul numerics={self.numerics!r}): "
            + ("all agree" if not bad else f"{len(bad)} differ: {', '.join(n or '(unnamed)' for n in bad)}")
        )
        lines = [table, "", summary] + [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<CompareReport: {len(self.rows)} nodes, ok={self.ok}>"


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    return "0" if v == 0 else f"{v:.3g}"


def compare(model, input_feed=None, *, numerics="exact", dims=None, progress=None) -> CompareReport:
    """Run ``model`` once in ONNX Runtime and check each quantized node against quantmatmul.

    Every QLinearMatMul, MatMulInteger, com.microsoft MatMulNBits, QuantizeLinear, DequantizeLinear and
    DynamicQuantizeLinear node of the main graph has its inputs and outputs exposed (added to a copy of
    the graph as outputs; ONNX Runtime runs the copy with graph optimizations off, so each node runs its
    own kernel); quantmatmul then computes each node from ONNX Runtime's inputs to it:

    * integer outputs (QLinearMatMul, MatMulInteger, QuantizeLinear, DynamicQuantizeLinear) element by
      element. QLinearMatMul agrees when ONNX Runtime's output equals quantmatmul's ``"onnxruntime"``
      numerics bit for bit and differs from the requested ``numerics`` by at most one step (the rounding
      of ONNX Runtime's float32 multiplier, docs/quantization.md); the others must be identical.
    * float outputs: MatMulNBits agrees when both results lie within the documented error bound of the
      node's accuracy level around the exact product (docs/matmul_nbits.md); DequantizeLinear must be
      bit-identical.

    A QDQ model's groups that InferenceSession fuses (onnx/_fuse.py) get a row each ("QDQ MatMul ->
    QLinearMatMul", ...): ONNX Runtime runs the model once more with its default optimizations, which fuse
    such groups too, and the fused node is computed from the codes ORT feeds the group; a group ORT's
    optimizer does not make one node writing those codes is listed with ``ok`` None.

    ``input_feed`` may give some or all inputs; the others are random (float: standard normal; integers:
    in ``[0, 100)``, below the table size where the input indexes a constant Gather, and 1 for inputs
    whose name contains "mask"; seeded, so runs repeat). A dimension given by name is 1 unless ``dims``
    (``{"batch": 4}``) or a given input sets it. Returns a :class:`CompareReport`. Where ONNX Runtime's
    u8·s8 kernel saturates (AVX2 without VNNI), the affected nodes differ, with a note saying so.
    ``progress(done, total, node_name)``, if given, is called before each node is checked.
    """
    if numerics not in NUMERICS:
        raise ValueError(f"{_FN}: numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")
    try:
        import onnxruntime as ort
    except ImportError:
        raise ImportError(f"{_FN}: needs onnxruntime (pip install onnxruntime)") from None
    model = load_model(_FN, model, copy=True)
    fused_model, fused_names = fuse_qdq(model)  # the session's QDQ groups, on a copy of its own
    graph = model.graph
    nodes = [
        n
        for n in graph.node
        if n.op_type in COMPARED
        and n.domain in ("", "ai.onnx", MS_DOMAIN)
        and (n.op_type in _MS_OPS) == (n.domain == MS_DOMAIN)
    ]
    if not nodes:
        raise ValueError(f"{_FN}: the model has no quantized node to compare ({', '.join(COMPARED)})")
    given = {} if input_feed is None else check_feed(_FN, model, input_feed, complete=False)
    feed = _complete_feed(model, given, dims)

    inits = {t.name: t for t in graph.initializer}
    exposed = [o.name for o in graph.output]
    for node in nodes:
        for name in list(node.input) + list(node.output):
            if name and name not in inits and name not in feed and name not in exposed:
                graph.output.append(onnx.ValueInfoProto(name=name))
                exposed.append(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        values = dict(zip(exposed, session.run(exposed, feed)))
    except Exception as error:  # ORT's own exception types
        raise ValueError(f"{_FN}: ONNX Runtime cannot run the model: {_first_line(error)}") from None
    values.update(feed)

    def value(name):
        if not name:
            return None
        if name not in values:
            values[name] = to_array(inits[name])
        return values[name]

    report = CompareReport(numerics=numerics, onnxruntime_version=ort.__version__, inputs=feed)
    for i, node in enumerate(nodes):
        if progress is not None:
            progress(i, len(nodes), node.name)
        inputs = [value(n) for n in node.input]
        outputs = [values[n] for n in node.output if n]
        with np.errstate(all="ignore"):
            try:
                row = _CHECKS[node.op_type](node, inputs, outputs, numerics)
            except (TypeError, ValueError) as error:
                row = _row(outputs[0].size, None, None, None, False, f"quantmatmul refused it: {error}")
        report.rows.append({"node": node.name, "op_type": node.op_type, **row})
    if fused_names:
        report.rows += _qdq_group_rows(model, fused_model, feed, numerics, ort)
    return report


_GROUP_OF = {
    "QLinearMatMul": "MatMul",
    "MatMulNBits": "MatMul",
    "QGemm": "Gemm",
    "QLinearAdd": "Add",
    "QLinearMul": "Mul",
    "QLinearSoftmax": "Softmax",
    "QLinearConv": "Conv",
    "QLinearGlobalAveragePool": "GlobalAveragePool",
    "QLinearAveragePool": "AveragePool",
    "QLinearSigmoid": "Sigmoid",
    "QLinearLeakyRelu": "LeakyRelu",
    "QLinearConcat": "Concat",
}
_FUSED_TYPES = tuple(_GROUP_OF)


def _qdq_group_rows(model, fused_model, feed, numerics, ort) -> list[dict]:
    """A row per QDQ group the session fuses (onnx/_fuse.py): its fused node computed by quantmatmul from
    the codes ONNX Runtime's optimized run (its default: it fuses such groups too) feeds the group, against
    the codes that run produces. model: the input model with extra outputs; only its original outputs,
    nodes and initializers are read. Groups ORT runs as written (float) get ok None."""
    produced = {o: n for n in model.graph.node for o in n.output}
    groups = [
        n
        for n in fused_model.graph.node
        if n.op_type in _FUSED_TYPES and n.output[0] in produced and produced[n.output[0]].op_type != n.op_type
    ]
    if not groups:
        return []
    inits = {t.name: t for t in fused_model.graph.initializer}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    names = []
    for node in groups:  # codes in and out: graph outputs that do not stop ORT's fusion
        for name in [*node.input, node.output[0]]:
            if name and name not in inits and name not in feed and name not in names:
                names.append(name)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    values = dict(zip(names, session.run(names, feed)))
    values.update(feed)
    ort_producer = {o: n for n in optimized.graph.node for o in n.output}

    def fused_by_ort(name: str) -> bool:
        producer = ort_producer.get(name)
        if producer is not None and producer.op_type == "Transpose":  # a QLinearConv ORT runs channels-last
            producer = ort_producer.get(producer.input[0])
        return producer is not None and producer.op_type in _FUSED_TYPES

    rows = []
    for node in groups:
        label = f"QDQ {_GROUP_OF[node.op_type]} -> {node.op_type}"
        if not fused_by_ort(node.output[0]):
            theirs = values[node.output[0]]
            note = "ONNX Runtime's optimizer does not make this group one node writing these codes: not compared"
            rows.append({"node": node.name, "op_type": label, **_row(theirs.size, None, None, None, None, note)})
            continue
        inputs = [None if not n else values[n] if n in values else to_array(inits[n]) for n in node.input]
        with np.errstate(all="ignore"):
            try:
                row = _CHECKS[node.op_type](node, inputs, [values[node.output[0]]], numerics)
            except (TypeError, ValueError) as error:
                row = _row(values[node.output[0]].size, None, None, None, False, f"quantmatmul refused it: {error}")
        rows.append({"node": node.name, "op_type": label, **row})
    return rows


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


# ---------------------------------------------------------------------------------------------------
# Inputs


def _complete_feed(model, given: dict, dims) -> dict:
    """given plus random values for the inputs it lacks (docstring of compare)."""
    inputs = graph_inputs(model)
    symbols = {}
    for vi in inputs:  # dimensions named by the model, bound by the given inputs
        tt = vi.type.tensor_type
        for k, d in enumerate(tt.shape.dim):
            if d.dim_param:
                symbols.setdefault(d.dim_param, None)
                if vi.name in given and given[vi.name].ndim == len(tt.shape.dim):
                    symbols[d.dim_param] = given[vi.name].shape[k]
    if dims is not None:
        if not isinstance(dims, dict):
            raise TypeError(f"{_FN}: dims must be a dict {{dimension name: size}}, got {type(dims).__name__}")
        for name, size in dims.items():
            if name not in symbols:
                raise ValueError(
                    f"{_FN}: no input has a dimension named {name!r} (named dimensions: {', '.join(symbols) or 'none'})"
                )
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
                raise ValueError(f"{_FN}: dims[{name!r}] must be a non-negative integer, got {size!r}")
            if symbols[name] is not None and symbols[name] != size:
                raise ValueError(f"{_FN}: dims[{name!r}] = {size} but a given input has {name} = {symbols[name]}")
            symbols[name] = int(size)
    rng = np.random.default_rng(0)
    bounds = _gather_bounds(model)
    feed = dict(given)
    for vi in inputs:
        if vi.name in feed:
            continue
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.elem_type:
            raise ValueError(f"{_FN}: input {vi.name!r} is not a typed tensor: give it in input_feed")
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else (symbols.get(d.dim_param) or 1) for d in tt.shape.dim)
        feed[vi.name] = _random(rng, np_dtype(tt.elem_type), shape, vi.name, bounds.get(vi.name, 100))
    return feed


def _random(rng, dtype, shape, name, bound):
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        if "mask" in name.lower():
            return np.ones(shape, dtype)
        high = max(1, min(bound, 100, int(np.iinfo(dtype).max) + 1))
        return rng.integers(0, high, shape).astype(dtype)
    raise ValueError(f"{_FN}: cannot make a random {dtype} input for {name!r}: give it in input_feed")


def _gather_bounds(model) -> dict:
    """{input name: table size} for inputs used directly as the indices of a Gather over an initializer."""
    inits = {t.name: t for t in model.graph.initializer}
    bounds = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = list(inits[node.input[0]].dims)
            if dims:
                size = dims[axis % len(dims)]
                bounds[node.input[1]] = min(bounds.get(node.input[1], size), size)
    return bounds


# ---------------------------------------------------------------------------------------------------
# The checks: each returns the row's numbers


def _row(elements, differing, max_abs_diff, rel_err, ok, note="", bound_ratio=None):
    return {
        "elements": int(elements),
        "differing": differing,
        "max_abs_diff": max_abs_diff,
        "rel_err": rel_err,
        "bound_ratio": bound_ratio,
        "ok": ok,
        "note": note,
    }


def _int_diff(ours, theirs):
    """(differing, max |difference|) of two integer (or float8) arrays, element by element."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.shape != theirs.shape:
        raise ValueError(f"output shapes differ: quantmatmul {ours.shape}, ONNX Runtime {theirs.shape}")
    if ours.dtype.kind in "iu":
        d = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
        return int(np.count_nonzero(d)), int(d.max()) if d.size else 0
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    same = (ours.view(np.uint8) == theirs.view(np.uint8)) if ours.dtype.itemsize == 1 else (a == b)
    d = np.where(same, 0.0, np.abs(a - b))
    return int(np.count_nonzero(~same)), float(np.nanmax(d)) if d.size else 0.0


def _u8s8(a, b) -> bool:
    return np.asarray(a).dtype == np.uint8 and np.asarray(b).dtype == np.int8


def _saturates() -> bool:
    from .. import peers

    return peers.onnxruntime_u8s8_saturates()


def _check_qlinear(node, inputs, outputs, numerics):
    run = functools.partial(qlinear_matmul, *inputs[:8])
    return _qlinear_row(run, inputs[0], inputs[3], outputs[0], numerics)


def _qlinear_row(run, a, b, theirs, numerics):
    """QLinearMatMul / QLinearConv: ONNX Runtime's output must be quantmatmul's "onnxruntime" numerics bit for
    bit and within one step of the requested numerics. run(numerics=...) computes the node."""
    ours = run(numerics=numerics)
    as_ort = ours if numerics == "onnxruntime" else run(numerics="onnxruntime")
    differing, max_diff = _int_diff(ours, theirs)
    ort_differing, _ = _int_diff(as_ort, theirs)
    note = ""
    if ort_differing:
        note = (
            _SATURATION_NOTE
            if _u8s8(a, b) and _saturates()
            else "ONNX Runtime differs from quantmatmul's 'onnxruntime' numerics"
        )
    elif differing:
        note = "last-step rounding: ONNX Runtime's float32 multiplier (docs/quantization.md)"
    ok = ort_differing == 0 and max_diff <= (0 if numerics == "onnxruntime" else 1)
    return _row(theirs.size, differing, max_diff, None, ok, note)


def _check_qlinear_conv(node, inputs, outputs, numerics):
    args = (list(inputs) + [None] * 9)[:9]
    run = functools.partial(qlinear_conv, *args, **attributes(node, CONV_ATTRIBUTES))
    return _qlinear_row(run, args[0], args[3], outputs[0], numerics)


def _check_conv_integer(node, inputs, outputs, numerics):
    x, w = inputs[0], inputs[1]
    args = (list(inputs) + [None] * 4)[:4]
    ours = conv_integer(*args, **attributes(node, CONV_ATTRIBUTES))
    differing, max_diff = _int_diff(ours, outputs[0])
    note = ""
    if differing:
        note = _SATURATION_NOTE if _u8s8(x, w) and _saturates() else "ONNX Runtime differs from the exact int32 sum"
    return _row(ours.size, differing, max_diff, None, differing == 0, note)


def _check_matmul_integer(node, inputs, outputs, numerics):
    A, B = inputs[0], inputs[1]
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    fn = "MatMulInteger"
    ours = _matmul_integer(_integer_operand("a", A, a_zp, fn), _integer_operand("b", B, b_zp, fn))
    differing, max_diff = _int_diff(ours, outputs[0])
    note = ""
    if differing:
        note = _SATURATION_NOTE if _u8s8(A, B) and _saturates() else "ONNX Runtime differs from the exact int32 sum"
    return _row(ours.size, differing, max_diff, None, differing == 0, note)


def _check_qgemm(node, inputs, outputs, numerics):
    """ONNX Runtime's QGemm against quantmatmul's (ORT's bits whatever the numerics: its own operator)."""
    attrs = attributes(node)
    args = (list(inputs) + [None] * 9)[:9]
    ours = qgemm(
        *args,
        alpha=float(attrs.get("alpha", 1.0)),
        trans_a=bool(attrs.get("transA", 0)),
        trans_b=bool(attrs.get("transB", 0)),
    )
    theirs = np.asarray(outputs[0])
    differing, max_diff = _int_diff(ours, theirs)
    note = ""
    if differing:
        note = _SATURATION_NOTE if _u8s8(args[0], args[3]) and _saturates() else "ONNX Runtime's QGemm differs"
    return _row(ours.size, differing, max_diff, None, differing == 0 and ours.dtype == theirs.dtype, note)


_ORT_OPERATORS = {  # ORT's own com.microsoft operators: (function, its keyword attributes, inputs it takes)
    "QLinearAdd": (qlinear_add, (), 8),
    "QLinearMul": (qlinear_mul, (), 8),
    "QLinearSoftmax": (qlinear_softmax, ("axis", "opset"), 5),
    "QLinearGlobalAveragePool": (qlinear_global_average_pool, ("channels_last",), 5),
    "QLinearAveragePool": (qlinear_average_pool, (*AVERAGE_POOL_ATTRIBUTES, "channels_last"), 5),
    "QLinearSigmoid": (qlinear_sigmoid, (), 5),
    "QLinearLeakyRelu": (qlinear_leaky_relu, ("alpha",), 5),
    "QLinearConcat": (qlinear_concat, ("axis",), None),
}


def _check_qlinear_elementwise(node, inputs, outputs, numerics):
    """ORT's element-wise, pooling and concatenating QLinear* operators: its bits (onnx/_qlinear_ops.py,
    _qlinear_pool.py, _qlinear_unary.py)."""
    function, keywords, count = _ORT_OPERATORS[node.op_type]
    attrs = attributes(node, keywords)
    if node.op_type == "QLinearSoftmax":
        attrs.setdefault("axis", -1)
    args = list(inputs) if count is None else (list(inputs) + [None] * count)[:count]
    ours = function(*args, **attrs)
    differing, max_diff = _int_diff(ours, outputs[0])
    return _row(ours.size, differing, max_diff, None, differing == 0, "ONNX Runtime differs" if differing else "")


def _check_quantize(node, inputs, outputs, numerics):
    attrs = attributes(node)
    zp = inputs[2] if len(inputs) > 2 else None
    if zp is None and attrs.get("output_dtype"):
        zp = np.zeros(np.shape(inputs[1]), np_dtype(attrs["output_dtype"]))
    ours = quantize_linear(
        inputs[0],
        inputs[1],
        zp,
        axis=attrs.get("axis", 1),
        block_size=attrs.get("block_size", 0),
        saturate=bool(attrs.get("saturate", 1)),
    )
    differing, max_diff = _int_diff(ours, outputs[0])
    return _row(ours.size, differing, max_diff, None, differing == 0)


def _check_dynamic(node, inputs, outputs, numerics):
    y, scale, zp = dynamic_quantize_linear(inputs[0])
    differing, max_diff = _int_diff(y, outputs[0])
    note = ""
    params_same = True
    if len(outputs) > 1 and np.asarray(outputs[1]).tobytes() != scale.tobytes():
        params_same, note = False, f"scale differs: ONNX Runtime {outputs[1]}, quantmatmul {scale}"
    if len(outputs) > 2 and np.asarray(outputs[2]).tobytes() != zp.tobytes():
        params_same, note = False, (note + "; " if note else "") + f"zero point differs: {outputs[2]} vs {zp}"
    return _row(y.size, differing, max_diff, None, differing == 0 and params_same, note)


def _check_dequantize(node, inputs, outputs, numerics):
    theirs = outputs[0]
    if np.asarray(inputs[0]).dtype not in DEQUANTIZE_TYPES:
        return _row(theirs.size, None, None, None, None, f"not compared: {np.asarray(inputs[0]).dtype} input")
    attrs = attributes(node)
    zp = inputs[2] if len(inputs) > 2 else None
    ours = dequantize_linear(inputs[0], inputs[1], zp, axis=attrs.get("axis", 1), block_size=attrs.get("block_size", 0))
    same = ours.tobytes() == np.asarray(theirs, ours.dtype).tobytes() and ours.shape == theirs.shape
    a, b = ours.astype(np.float64), np.asarray(theirs).astype(np.float64)
    d = np.abs(a - b)
    differing = int(np.count_nonzero(a != b))
    scale = float(np.nanmax(np.abs(b))) if b.size else 0.0
    max_diff = float(np.nanmax(d)) if d.size else 0.0
    return _row(ours.size, differing, max_diff, max_diff / scale if scale else max_diff, same)


def _check_nbits(node, inputs, outputs, numerics):
    attrs = attributes(node)
    layout = {"K": attrs["K"], "N": attrs["N"], "bits": attrs.get("bits", 4), "block_size": attrs["block_size"]}
    level = int(attrs.get("accuracy_level", 0))
    A = inputs[0]
    weights = (inputs + [None] * 6)[1:6]
    ours = matmul_nbits(A, *weights, **layout, accuracy_level=level)
    theirs = np.asarray(outputs[0])
    decoded = nbits_oracle.Decoded(*weights[:4], **layout)
    exact = nbits_oracle.matmul_nbits(A, *weights, **layout, decoded=decoded)
    bound = nbits_oracle.error_bound(
        A, *weights, **layout, level=level, out_dtype=A.dtype, decoded=decoded, exact=exact
    )
    o64, t64 = ours.astype(np.float64), theirs.astype(np.float64)
    ratio = (
        max(float(np.nanmax(np.abs(o64 - exact) / bound)), float(np.nanmax(np.abs(t64 - exact) / bound)))
        if exact.size
        else 0.0
    )
    finite = np.isfinite(exact)
    consistent = bool(np.array_equal(np.isfinite(o64), finite) and np.array_equal(np.isfinite(t64), finite))
    d = np.abs(o64 - t64)
    max_diff = float(np.nanmax(d)) if d.size else 0.0
    scale = float(np.nanmax(np.abs(exact))) if exact.size else 0.0
    differing = int(np.count_nonzero(o64 != t64))
    note = "" if ratio <= 1 else f"outside the documented error bound of accuracy_level={level}"
    return _row(
        ours.size,
        differing,
        max_diff,
        max_diff / scale if scale else max_diff,
        consistent and ratio <= 1,
        note,
        bound_ratio=ratio,
    )


_CHECKS = {
    "QLinearMatMul": _check_qlinear,
    "MatMulInteger": _check_matmul_integer,
    "MatMulNBits": _check_nbits,
    "QuantizeLinear": _check_quantize,
    "DequantizeLinear": _check_dequantize,
    "DynamicQuantizeLinear": _check_dynamic,
    "QGemm": _check_qgemm,
    "QLinearConv": _check_qlinear_conv,
    "ConvInteger": _check_conv_integer,
    **dict.fromkeys(_ORT_OPERATORS, _check_qlinear_elementwise),
}
