"""onnx/_fuse.py: the QDQ fusion InferenceSession applies, as ONNX Runtime's graph optimizer does: DequantizeLinear -> MatMul / Gemm / Conv / Add / Mul / Softmax / pooling / Sigmoid / LeakyRelu -> QuantizeLinear groups become QLinearMatMul / QGemm / QLinearConv / ORT's QLinear* nodes.

A QDQ model (``quantize_static(..., quant_format=QuantFormat.QDQ)``, ONNX Runtime's default format)
writes each quantized MatMul as float operators between quantize / dequantize pairs:

    a_q -> DequantizeLinear --+
                              +--> MatMul [-> Relu] -> QuantizeLinear -> y_q
    b_q -> DequantizeLinear --+

ONNX Runtime (graph optimizations on, its default) runs the group as one integer QLinearMatMul
(its QDQ selector / action transformers); run as written, the session would multiply dequantized
float32 values and round their float32 sum, which can land one step of y's scale away, and is 2-3x
slower (onnx.reference's np.matmul on float copies of the weights). ``fuse_qdq`` rewrites a copy of
the graph where the group is a QLinearMatMul, so the session's QLinearMatMul (its ``numerics``;
"onnxruntime": ONNX Runtime's fused bits) runs it. A group is fused when:

- the MatMul's inputs are both DequantizeLinear outputs, of int8 or uint8 values (any combination:
  quantmatmul's QLinearMatMul takes all eight), and its output feeds one QuantizeLinear only, to
  int8 or uint8, directly or through one Relu or Clip that the quantization makes redundant (ONNX
  Runtime's IsClipMadeRedundantByQ, _GraphView._redundant: what it cuts off saturates to the same
  code); neither output is a graph output;
- every scale and zero point is an initializer: float32 scales, finite and nonzero, with a finite
  float32 multiplier ``a_scale * b_scale / y_scale``; a and y per tensor (one element); b per tensor,
  or per column (a [N] scale along axis 1 of a 2-D b initializer); no ``block_size``.

A Gemm group becomes a com.microsoft QGemm likewise (b per column along axis 0 of a transposed
weight), with C absent or the DequantizeLinear of int32 codes with zero point 0 at the scale
``alpha * a_scale * b_scale`` (within 2^-20; the scale QGemm adds C at) and beta 1; without a
QuantizeLinear reading its output, a float32 QGemm (ONNX Runtime fuses that form too).

A Conv group becomes a QLinearConv likewise (ORT's ConvNodeGroupSelector): x and w dequantized (w per
tensor or per output channel, an [M] scale on axis 0 of the weight initializer), an optional bias the
DequantizeLinear of int32 codes with zero point 0 at the scale ``x_scale * w_scale`` (within 2^-20),
one QuantizeLinear reading the output; the Conv's attributes go with it; any int8 / uint8 types.

An Add or Mul of two DequantizeLinear outputs, or a Softmax, GlobalAveragePool, AveragePool (no
dilations), Sigmoid or LeakyRelu of one, quantized by one QuantizeLinear (directly or through a
redundant Relu / Clip), all uint8 with per-tensor initializer parameters, becomes com.microsoft QLinearAdd /
QLinearMul / QLinearSoftmax / QLinearGlobalAveragePool / QLinearAveragePool / QLinearSigmoid /
QLinearLeakyRelu (ORT's binary and unary QDQ rules; the Softmax's axis, its opset's default where
absent, and the opset, the pool's attributes and LeakyRelu's alpha go with it); a Concat of
DequantizeLinear outputs likewise becomes QLinearConcat (ORT's variadic rule). int8 element-wise
groups stay as written: ONNX Runtime on x86 does not fuse int8 QDQ groups as such (QDQIsInt8Allowed
is false there); it first turns some int8 pairs into uint8 (its QDQ S8-to-U8 transformer) and
leaves most int8 Add / Mul as float operators, which is not reproduced (a QDQ all-MiniLM-L6-v2 with
int8 activations agrees with ORT to 9e-8 this way, and is 0.1 off with them fused).

A float activation times a DequantizeLinear of a constant 4- or 8-bit weight, blocked along K (or per
tensor / per column), becomes one MatMulNBits at accuracy level 4, as ORT's DQ -> MatMulNBits fusion
(_nbits_group says when).

A Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Gather, Slice, Expand or MaxPool between a
DequantizeLinear and a QuantizeLinear of one per-tensor scale and zero point runs on the codes, the
pair dropped (ORT's drop-QDQ rule; MaxPool picks the same element on codes as on values for a
positive scale).

Anything else stays as written. A DequantizeLinear whose output nothing reads any more is dropped.
The caller's model is not modified (a copy is rewritten, unless the caller owns the model).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..nbits_layout import pack_nbits
from ._common import AVERAGE_POOL_ATTRIBUTES, CONV_ATTRIBUTES, MS_DOMAIN, attributes, np_dtype

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
_ELEMENTWISE = {
    "Add": "QLinearAdd",
    "Mul": "QLinearMul",
    "Softmax": "QLinearSoftmax",
    "GlobalAveragePool": "QLinearGlobalAveragePool",
    "AveragePool": "QLinearAveragePool",
    "Sigmoid": "QLinearSigmoid",
    "LeakyRelu": "QLinearLeakyRelu",
}
_BINARY = ("Add", "Mul")
# ops that only move data (input 0's), and MaxPool, which only picks among it (DequantizeLinear of a positive
# scale keeps the order): a DQ -> op -> Q pair of one scale and zero point is dropped, the op runs on the codes
_DATA_MOVEMENT = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Slice", "Expand", "MaxPool")
_PASS_THROUGH = (*_DATA_MOVEMENT, "Identity")  # ops whose output has input 0's element type
_NBITS_TYPES = {
    onnx.TensorProto.INT4: 4,
    onnx.TensorProto.UINT4: 4,
    onnx.TensorProto.INT8: 8,
    onnx.TensorProto.UINT8: 8,
}


def fuse_qdq(model: onnx.ModelProto, *, in_place: bool = False) -> tuple[onnx.ModelProto, list[str]]:
    """(model with its fusable QDQ groups as QLinearMatMul / QGemm / QLinearConv / ORT's QLinear* nodes and its
    data-movement nodes (and MaxPool) between equal quantizations on the codes, the names of the rewritten
    nodes); the model itself when nothing fuses. A copy is rewritten unless in_place."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    view = _GraphView(graph, opset)
    groups = [g for g in map(view.group, graph.node) if g is not None]
    if not groups:
        return model, []
    if not in_place:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model, graph = copy, copy.graph

    names = view.names
    new_initializers = []

    def constant(array: np.ndarray, hint: str) -> str:
        name = _unique(hint, names)
        new_initializers.append(numpy_helper.from_array(array, name))
        return name

    def zero_point(given: str, dtype: np.dtype, hint: str) -> str:
        return given or constant(np.zeros((), dtype), f"{hint}_zero_point_fused")

    replaced = {}  # id of the node where a group's fused node goes (its QuantizeLinear, or a float Gemm)
    dropped = set()  # ids of the nodes folded into a group
    for g in groups:
        anchor = g.q if g.q is not None else g.node
        replaced[id(anchor)] = _fused_node(g, view.opset, zero_point, constant)
        dropped |= {id(n) for n in (g.node, g.relu) if n is not None and n is not anchor}

    nodes = [replaced.get(id(node), node) for node in view.nodes if id(node) not in dropped]
    # DequantizeLinear nodes of the groups that nothing reads any more
    read = {name for node in nodes for name in node.input} | view.outer_reads | view.graph_outputs
    candidates = {id(dq) for g in groups for dq in g.inputs}
    nodes = [n for n in nodes if id(n) not in candidates or n.output[0] in read]

    kept = [onnx.NodeProto() for _ in nodes]  # copies first: in place, clearing graph.node frees the originals
    for target, node in zip(kept, nodes):
        target.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(new_initializers)
    ms = any(g.node.op_type in ("Gemm", "Concat", *_ELEMENTWISE) or g.nbits is not None for g in groups)
    if ms and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model, [g.node.name for g in groups]


def _fused_node(g, opset: int, zero_point, constant) -> onnx.NodeProto:
    """The node that runs group g: the data-movement node itself on the codes, ORT's element-wise
    QLinear* operator, QLinearMatMul, QGemm, QLinearConv or MatMulNBits. zero_point(name, dtype, hint): a
    zero-point input's name, a new zero initializer where the group's has none; constant(array, hint): a
    new initializer's name."""
    label = g.node.name or g.node.output[0]
    if g.nbits is not None:
        return _nbits_node(g, constant, label)
    if g.node.op_type in _DATA_MOVEMENT:
        moved = onnx.NodeProto()
        moved.CopyFrom(g.node)
        moved.input[0], moved.output[0] = g.a.input[0], g.q.output[0]
        return moved
    if g.node.op_type in _ELEMENTWISE:
        return _elementwise_node(g, opset, zero_point, label)
    if g.node.op_type == "Conv":
        return _conv_node(g, zero_point, label)
    if g.node.op_type == "Concat":
        inputs = _parameters(g.q, g.y_dtype, f"{label}_y", zero_point)
        for i, dq in enumerate(g.inputs):
            inputs += [dq.input[0], *_parameters(dq, g.y_dtype, f"{label}_{i}", zero_point)]
        axis = int(_attr(g.node, "axis", 0))
        return helper.make_node(
            "QLinearConcat", inputs, [g.q.output[0]], name=g.node.name or None, domain=MS_DOMAIN, axis=axis
        )
    inputs = [g.a.input[0], *_parameters(g.a, g.a_dtype, f"{label}_a", zero_point)]
    inputs += [g.b.input[0], *_parameters(g.b, g.b_dtype, f"{label}_b", zero_point)]
    if g.node.op_type == "Gemm":
        inputs.append(g.c.input[0] if g.c is not None else "")
    if g.q is not None:
        inputs += _parameters(g.q, g.y_dtype, f"{label}_y", zero_point)
    output = g.q.output[0] if g.q is not None else g.node.output[0]
    if g.node.op_type == "MatMul":
        return helper.make_node("QLinearMatMul", inputs, [output], name=g.node.name or None)
    return helper.make_node(
        "QGemm",
        inputs,
        [output],
        name=g.node.name or None,
        domain=MS_DOMAIN,
        alpha=float(_attr(g.node, "alpha", 1.0)),
        transA=_attr(g.node, "transA", 0),
        transB=_attr(g.node, "transB", 0),
    )


def _parameters(node, dtype, hint: str, zero_point) -> list[str]:
    """A DequantizeLinear's or QuantizeLinear's scale and zero point (a new zero where it has none)."""
    return [node.input[1], zero_point(_arg(node, 2), dtype, hint)]


def _conv_node(g, zero_point, label: str) -> onnx.NodeProto:
    """The QLinearConv of a Conv group: the Conv's attributes, its bias's int32 codes (ORT's QDQ action)."""
    inputs = [g.a.input[0], *_parameters(g.a, g.a_dtype, f"{label}_x", zero_point)]
    inputs += [g.b.input[0], *_parameters(g.b, g.b_dtype, f"{label}_w", zero_point)]
    inputs += _parameters(g.q, g.y_dtype, f"{label}_y", zero_point)
    if g.c is not None:
        inputs.append(g.c.input[0])
    node = helper.make_node("QLinearConv", inputs, [g.q.output[0]], name=g.node.name or None)
    node.attribute.extend(a for a in g.node.attribute if a.name in CONV_ATTRIBUTES)
    return node


def _nbits_node(g, constant, label: str) -> onnx.NodeProto:
    """The MatMulNBits of a blocked (or per-tensor / per-channel) weight-only group (ORT's DQ -> MatMul
    action): B, scales and zero points in MatMulNBits' layout as new initializers."""
    arrays, attrs = g.nbits
    inputs = [g.node.input[0]] + [constant(arrays[k], f"{label}_{k}") for k in ("B", "scales")]
    if arrays.get("zero_points") is not None:
        inputs.append(constant(arrays["zero_points"], f"{label}_zero_points"))
    return helper.make_node(
        "MatMulNBits", inputs, [g.node.output[0]], name=g.node.name or None, domain=MS_DOMAIN, **attrs
    )


def _elementwise_node(g, opset: int, zero_point, label: str) -> onnx.NodeProto:
    """The QLinear* node of an element-wise or pooling group (ORT's QDQ actions)."""
    inputs = []
    for dq, hint in ((g.a, "a"), (g.b, "b")):
        if dq is not None:
            inputs += [dq.input[0], *_parameters(dq, g.y_dtype, f"{label}_{hint}", zero_point)]
    inputs += _parameters(g.q, g.y_dtype, f"{label}_y", zero_point)
    attributes = {}
    if g.node.op_type == "Softmax":  # the Softmax's axis (its opset's default: 1 before 13, then -1)
        attributes = {"axis": int(_attr(g.node, "axis", 1 if opset < 13 else -1)), "opset": int(opset)}
    elif g.node.op_type == "GlobalAveragePool":
        attributes = {"channels_last": 0}
    elif g.node.op_type == "LeakyRelu":
        attributes = {"alpha": float(_attr(g.node, "alpha", 0.01))}
    op_type = _ELEMENTWISE[g.node.op_type]
    node = helper.make_node(op_type, inputs, [g.q.output[0]], name=g.node.name or None, domain=MS_DOMAIN, **attributes)
    if g.node.op_type == "AveragePool":
        node.attribute.extend(a for a in g.node.attribute if a.name in AVERAGE_POOL_ATTRIBUTES)
    return node


class _Group:
    """A fusable group: the MatMul / Gemm / ... node, the DequantizeLinear nodes of a, b (and a Gemm's or
    Conv's bias c, or None; a Concat's further inputs: more), a redundant Relu / Clip or None, the QuantizeLinear
    of y (None: a float Gemm output) and the types of a, b and y."""

    def __init__(self, node, a, b, c, relu, q, a_dtype, b_dtype, y_dtype, more=()):
        self.node, self.a, self.b, self.c, self.relu, self.q = node, a, b, c, relu, q
        self.a_dtype, self.b_dtype, self.y_dtype = a_dtype, b_dtype, y_dtype
        self.inputs = [n for n in (a, b, c, *more) if n is not None]  # every DequantizeLinear it reads
        self.nbits = None  # a weight-only group: MatMulNBits' inputs and attributes (_nbits_group)


class _GraphView:
    """The graph's producers, readers, initializers and declared types, for matching groups."""

    def __init__(self, graph: onnx.GraphProto, opset: int):
        self.opset = opset  # the default domain's: a Softmax's axis default and QLinearSoftmax's opset
        self.nodes = list(graph.node)
        self.inits = {t.name: t for t in graph.initializer}
        self.producer = {name: node for node in self.nodes for name in node.output if name}
        self.readers = defaultdict(list)
        for node in self.nodes:
            for i, name in enumerate(node.input):
                if name:
                    self.readers[name].append((node, i))
        self.graph_outputs = {o.name for o in graph.output}
        # names read inside subgraphs (If / Loop / Scan bodies) from this scope: never fused away
        self.outer_reads = set()
        for node in self.nodes:
            self.outer_reads |= subgraph_reads(node)
        self.declared = {}
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                self.declared[value.name] = value.type.tensor_type.elem_type
        self.names = set(self.inits) | set(self.producer) | {v.name for v in graph.input} | self.outer_reads

    def only_reader(self, name: str):
        """The one node reading name as its first input, or None (several readers, another input, a graph
        output, a subgraph's read)."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or readers[0][1] != 0 or name in self.graph_outputs or name in self.outer_reads:
            return None
        return readers[0][0]

    def constant(self, node, index: int):
        """Initializer input `index` of node as an array; None when absent; False when not an initializer."""
        name = _arg(node, index)
        if not name:
            return None
        tensor = self.inits.get(name)
        return False if tensor is None else numpy_helper.to_array(tensor)

    def dtype(self, name: str, depth: int = 0):
        """The element type of a tensor where the graph says it, else None."""
        if name in self.inits:
            return np_dtype(self.inits[name].data_type)
        if name in self.declared:
            return np_dtype(self.declared[name])
        node = self.producer.get(name)
        if node is None or depth > 16:
            return None
        if _is(node, "QuantizeLinear"):
            return _quantized_dtype(node, self.constant(node, 2))
        if _is(node, "DynamicQuantizeLinear") and name == node.output[0]:
            return np.dtype(np.uint8)
        if node.op_type in _PASS_THROUGH and node.domain in ("", "ai.onnx"):
            return self.dtype(node.input[0], depth + 1)
        return None

    def group(self, node):
        """The fusable group around a MatMul, Gemm, Conv or element-wise / pooling node, or a data-movement
        node's (or MaxPool's) QDQ pair to drop, or None."""
        if node.op_type in _ELEMENTWISE and _is(node, node.op_type):
            return self._elementwise_group(node)
        if node.op_type in _DATA_MOVEMENT and _is(node, node.op_type):
            return self._drop_group(node)
        if _is(node, "Conv"):
            return self._conv_group(node)
        if _is(node, "Concat"):
            return self._concat_group(node)
        if (_is(node, "MatMul") or _is(node, "Gemm")) and _is(self.producer.get(_arg(node, 1)), "DequantizeLinear"):
            if not _is(self.producer.get(_arg(node, 0)), "DequantizeLinear"):
                return self._nbits_group(node)  # a float activation times a dequantized weight
        if _is(node, "MatMul") and len(node.input) == 2:
            trans_b, alpha, c = False, 1.0, None
        elif _is(node, "Gemm") and len(node.input) in (2, 3):
            trans_b, alpha = bool(_attr(node, "transB", 0)), float(_attr(node, "alpha", 1.0))
            c = self.producer.get(_arg(node, 2)) if _arg(node, 2) else None
            if _arg(node, 2) and not (_is(c, "DequantizeLinear") and float(_attr(node, "beta", 1.0)) == 1.0):
                return None  # a float C, or beta scaling it: ORT's QGemm adds C as it is
        else:
            return None
        a, b = (self.producer.get(name) for name in node.input[:2])
        if not (_is(a, "DequantizeLinear") and _is(b, "DequantizeLinear")) or not node.output:
            return None
        q, relu = self._quantized_output(node)
        if q is None and (node.op_type != "Gemm" or self._read_by_quantize(node.output[0])):
            return None  # a MatMul fuses with its QuantizeLinear; a Gemm also on its own (float output)
        if q is not None and _attr(q, "precision", 0):
            return None
        if any(_attr(n, "block_size", 0) for n in (a, b, q) if n is not None):
            return None
        a_dtype, b_dtype = (self._operand_dtype(n) for n in (a, b))
        y_zp = self.constant(q, 2) if q is not None else None
        y_dtype = _quantized_dtype(q, y_zp) if q is not None else None
        if a_dtype not in _INT8 or b_dtype not in _INT8 or (q is not None and y_dtype not in _INT8):
            return None
        params = [(self.constant(n, 1), self.constant(n, 2)) for n in (a, b)]
        params.append((self.constant(q, 1), y_zp) if q is not None else (np.ones((), np.float32), None))
        if any(s is None or s is False or z is False for s, z in params):
            return None  # a scale or zero point computed at run time
        (a_s, a_z), (b_s, b_z), (y_s, y_z) = params
        if any(s.dtype != np.float32 or not np.all(np.isfinite(s)) or np.any(s == 0) for s in (a_s, b_s, y_s)):
            return None
        if not all(_per_tensor(s, z) for s, z in ((a_s, a_z), (y_s, y_z))) or not self._b_params(b, b_s, b_z, trans_b):
            return None
        with np.errstate(over="ignore", under="ignore"):
            scale = (np.float32(alpha) * a_s.reshape(-1)) * b_s.reshape(-1)
            if not np.all(np.isfinite(scale / y_s.reshape(-1))) or not np.all(np.isfinite(scale)):
                return None
        if c is not None and not self._bias(c, scale, b_s.size):
            return None
        if q is not None and not self._redundant(relu, y_s, y_z, y_dtype):
            return None
        return _Group(node, a, b, c, relu, q, a_dtype, b_dtype, y_dtype)

    def _conv_group(self, node):
        """DequantizeLinear x 2 (x, w) [and an int32 bias's] -> Conv [-> redundant Relu / Clip] -> QuantizeLinear, any
        int8 / uint8 types: one QLinearConv (ORT's ConvNodeGroupSelector and its action; the types as the
        MatMul group takes them)."""
        if len(node.input) not in (2, 3) or not node.output:
            return None
        x, w = (self.producer.get(name) for name in node.input[:2])
        c = self.producer.get(_arg(node, 2)) if _arg(node, 2) else None
        if not (_is(x, "DequantizeLinear") and _is(w, "DequantizeLinear")) or (
            _arg(node, 2) and not _is(c, "DequantizeLinear")
        ):
            return None  # a float bias: ORT's selector wants every input dequantized
        q, relu = self._quantized_output(node)
        if (
            q is None
            or _attr(q, "precision", 0)
            or any(_attr(n, "block_size", 0) for n in (x, w, c, q) if n is not None)
        ):
            return None
        x_dtype, w_dtype = self._operand_dtype(x), self._operand_dtype(w)
        y_zp = self.constant(q, 2)
        y_dtype = _quantized_dtype(q, y_zp)
        if x_dtype not in _INT8 or w_dtype not in _INT8 or y_dtype not in _INT8:
            return None
        params = [(self.constant(n, 1), self.constant(n, 2)) for n in (x, w)] + [(self.constant(q, 1), y_zp)]
        if any(s is None or s is False or z is False for s, z in params):
            return None
        (x_s, x_z), (w_s, w_z), (y_s, y_z) = params
        if any(s.dtype != np.float32 or not np.all(np.isfinite(s)) or np.any(s == 0) for s in (x_s, w_s, y_s)):
            return None
        if not (_per_tensor(x_s, x_z) and _per_tensor(y_s, y_z)) or not self._conv_weight_params(w, w_s, w_z):
            return None
        with np.errstate(over="ignore", under="ignore"):
            scale = x_s.reshape(-1) * w_s.reshape(-1)
            if not np.all(np.isfinite(scale)) or not np.all(np.isfinite(scale / y_s.reshape(-1))):
                return None
        if c is not None and not self._bias(c, scale, w_s.size):
            return None
        if not self._redundant(relu, y_s, y_z, y_dtype):
            return None
        return _Group(node, x, w, c, relu, q, x_dtype, w_dtype, y_dtype)

    def _conv_weight_params(self, dq, scale, zp) -> bool:
        """w per tensor, or per output channel: a [M] scale along axis 0 of the weight initializer [M, ...]."""
        if _per_tensor(scale, zp):
            return True
        w = self.inits.get(dq.input[0])
        if w is None or len(w.dims) < 3 or _attr(dq, "axis", 1) not in (0, -len(w.dims)):
            return False
        shape = (w.dims[0],)
        return scale.shape == shape and (zp is None or zp.shape == shape)

    def _elementwise_group(self, node):
        """Add / Mul of two DequantizeLinear outputs, or Softmax / GlobalAveragePool / AveragePool / Sigmoid /
        LeakyRelu of one, quantized by one QuantizeLinear, all uint8 with per-tensor initializer parameters:
        ORT's QLinear* operator (its binary and unary QDQ selectors)."""
        arity = 2 if node.op_type in _BINARY else 1
        if len(node.input) != arity or not node.output:
            return None
        if node.op_type == "AveragePool" and any(d != 1 for d in _attr(node, "dilations", [])):
            return None  # QLinearAveragePool has no dilations
        dqs = [self.producer.get(name) for name in node.input]
        if not all(_is(dq, "DequantizeLinear") for dq in dqs):
            return None
        q, relu = self._quantized_output(node)
        if q is None or _attr(q, "precision", 0) or any(_attr(n, "block_size", 0) for n in (*dqs, q)):
            return None
        dtypes = [self._operand_dtype(dq) for dq in dqs]
        y_zp = self.constant(q, 2)
        y_dtype = _quantized_dtype(q, y_zp)
        if y_dtype != np.uint8 or any(t != y_dtype for t in dtypes):
            return None  # int8: ONNX Runtime's x86 optimizer leaves them (see the module's docstring)
        params = [(self.constant(n, 1), self.constant(n, 2)) for n in (*dqs, q)]
        if any(s is None or s is False or z is False for s, z in params) or not all(_per_tensor(*p) for p in params):
            return None
        scales = [s for s, _ in params]
        if any(s.dtype != np.float32 or not np.all(np.isfinite(s)) or np.any(s == 0) for s in scales):
            return None
        if node.op_type == "Softmax" and not scales[0].reshape(-1)[0] > 0:
            return None  # QLinearSoftmax's table needs a positive input scale
        if not self._redundant(relu, *params[-1], y_dtype):
            return None
        b = dqs[1] if arity == 2 else None
        return _Group(node, dqs[0], b, None, relu, q, y_dtype, y_dtype if b is not None else None, y_dtype)

    def _nbits_group(self, node):
        """A float activation times a DequantizeLinear of a constant 4- or 8-bit weight [K, N], blocked along
        K (block_size a power of two >= 16), per tensor or per column, float32 or float16 scales: ONNX Runtime's
        DQ -> MatMul -> MatMulNBits fusion (its DQMatMulNodeGroupSelector), at accuracy level 4 (its
        session option's default); a per-tensor or per-column weight in blocks of 32 (its other default).
        As its selector: the DequantizeLinear read once, no QuantizeLinear reading the product, and no
        Relu / Clip read once after it (ORT's probe for a redundant clip rejects the group then); a Gemm
        with alpha 1, no transposes and no C."""
        if _is(node, "Gemm") and (
            len(node.input) != 2
            or float(_attr(node, "alpha", 1.0)) != 1.0
            or _attr(node, "transA", 0)
            or _attr(node, "transB", 0)
        ):
            return None
        if len(node.input) != 2 or not node.output:
            return None
        dq = self.producer[node.input[1]]
        name = dq.output[0]
        if len(self.readers.get(name, [])) != 1 or name in self.graph_outputs or name in self.outer_reads:
            return None
        out = node.output[0]
        readers = [reader for reader, _ in self.readers.get(out, [])]
        if any(_is(r, "QuantizeLinear") for r in readers):
            return None
        if len(readers) == 1 and out not in self.graph_outputs and readers[0].op_type in ("Relu", "Clip"):
            clip = readers[0].output[0]
            if len(self.readers.get(clip, [])) == 1 and clip not in self.graph_outputs:
                return None
        weight = self.inits.get(dq.input[0])
        bits = _NBITS_TYPES.get(weight.data_type) if weight is not None else None
        scale, zp = self.constant(dq, 1), self.constant(dq, 2)
        if bits is None or len(weight.dims) != 2 or scale is None or scale is False or zp is False:
            return None
        if scale.dtype not in (np.float32, np.float16) or not np.all(np.isfinite(scale)) or _attr(dq, "precision", 0):
            return None
        K, N = (int(d) for d in weight.dims)
        block_size, axis = int(_attr(dq, "block_size", 0)), int(_attr(dq, "axis", 1))
        if block_size:
            blocks = -(-K // block_size)
            if axis not in (0, -2) or block_size < 16 or block_size & (block_size - 1) or scale.shape != (blocks, N):
                return None
        elif scale.ndim == 0 or (scale.shape == (N,) and axis in (1, -1)):
            block_size = 32
            blocks = -(-K // block_size)
        else:
            return None
        if zp is not None and zp.shape != scale.shape:
            return None
        signed = weight.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.INT8)
        shift = 1 << (bits - 1) if signed else 0  # int4 / int8 codes as MatMulNBits' unsigned ones
        codes = np.zeros((N, blocks * block_size), np.uint8)
        codes[:, :K] = (numpy_helper.to_array(weight).astype(np.int16) + shift).T
        scales = np.ascontiguousarray(np.broadcast_to(scale.T if scale.ndim == 2 else scale[..., None], (N, blocks)))
        arrays = {"B": pack_nbits(codes, bits).reshape(N, blocks, block_size * bits // 8), "scales": scales}
        if zp is not None or not signed:  # absent: MatMulNBits' default 2^(bits - 1), right for signed codes only
            z = (zp.astype(np.int16) + shift) if zp is not None else np.zeros(scale.shape, np.int16)
            z = np.ascontiguousarray(np.broadcast_to(z.T if z.ndim == 2 else z[..., None], (N, blocks)))
            arrays["zero_points"] = pack_nbits(z.astype(np.uint8), bits)
        group = _Group(node, None, dq, None, None, None, None, np.dtype(np.uint8), None)
        group.nbits = (arrays, {"K": K, "N": N, "bits": bits, "block_size": block_size, "accuracy_level": 4})
        return group

    def _concat_group(self, node):
        """A Concat of DequantizeLinear outputs quantized by one QuantizeLinear, all uint8 with per-tensor
        initializer parameters: ORT's QLinearConcat (its variadic QDQ selector)."""
        dqs = [self.producer.get(name) for name in node.input]
        if not dqs or not node.output or not all(_is(dq, "DequantizeLinear") for dq in dqs):
            return None
        q = self.only_reader(node.output[0])
        if (
            not _is(q, "QuantizeLinear")
            or _attr(q, "precision", 0)
            or any(_attr(n, "block_size", 0) for n in (*dqs, q))
        ):
            return None
        y_zp = self.constant(q, 2)
        if _quantized_dtype(q, y_zp) != np.uint8 or any(self._operand_dtype(dq) != np.uint8 for dq in dqs):
            return None  # int8: as the element-wise groups
        params = [(self.constant(n, 1), self.constant(n, 2)) for n in (*dqs, q)]
        if any(s is None or s is False or z is False for s, z in params) or not all(_per_tensor(*p) for p in params):
            return None
        if any(s.dtype != np.float32 or not np.all(np.isfinite(s)) or np.any(s == 0) for s, _ in params):
            return None
        u8 = np.dtype(np.uint8)
        return _Group(node, dqs[0], None, None, None, q, u8, None, u8, more=dqs[1:])

    def _drop_group(self, node):
        """DequantizeLinear -> Reshape / Transpose / ... -> QuantizeLinear with one scale and zero point: the
        node can move the 8-bit codes themselves (ORT's drop-QDQ rule). Q(DQ(x)) is x for a normal,
        positive scale (|x - zp| * scale is off by under 255 * 2^-23 relative, far from a half step)."""
        dq = self.producer.get(_arg(node, 0))
        q = self.only_reader(node.output[0]) if len(node.output) == 1 else None
        if not _is(dq, "DequantizeLinear") or not _is(q, "QuantizeLinear") or _attr(q, "precision", 0):
            return None
        if any(
            self.producer.get(name) is not None and _is(self.producer[name], "DequantizeLinear")
            for name in node.input[1:]
        ):
            return None  # ORT's rule has one dequantized input
        if any(_attr(n, "block_size", 0) for n in (dq, q)):
            return None
        (s1, z1), (s2, z2) = [(self.constant(n, 1), self.constant(n, 2)) for n in (dq, q)]
        if any(x is None or x is False for x in (s1, s2)) or z1 is False or z2 is False:
            return None
        if not (_per_tensor(s1, z1) and _per_tensor(s2, z2)) or s1.dtype != np.float32 or s2.dtype != np.float32:
            return None
        dtype = self._operand_dtype(dq)
        if dtype not in _INT8 or _quantized_dtype(q, z2) != dtype:
            return None
        scale = float(s1.reshape(-1)[0])
        zero = [0 if z is None else int(z.reshape(-1)[0]) for z in (z1, z2)]
        if scale != float(s2.reshape(-1)[0]) or zero[0] != zero[1]:
            return None
        if not (np.finfo(np.float32).tiny <= scale <= np.finfo(np.float32).max / 256):
            return None
        return _Group(node, dq, None, None, None, q, dtype, None, dtype)

    def _quantized_output(self, node):
        """(the QuantizeLinear that alone reads node's output, directly or through a Relu or Clip; that Relu /
        Clip or None), or (None, None)."""
        q = clip = self.only_reader(node.output[0])
        if _is(clip, "Relu") or _is(clip, "Clip"):
            q = self.only_reader(clip.output[0])
        else:
            clip = None
        return (q, clip) if _is(q, "QuantizeLinear") else (None, None)

    def _redundant(self, clip, y_scale, y_zero_point, y_dtype) -> bool:
        """Whether the QuantizeLinear (y_scale, y_zero_point, y_dtype) makes a Relu / Clip before it redundant,
        as ORT's IsClipMadeRedundantByQ decides: a Relu where the zero point is the type's minimum; a Clip
        where its bounds quantize past the type's range, ``int32(rint(f32(bound / scale))) + zp <= qmin`` for
        min and ``>= qmax`` for max (float32; a quotient beyond int32, an absent bound's float range
        included, saturates: ORT 1.32 takes a Clip without max as redundant whatever the scale; the sum
        wraps as int32). Where that holds,
        Q(clip(x)) = Q(x) for every x (Q saturates the cut-off values to the same code). The bounds must be
        constants (inputs from opset 11, attributes before)."""
        if clip is None:
            return True
        zp = 0 if y_zero_point is None else int(y_zero_point.reshape(-1)[0])
        info = np.iinfo(y_dtype)
        if clip.op_type == "Relu":
            return zp == info.min
        lowest, highest = np.finfo(np.float32).min, np.finfo(np.float32).max
        if self.opset < 11:  # the bounds as attributes (defaults: the float range)
            c_min, c_max = _attr(clip, "min", lowest), _attr(clip, "max", highest)
        else:  # as inputs, absent for no bound
            bounds = [self.constant(clip, i) for i in (1, 2)]
            if any(b is False or (b is not None and (b.size != 1 or b.dtype != np.float32)) for b in bounds):
                return False  # a bound computed at run time, or not float32
            c_min = lowest if bounds[0] is None else bounds[0].reshape(-1)[0]
            c_max = highest if bounds[1] is None else bounds[1].reshape(-1)[0]

        def quantized(bound) -> int:
            with np.errstate(all="ignore"):
                q = np.rint(np.float32(bound) / np.float32(y_scale.reshape(-1)[0]))
            code = -(2**31) if np.isnan(q) else int(min(max(float(q), -(2.0**31)), 2.0**31 - 1))  # saturated
            return (code + zp + 2**31) % 2**32 - 2**31  # int32 addition wraps

        return quantized(c_min) <= info.min and quantized(c_max) >= info.max

    def _read_by_quantize(self, name: str) -> bool:
        return any(_is(reader, "QuantizeLinear") for reader, _ in self.readers.get(name, []))

    def _bias(self, c, scale, b_columns: int) -> bool:
        """A Gemm's C: int32 codes with zero point 0 at the scale alpha * a_scale * b_scale that QGemm's sum
        has (ONNX Runtime's quantizer writes it so; within float32 rounding), per tensor or per column."""
        codes, c_s, c_z = self.inits.get(c.input[0]), self.constant(c, 1), self.constant(c, 2)
        if codes is None or codes.data_type != onnx.TensorProto.INT32 or c_s is None or c_s is False:
            return False
        if c_z is False or (c_z is not None and np.any(c_z != 0)) or c_s.dtype != np.float32:
            return False
        if c_s.size != 1 and (c_s.size != b_columns or c_s.ndim != 1 or len(codes.dims) != 1):
            return False
        want = np.broadcast_to(scale.astype(np.float64), c_s.reshape(-1).shape)
        return bool(np.all(np.abs(c_s.reshape(-1).astype(np.float64) - want) <= 2.0**-20 * np.abs(want)))

    def _operand_dtype(self, dq):
        zp = self.constant(dq, 2)
        if zp is not None and zp is not False:
            return zp.dtype
        return self.dtype(dq.input[0])

    def _b_params(self, dq, scale, zp, trans_b: bool) -> bool:
        """b per tensor, or per column of a 2-D initializer: axis 1 of [K, N], or 0 of a transposed [N, K]."""
        if _per_tensor(scale, zp):
            return True
        b = self.inits.get(dq.input[0])
        if b is None or len(b.dims) != 2 or _attr(dq, "axis", 1) not in ((0, -2) if trans_b else (1, -1)):
            return False
        shape = (b.dims[0] if trans_b else b.dims[1],)
        return scale.shape == shape and (zp is None or zp.shape == shape)


def _is(node, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _arg(node, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _attr(node, name: str, default):
    return attributes(node, (name,)).get(name, default)


def _per_tensor(scale, zp) -> bool:
    return scale.size == 1 and scale.ndim <= 1 and (zp is None or (zp.size == 1 and zp.ndim <= 1))


def _quantized_dtype(q, zp):
    """A QuantizeLinear's output type: its zero point's, else its output_dtype attribute's, else uint8."""
    if zp is not None and zp is not False:
        return zp.dtype
    if zp is False:
        return None
    output_dtype = _attr(q, "output_dtype", 0)
    return np_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)


def subgraph_reads(node: onnx.NodeProto) -> set:
    """The names the subgraphs of node (If / Loop / Scan bodies, nested) read."""
    names = set()
    for attribute in node.attribute:
        for sub in list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else []):
            for inner in sub.node:
                names.update(n for n in inner.input if n)
                names |= subgraph_reads(inner)
    return names


def _unique(name: str, taken: set) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    taken.add(candidate)
    return candidate
