"""onnx/_pairs.py: the session's QLinearMatMul -> QLinearAdd(bias) and QLinearConv -> QLinearAdd(residual) pairs as one call: the add applied to each block of the product as the kernels write it (numerics "onnxruntime"), the bits of the two nodes.

``quantize_static`` writes a transformer's MatMul with its bias as a QLinearMatMul whose output one
com.microsoft QLinearAdd reads with a constant row of N codes (QOperator; the QDQ form fuses to the
same pair): 36 of all-MiniLM-L6-v2's 48 QLinearMatMul. Run as two nodes, the add is a second pass over
the product's output and a second node's call (about 15-25 us each at 8 x 16 tokens). Where the
QLinearMatMul holds a constant b (a QLinearMatMul object), its y scale and zero point are constants,
its output is read by the add alone, and the add's scales and zero points and its other operand are
constants (that operand of the product's type, [N] after leading ones), the session runs the pair as
one call of the product with the add as a stage of its output (csrc/qlinear_matmul.h,
QLinearAddStage: ONNX Runtime's QLinearAdd arithmetic on each block's rows, in place). A call the
fast product does not take (another a type or layout, a per-row parameter) runs the two nodes.
"""

from __future__ import annotations

import numpy as np

from ._common import MS_DOMAIN, plan_links, without_leading_ones
from ._qlinear_ops import _SPANS, _add_parameters, _span_mode

_CODES = (np.dtype(np.uint8), np.dtype(np.int8))


class MatMulAdd:
    """A QLinearMatMul -> QLinearAdd pair in the session's plan: ``_run(*the product's inputs)`` returns the
    add's output. With a residual (``with_residual``), a second QLinearAdd of that output and another value
    of the graph follows: ``_run(*the product's inputs, the other value)`` returns the second add's output."""

    def __init__(self, matmul, add, slot: int, codes: np.ndarray, parameters: tuple, add_inputs: list, call, product):
        self.matmul, self.add, self.slot, self.codes, self.call = matmul, add, slot, codes, call
        self.stage = (codes.reshape(-1), slot == 0, parameters)  # qlinear._fast_2d's add
        self.product = product  # the held product bound to its constant parameters (QLinearMatMul._bind), or None
        self._bound_call = None if product is None else self._bound  # (the session's run loop calls it first)
        self.add_inputs = add_inputs  # the add's inputs, the product's slot None
        self.residual = None  # (the second add, the first's output's slot in it, its parameters, its inputs)
        self.op_type = f"{matmul.op_type}+{add.op_type}"
        self.onnx_node = matmul.onnx_node  # (error messages name the product's node)
        self._qmm_attributes = {}  # (the session's _call: no attributes)

    def with_residual(self, add, slot: int, parameters: tuple, add_inputs: list) -> MatMulAdd:
        self.residual = (add, slot, parameters, add_inputs)
        self.op_type += f"+{add.op_type}"
        return self

    def _run(self, *inputs):
        """(The session's run loop has tried the bound call first.)"""
        if self.residual is None:
            product_inputs, other = list(inputs), None
        else:
            *product_inputs, other = inputs
        a, a_scale, a_zero_point, _, _, _, y_scale, y_zero_point = product_inputs + [None] * (8 - len(product_inputs))
        y, residual_done = None, False
        if type(a) is np.ndarray and a.ndim >= 1 and getattr(y_zero_point, "dtype", None) == self.codes.dtype:
            shapes = (a.shape[:-1] + (self.codes.size,), self.codes.shape)
            shape = np.broadcast_shapes(*shapes)
            if _span_mode(*(shapes if self.slot == 0 else shapes[::-1])) == _SPANS:
                stage = self.stage
                if (
                    self.residual is not None
                    and type(other) is np.ndarray
                    and other.dtype == self.codes.dtype
                    and other.shape == shape
                    and other.flags.c_contiguous
                ):  # the residual's codes laid out as the product's rows: a second stage
                    _, slot, parameters, _ = self.residual
                    stage += (other.reshape(-1, self.codes.size), slot == 0, parameters)
                    residual_done = True
                try:
                    y = self.matmul._held._with_add(a, a_scale, a_zero_point, y_scale, y_zero_point, stage)
                except (TypeError, ValueError):  # bad input: the node raises it, naming itself
                    y = None
            if y is not None:
                y = y.reshape(shape)
        if y is None:
            residual_done = False
            (product,) = self.call(self.matmul, product_inputs)
            add_inputs = list(self.add_inputs)
            add_inputs[self.slot] = product
            (y,) = self.call(self.add, add_inputs)
        if self.residual is None or residual_done:
            return (y,)
        add, slot, _, add_inputs = self.residual
        add_inputs = list(add_inputs)
        add_inputs[slot], add_inputs[3 - slot] = y, other
        return self.call(add, add_inputs)

    def _bound(self, inputs):
        """The pair's outputs by the bound product (the product's parameters constants, checked once), or None
        where it does not take the call: an a it does not take, or a residual not laid out as the product's
        rows (the general path then runs that add as a node)."""
        a, codes = inputs[0], self.codes
        if type(a) is not np.ndarray or a.ndim < 1:
            return None
        shape = (1,) * (codes.ndim - a.ndim) + a.shape[:-1] + (codes.size,)
        stage = self.stage
        if self.residual is not None:
            other = inputs[-1]
            if not (
                type(other) is np.ndarray
                and other.dtype == codes.dtype
                and other.shape == shape
                and other.flags.c_contiguous
            ):
                return None
            _, slot, parameters, _ = self.residual
            stage += (other.reshape(-1, codes.size), slot == 0, parameters)
        try:
            y = self.product(a, stage)
        except (TypeError, ValueError):  # bad input: the general path raises it, naming the node
            return None
        return None if y is None else (y.reshape(shape),)


class ConvAdd:
    """A QLinearConv -> QLinearAdd pair whose other operand is a value of the graph (a residual): ``_run(*the
    convolution's inputs, the other operand)`` returns the add's output. In the plan where the add was."""

    def __init__(self, conv, add, slot: int, parameters: tuple, add_inputs: list, call):
        self.conv, self.add, self.slot, self.parameters, self.call = conv, add, slot, parameters, call
        self.add_inputs = add_inputs  # the add's inputs, both operands' slots None
        self.op_type = f"{conv.op_type}+{add.op_type}"
        self.onnx_node = conv.onnx_node
        self._qmm_attributes = {}

    _with_add = None  # the convolution's bound call with the add (QLinearConvCall.bound), made on first use

    def _bound_call(self, inputs):
        """The pair's outputs by the convolution's call with the add as a stage, or None where it does not take
        them (the session's run loop calls it first)."""
        if self._with_add is None:
            self._with_add = self.conv._call.bound((self.slot == 0, self.parameters))
        y = self._with_add(inputs[0], inputs[-1])
        return None if y is None else (y,)

    def _run(self, *inputs):
        """The two nodes (the session's run loop has tried the bound call first)."""
        *conv_inputs, other = inputs
        (product,) = self.call(self.conv, conv_inputs)
        add_inputs = list(self.add_inputs)
        add_inputs[self.slot], add_inputs[3 - self.slot] = product, other
        return self.call(self.add, add_inputs)


def matmul_adds(entries: list, constants: dict, graph_outputs: set, numerics: str, call) -> list:
    """entries (the plan's, as onnx/_tables.py's code_tables takes them) with each such pair as one entry: a
    QLinearMatMul -> QLinearAdd(bias) where the product was (where a residual QLinearAdd follows the bias,
    the three where that add was), a QLinearConv -> QLinearAdd (a residual) where the add was (the other
    operand may come after the product)."""
    if numerics != "onnxruntime":
        return entries
    readers, _ = plan_links(entries)
    placed, dropped = {}, set()  # entry index -> its replacement; the entries folded into a pair
    for i, (node, inputs, outputs, _, _) in enumerate(entries):
        if node.op_type not in ("QLinearMatMul", "QLinearConv") or len(outputs) != 1 or i in dropped:
            continue
        y = outputs[0]
        users = readers.get(y, set())
        if y in graph_outputs or len(users) != 1:
            continue
        (j,) = users
        if j in dropped or j in placed:
            continue
        if node.op_type == "QLinearMatMul" and getattr(node, "_held", None) is not None:
            found = _pair(node, inputs, entries[j], y, constants, call)
            if found is None:
                continue
            placed[i] = (found, inputs, entries[j][2], False, entries[i][4])
            dropped.add(j)
            # a residual add after the bias (a transformer's attention and FFN outputs): the pair takes it too,
            # where that add was (its other operand may come after the product)
            z = entries[j][2][0] if len(entries[j][2]) == 1 else ""
            z_users = readers.get(z, set())
            if not z or z in graph_outputs or len(z_users) != 1:
                continue
            (k,) = z_users
            if k in dropped or k in placed:
                continue
            residual = _residual(entries[k], z, found.codes.dtype, constants)
            if residual is not None:
                add, slot, parameters, values, other = residual
                del placed[i]
                dropped.add(i)
                placed[k] = (
                    found.with_residual(add, slot, parameters, values),
                    (*inputs, other),
                    entries[k][2],
                    False,
                    (*entries[i][4], other),
                )
        elif node.op_type == "QLinearConv" and getattr(node, "_call", None) is not None:
            found = _conv_pair(node, entries[j], y, constants, call)
            if found is not None:
                pair, other = found
                placed[j] = (pair, (*inputs, other), entries[j][2], False, (*entries[i][4], other))
                dropped.add(i)
    if not placed:
        return entries
    return [placed.get(i, entry) for i, entry in enumerate(entries) if i not in dropped]


def _reading(add_entry, y: str, constants: dict):
    """(the add, its inputs, y's slot in it, the other operand's name) where add_entry is a com.microsoft
    QLinearAdd (no subgraph) reading y as one operand, with its scales and zero points constants (and
    checked once: BinaryScalars); else None."""
    add, add_inputs, _, context, _ = add_entry
    if context or add.op_type != "QLinearAdd" or (add.onnx_node.domain or "") != MS_DOMAIN:
        return None
    if getattr(add, "_scalars", None) is None or len(add_inputs) < 8:
        return None
    slots = [s for s in (0, 3) if add_inputs[s] == y]
    if len(slots) != 1 or any(add_inputs[s] not in constants for s in (1, 2, 4, 5, 6, 7)):
        return None
    return add, add_inputs, slots[0], add_inputs[3 - slots[0]]


def _parameters(add, dtype):
    """The add's float32 (rx, ry, k) for operands of dtype, (x, y) = (A, B); None where its scales or zero
    points are refused (the add's own run raises that, as it would have)."""
    try:
        (a_s, b_s, c_s), (zpa, zpb, zpc) = add._scalars.checked(dtype)
    except (TypeError, ValueError):
        return None
    return _add_parameters(float(a_s), zpa, float(b_s), zpb, float(c_s), zpc)


def _residual(add_entry, y: str, dtype, constants: dict):
    """(the add, y's slot in it, its (rx, ry, k), its inputs with both operands' slots None, the other
    operand's name) where an add reading y has another value of the graph as its other operand; else None."""
    found = _reading(add_entry, y, constants)
    if found is None:
        return None
    add, add_inputs, slot, other = found
    parameters = _parameters(add, dtype) if other and other not in constants else None
    if parameters is None:
        return None
    values = [None if not name or i in (0, 3) else constants[name] for i, name in enumerate(add_inputs)]
    return add, slot, parameters, values, other


def _conv_pair(conv, add_entry, y: str, constants: dict, call):
    """(the ConvAdd, the other operand's name) for a convolution and the add reading its output y, where the
    add's other operand is a value of the graph and its parameters constants; else None."""
    residual = _residual(add_entry, y, conv._call._y_zp.dtype, constants)
    if residual is None:
        return None
    add, slot, parameters, values, other = residual
    return ConvAdd(conv, add, slot, parameters, values, call), other


def _pair(matmul, inputs, add_entry, y: str, constants: dict, call):
    """The MatMulAdd for a product and the add reading its output y with a constant row of codes (a bias), or
    None where they do not pair."""
    found = _reading(add_entry, y, constants)
    y_zero_point = constants.get(inputs[7]) if len(inputs) >= 8 and inputs[7] else None
    if found is None or not isinstance(y_zero_point, np.ndarray) or y_zero_point.dtype not in _CODES:
        return None
    add, add_inputs, slot, other = found
    codes, N = constants.get(other), matmul._held.b.shape[1]
    if not isinstance(codes, np.ndarray) or codes.dtype != y_zero_point.dtype or N < 2:
        return None
    parameters = _parameters(add, codes.dtype) if without_leading_ones(codes.shape) == (N,) else None
    if parameters is None:
        return None
    values = [None if not name or i == slot else constants[name] for i, name in enumerate(add_inputs)]
    fixed = [constants.get(inputs[i]) if inputs[i] else None for i in (1, 2, 6, 7)]
    product = matmul._held._bind(*fixed) if all(isinstance(v, np.ndarray) for v in fixed) else None
    return MatMulAdd(matmul, add, slot, np.ascontiguousarray(codes), parameters, values, call, product)
