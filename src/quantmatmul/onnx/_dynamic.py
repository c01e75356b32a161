"""onnx/_dynamic.py: the session's quantize_dynamic products, MatMulInteger -> Cast(to=FLOAT) -> Mul(scale) (-> Add(bias)), as one call whose int32 sums leave the kernel as the float32 values the nodes give.

``quantize_dynamic`` writes each MatMul with a constant weight as a DynamicQuantizeLinear of its input
(shared by the products that read it), a Mul of that scale and the weight's, and MatMulInteger ->
Cast(to=FLOAT) -> Mul(that product), with the model's bias Add after it. Run as nodes, each product
costs an int32 array, three numpy passes over its output and three nodes' Python. Where the
MatMulInteger holds a constant b and each value of the chain is read by the next node alone, the
session runs the chain as one call (csrc: matmul_integer_scaled): per output, in float32,
``f32(float(sum) * scale)`` and then ``+ bias``, each step rounded on its own as the node's numpy
operation rounds it (the Cast rounds an int32 to nearest even, as numpy's astype), so the bits are the
nodes'. A call the fused product does not take (a scale of another type or shape, an a it refuses)
runs the nodes, which raise what they would.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from onnx import TensorProto

from .. import _core
from ._common import plan_links, replaced, without_leading_ones

_F32 = np.dtype(np.float32)


class ScaledMatMulInteger:
    """A MatMulInteger -> Cast -> Mul (-> Add) chain in the session's plan: ``_run(a, a_zero_point, scale)``
    returns its last node's output by the nodes; ``_bound_call`` (the run loop tries it first) by the fused
    product. With ``with_scale_product``, the Mul of a's scale and a constant weight scale that makes
    ``scale`` joins it: ``_run(a, a_zero_point, a_scale)``."""

    def __init__(self, matmul, matmul_values, cast, mul, scale_slot, add, add_values, bias, call):
        self.matmul, self.matmul_values = matmul, matmul_values  # (A, B, a_zero_point, b_zero_point): B's constants
        self.cast, self.mul, self.scale_slot = cast, mul, scale_slot
        self.add, self.add_values, self.bias, self.call = add, add_values, bias, call
        self.scale_product = None  # (the Mul node, its inputs with a's scale's slot None) where it joined
        self.op_type = "+".join(node.op_type for node in (matmul, cast, mul, add) if node is not None)
        self.onnx_node = matmul.onnx_node  # (error messages name the product's node)
        self._qmm_attributes = {}  # (the session's _call: no attributes)

    def with_scale_product(self, mul, values):
        self.scale_product = (mul, values)
        self.op_type = f"{mul.op_type}+{self.op_type}"
        (weight_scale,) = (v for v in values if v is not None)
        held, N = self.matmul._held, self.matmul._held.x.shape[1]
        if without_leading_ones(weight_scale.shape) in ((), (1,), (N,)) and held.packed is not None:
            # the product's arguments in one C++ call (_core.matmul_integer_scaled_rows), a's aside
            zero_points = np.ascontiguousarray(np.broadcast_to(held.zp, (N,)), np.int32)
            self._rows = (held.packed, zero_points, weight_scale.ndim, np.ascontiguousarray(weight_scale).reshape(-1))
        return self

    _rows = None  # (b packed, its zero points [N], the weight scale's rank and values) where a's scale makes the scale

    def _bound_call(self, inputs):
        a, a_zero_point, scale = inputs
        if self._rows is not None:  # a's scale times the weight's, the product, the bias: one call
            packed, zero_points, scale_ndim, weight_scale = self._rows
            if _one_call_takes(a, a_zero_point, scale, scale_ndim):
                y = _core.matmul_integer_scaled_rows(
                    a, a_zero_point, packed, zero_points, scale, weight_scale, self.bias
                )
                return (y,)
        if self.scale_product is not None:  # numpy's product, as the Mul node's
            _, values = self.scale_product
            if type(scale) is not np.ndarray or scale.dtype != _F32:
                return None
            scale = np.asarray(np.multiply(*(scale if v is None else v for v in values)))  # (0-d: a numpy scalar)
        y = self.matmul._scaled(a, a_zero_point, scale, self.bias)
        return None if y is None else (y,)

    def _run(self, a, a_zero_point, scale):
        if self.scale_product is not None:
            mul, values = self.scale_product
            (scale,) = self.call(mul, [scale if v is None else v for v in values])
        values = list(self.matmul_values)
        values[0] = a
        if len(values) > 2:
            values[2] = a_zero_point
        (value,) = self.call(self.matmul, values)
        (value,) = self.call(self.cast, [value])
        (value,) = self.call(self.mul, [value, scale] if self.scale_slot == 1 else [scale, value])
        if self.add is not None:
            (value,) = self.call(self.add, [value if v is None else v for v in self.add_values])
        return (value,)


def _one_call_takes(a, a_zero_point, scale, weight_scale_ndim: int) -> bool:
    """Whether matmul_integer_scaled_rows may take a, its zero point and a's scale (its own checks aside): arrays,
    a float32 scale, a zero point of one value or none, and a scale product (a's scale times the weight's, of
    weight_scale_ndim dimensions) of no more dimensions than a."""
    return (
        type(a) is np.ndarray
        and type(scale) is np.ndarray
        and scale.dtype == _F32
        and max(scale.ndim, weight_scale_ndim) <= a.ndim
        and (a_zero_point is None or (type(a_zero_point) is np.ndarray and a_zero_point.size == 1))
    )


def scaled_matmuls(entries: list, constants: dict, graph_outputs: set, call) -> list:
    """entries (the plan's, as onnx/_pairs.py's matmul_adds takes them) with each MatMulInteger (a constant
    b) -> Cast(to=FLOAT) -> Mul (-> Add of a constant float32 bias [N]) chain as one entry where its last
    node was (the scale may come after the product), each value of the chain read by the next node alone
    and none a graph output."""
    readers, producers = plan_links(entries)
    placed, used = {}, set()

    def reader(i, op_type):
        """(j, the value) where entries[i] has one output, read by entries[j] alone, an op_type of the ONNX
        domain running no subgraph and in no chain yet; else None."""
        outputs = entries[i][2]
        if len(outputs) != 1 or outputs[0] in graph_outputs or len(readers.get(outputs[0], ())) != 1:
            return None
        (j,) = readers[outputs[0]]
        node, _, _, context, _ = entries[j]
        if context or j in used or node.onnx_node.op_type != op_type or (node.onnx_node.domain or "") != "":
            return None
        return j, outputs[0]

    for i, (node, inputs, _, _, _) in enumerate(entries):
        held = getattr(node, "_held", None) if node.onnx_node.op_type == "MatMulInteger" else None
        if held is None or held.x.ndim != 2 or i in used:
            continue
        cast = reader(i, "Cast")
        if cast is None or getattr(entries[cast[0]][0], "to", None) != TensorProto.FLOAT:
            continue
        mul = reader(cast[0], "Mul")
        mul_inputs = entries[mul[0]][1] if mul is not None else ()
        if mul is None or len(mul_inputs) != 2 or mul_inputs.count(mul[1]) != 1:
            continue
        scale_slot = 1 - mul_inputs.index(mul[1])
        chain, add, add_values, bias = [i, cast[0], mul[0]], None, None, None
        found = reader(mul[0], "Add")
        if found is not None and len(entries[found[0]][1]) == 2 and entries[found[0]][1].count(found[1]) == 1:
            add_inputs = entries[found[0]][1]
            value = constants.get(add_inputs[1 - add_inputs.index(found[1])])
            if type(value) is np.ndarray and value.dtype == _F32 and value.shape == (held.x.shape[1],):
                add, bias = entries[found[0]][0], np.ascontiguousarray(value)
                add_values = [None if name == found[1] else value for name in add_inputs]
                chain.append(found[0])
        matmul_values = [None if k in (0, 2) or not name else constants.get(name) for k, name in enumerate(inputs)]
        fused = ScaledMatMulInteger(
            node, matmul_values, entries[cast[0]][0], entries[mul[0]][0], scale_slot, add, add_values, bias, call
        )
        last, scale = chain[-1], mul_inputs[scale_slot]
        product = _scale_product(entries, producers, readers, scale, mul[0], constants, graph_outputs, used)
        if product is not None:  # the scale's own Mul (a's scale times the weight's) joins the chain
            k, a_scale, values = product
            fused.with_scale_product(entries[k][0], values)
            chain.append(k)
            scale = a_scale
        reads = (inputs[0], inputs[2] if len(inputs) > 2 else "", scale)
        placed[last] = (fused, reads, entries[last][2], False, reads)
        used.update(chain)
    return replaced(entries, placed, used)


def _scale_product(entries, producers, readers, scale, reader, constants, graph_outputs, used):
    """(its index, a's scale, its inputs with that slot None) where the value scale is the output of a Mul of
    the ONNX domain of a value and a constant float32 array, read by entries[reader] alone; else None."""
    k = producers.get(scale)
    if k is None or scale in graph_outputs or readers.get(scale) != {reader}:
        return None
    node, inputs, outputs, context, _ = entries[k]
    if context or k in used or node.onnx_node.op_type != "Mul" or (node.onnx_node.domain or "") != "":
        return None
    if len(inputs) != 2 or len(outputs) != 1:
        return None
    fixed = [constants.get(name) for name in inputs]
    variable = [i for i, value in enumerate(fixed) if value is None]
    if len(variable) != 1 or any(v is not None and (type(v) is not np.ndarray or v.dtype != _F32) for v in fixed):
        return None
    return k, inputs[variable[0]], fixed  # (fixed: None at a's scale's slot)


class SiblingProducts:
    """quantize_dynamic products of one a (its zero point and scale: an attention's query, key and value) as one
    product of a and their weights side by side (csrc: matmul_integer_scaled_rows with widths), each output
    its own array. Every column's sum, scale and bias are its product's, so the bits are the products'. The
    weights are packed side by side once; the products' own packed copies are let go (an input the one call
    does not take runs the products' nodes, which then pack their weight per call)."""

    def __init__(self, members: list, call):
        self.members, self.call = members, call
        self.op_type = "+".join(member.op_type for member in members)
        self.onnx_node = members[0].onnx_node  # (error messages name the first product's node)
        self._qmm_attributes = {}  # (the session's _call: no attributes)
        helds = [member.matmul._held for member in members]
        self.widths = [held.x.shape[1] for held in helds]
        weights = np.ascontiguousarray(np.concatenate([held.x for held in helds], axis=1))
        self.packed = _core.pack_b(weights[None], weights.dtype == np.int8)
        self.zero_points = np.concatenate([member._rows[1] for member in members])
        self.scale_ndim = max(member._rows[2] for member in members)
        self.weight_scale = np.concatenate(
            [np.broadcast_to(member._rows[3], (n,)) for member, n in zip(members, self.widths, strict=True)]
        ).astype(_F32)
        biases = [member.bias for member in members]
        self.bias = None if biases[0] is None else np.concatenate(biases)
        for member, held in zip(members, helds, strict=True):  # (one packed copy of the weights)
            member.matmul._held = held._replace(packed=None)
            member._rows = None

    def _bound_call(self, inputs):
        a, a_zero_point, scale = inputs
        if _one_call_takes(a, a_zero_point, scale, self.scale_ndim):
            return _core.matmul_integer_scaled_rows(
                np.ascontiguousarray(a),
                a_zero_point,
                self.packed,
                self.zero_points,
                scale,
                self.weight_scale,
                self.bias,
                self.widths,
            )
        return None

    def _run(self, *inputs):
        return tuple(y for member in self.members for y in self.call(member, list(inputs)))


def sibling_products(entries: list, call) -> list:
    """entries with the ScaledMatMulInteger entries that read the same a, zero point and scale of a through the
    one-call path (a's scale times a constant weight scale), with weights of one type and K and all or none
    with a bias, as one SiblingProducts entry where the first of them was (it reads what they read)."""
    groups = defaultdict(list)
    for i, (node, reads, outputs, _, _) in enumerate(entries):
        if isinstance(node, ScaledMatMulInteger) and node._rows is not None and len(outputs) == 1:
            x = node.matmul._held.x
            groups[(reads, node.bias is not None, x.dtype, x.shape[0])].append(i)
    placed, used = {}, set()
    for members in groups.values():
        if len(members) < 2:
            continue
        fused = SiblingProducts([entries[i][0] for i in members], call)
        first = entries[members[0]]
        outputs = tuple(name for i in members for name in entries[i][2])
        placed[members[0]] = (fused, first[1], outputs, False, first[4])
        used.update(members)
    return replaced(entries, placed, used)
