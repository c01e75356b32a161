"""onnx/_tables.py: the session's element-wise groups on one 8-bit tensor as lookup tables: run once on the type's 256 codes, then one table lookup per element and output (the same bits as the nodes).

A quantized model computes many functions of one tensor of codes element by element. An erf-GELU in
a QOperator BERT (``quantize_static``'s all-MiniLM-L6-v2) is seven nodes on the codes x of its
input:

    x -> DequantizeLinear -> Div(sqrt 2) -> Erf -> QuantizeLinear -> QLinearAdd(1) --+
    x --------------------------------------------------------------------------------> QLinearMul -> QLinearMul(1/2) -> y

Every node reads x, a value the group computed from x, or a constant of one element; so each element
of y depends on the element of x at its place alone, and x has 256 possible codes. The session runs
the group's own nodes once on the 256 codes (its numerics, its kernels) when it first meets x's type,
and from then on computes each of the group's outputs as ``table[x]`` (csrc/onnx_ops.cpp's
lookup_codes over the threads): the same bits as running the nodes, about 0.3 ns an element (the
GELU above: 7 nodes, about 320 us for 8 x 16 tokens x 1536 on Zen 4 / 2 threads, become one lookup).

A group is formed in the session's plan (the graph in order) from a node whose inputs are one tensor
x and constants: it takes every later node whose inputs are x, values of the group and constants,
and whose operator is element-wise (_ELEMENTWISE); constants are initializers of one element that no
graph input overrides (the quantization parameters of QuantizeLinear, DequantizeLinear and the QLinear*
operators scalars: per tensor). It is kept when it has at least two nodes, reads x as codes (the
input of a DequantizeLinear or a QLinear* operator's quantized operand) and something outside reads
one of its values (a later node, a subgraph, a graph output): those values are its outputs. Where x
at run time is not int8 / uint8 of rank 1 or more, or the nodes fail on the 256 codes, the group's
nodes run on x as they would have.
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ._common import MS_DOMAIN, plan_links

# element-wise operators: each output element a function of the input elements at its place
_ELEMENTWISE = {
    ("", op)
    for op in (
        "Abs Add Cast Ceil Celu Clip Cos DequantizeLinear Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual "
        "HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Min Mish Mul Neg Not Pow "
        "QuantizeLinear Reciprocal Relu Round Selu Sigmoid Sign Sin Softplus Softsign Sqrt Sub Tan Tanh "
        "ThresholdedRelu Where"
    ).split()
} | {(MS_DOMAIN, op) for op in ("QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu")}
# (domain, op): the inputs read as codes, and those that are quantization parameters (scalar constants)
_CODES_AND_PARAMETERS = {
    ("", "DequantizeLinear"): ((0,), (1, 2)),
    ("", "QuantizeLinear"): ((), (1, 2)),
    (MS_DOMAIN, "QLinearAdd"): ((0, 3), (1, 2, 4, 5, 6, 7)),
    (MS_DOMAIN, "QLinearMul"): ((0, 3), (1, 2, 4, 5, 6, 7)),
    (MS_DOMAIN, "QLinearSigmoid"): ((0,), (1, 2, 3, 4)),
    (MS_DOMAIN, "QLinearLeakyRelu"): ((0,), (1, 2, 3, 4)),
}
_CODE_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))


class CodeTable:
    """A group in the session's plan: ``_run(x)`` returns its outputs, looked up in tables built from its nodes
    on the 256 codes of x's type (per type and rank), or computed by its nodes."""

    op_type = "CodeTable"

    def __init__(self, entries, source: str, outputs: tuple, constants: dict, call):
        self.entries = entries  # (node, input names, output names) of the group's nodes, in order
        self.source, self.outputs, self.constants, self.call = source, outputs, constants, call
        self.onnx_node = entries[0][0].onnx_node  # (error messages name the group's first node)
        self.names = [node.onnx_node.name or node.op_type for node, _, _ in entries]
        self.tables = {}
        self._qmm_attributes = {}  # (the session's _call: no attributes)

    def _bound_call(self, inputs):
        """The outputs by the tables made for x's type and rank, or None before they are made (the session's
        run loop calls it first; _run makes them)."""
        x = inputs[0]
        if type(x) is not np.ndarray or x.ndim < 1:
            return None
        tables = self.tables.get((x.dtype, x.ndim))
        if not tables:
            return None
        codes = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
        return tuple(_lookup(codes, table, (1,) * extra + x.shape) for table, extra in tables)

    def _run(self, x):
        if type(x) is np.ndarray and x.dtype in _CODE_TYPES and x.ndim >= 1:
            key = (x.dtype, x.ndim)
            tables = self.tables.get(key)
            if tables is None:
                tables = self.tables[key] = self._tabulate(x.dtype, x.ndim)
            if tables:
                return self._bound_call((x,))
        return self._evaluate(x)

    def _evaluate(self, x) -> tuple:
        """The group's outputs computed by its nodes from x."""
        values = dict(self.constants)
        values[self.source] = x
        for node, inputs, outputs in self.entries:
            results = self.call(node, [values[name] if name else None for name in inputs])
            values.update(zip(outputs, results))
        return tuple(values[name] for name in self.outputs)

    def _tabulate(self, dtype, ndim: int):
        """[(table of 256 values, leading dimensions added by broadcasting)] per output, from the nodes on x's
        256 codes shaped [1, ..., 1, 256]; False where they fail or an output is not element-wise."""
        codes = np.arange(256, dtype=np.uint8).view(dtype).reshape((1,) * (ndim - 1) + (256,))
        try:
            with np.errstate(all="ignore"):
                values = self._evaluate(codes)
        except Exception:  # noqa: BLE001 (the nodes run on x then, and raise there as they would have)
            return False
        tables = []
        for value in values:
            if type(value) is not np.ndarray or value.dtype.hasobject or value.ndim < ndim or value.size != 256:
                return False
            if value.shape[-1] != 256:
                return False
            tables.append((np.ascontiguousarray(value.reshape(256)), value.ndim - ndim))
        return tables


def _lookup(codes: np.ndarray, table: np.ndarray, shape: tuple) -> np.ndarray:
    out = np.empty(shape, table.dtype)
    if not _core.lookup_codes(codes, table, out.reshape(-1)):  # an element of another size: numpy's
        out.reshape(-1)[:] = table[codes]
    return out


def code_tables(entries: list, constants: dict, graph_outputs: set, call) -> tuple[list, list]:
    """(entries with each group as one CodeTable entry, the groups' node names). entries: the plan's (node,
    input names, output names, runs a subgraph, names read: inputs and subgraphs' reads) in order;
    constants: initializers no graph input overrides; call(node, inputs): how the session runs a node."""
    scalars = {name for name, value in constants.items() if isinstance(value, np.ndarray) and value.size == 1}
    readers, _ = plan_links(entries)
    taken, groups = set(), []
    for i, entry in enumerate(entries):
        variable = _variable_inputs(entry, scalars, constants)
        if i in taken or variable is None or len(variable) != 1:
            continue
        (source,) = variable
        members, values = [], {source}
        for j in range(i, len(entries)):
            inputs = _variable_inputs(entries[j], scalars, constants) if j not in taken else None
            if inputs and inputs <= values:
                members.append(j)
                values.update(name for name in entries[j][2] if name)
        inside = set(members)
        outputs = tuple(
            name
            for j in members
            for name in entries[j][2]
            if name and (name in graph_outputs or readers.get(name, set()) - inside)
        )
        if len(members) < 2 or not outputs or not any(_reads_codes(entries[j], source) for j in members):
            continue
        taken |= inside
        groups.append((members, source, outputs))
    if not groups:
        return entries, []
    first = {members[0]: (members, source, outputs) for members, source, outputs in groups}
    planned, names = [], []
    for i, entry in enumerate(entries):
        if i in first:
            members, source, outputs = first[i]
            group = [entries[j][:3] for j in members]
            reads = {name for node, inputs, _ in group for name in inputs if name in constants}
            table = CodeTable(group, source, outputs, {name: constants[name] for name in reads}, call)
            planned.append((table, (source,), outputs, False, (source,)))
            names.append(table.names)
        elif i not in taken:
            planned.append(entry)
    return planned, names


def _variable_inputs(entry, scalars: set, constants: dict):
    """The names of an element-wise node's inputs that are not one-element constants (a set), or None: not
    element-wise, runs a subgraph, or a quantization parameter that is not a scalar constant."""
    node, inputs, _, context, _ = entry
    key = (node.onnx_node.domain or "", node.op_type)
    if context or key not in _ELEMENTWISE:
        return None
    for index in _CODES_AND_PARAMETERS.get(key, ((), ()))[1]:
        if index < len(inputs) and inputs[index] and (inputs[index] not in scalars or constants[inputs[index]].ndim):
            return None
    return {name for name in inputs if name and name not in scalars}


def _reads_codes(entry, source: str) -> bool:
    node, inputs, _, _, _ = entry
    slots = _CODES_AND_PARAMETERS.get((node.onnx_node.domain or "", node.op_type), ((), ()))[0]
    return any(index < len(inputs) and inputs[index] == source for index in slots)
