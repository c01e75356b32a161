"""onnx/_layer_norms.py: the session's LayerNormalization with the nodes around it (a residual Add or a DequantizeLinear before, a QuantizeLinear or DynamicQuantizeLinear after) as one C++ call with the nodes' bits.

Every transformer block normalizes twice, and each quantization format puts nodes on both sides:
``quantize_static``'s QOperator and QDQ models ``DequantizeLinear -> LayerNormalization ->
QuantizeLinear``, ``quantize_dynamic``'s ``Add (the residual) -> LayerNormalization ->
DynamicQuantizeLinear`` (the normalized value read by the next residual Add too). Run as nodes, each
costs its Python and a pass over memory. Where the nodes fit (a bound LayerNormalization: float32
weights given as initializers, stash_type 1, only its first output; the node before it read by it
alone; per-tensor 8-bit parameters given as initializers), the session runs them as one call
(csrc: layer_norm_staged): the dequantization, the residual sum, the rows and the quantization are
each the nodes' own arithmetic (dequantize_linear_f32, one float32 addition, layer_norm_rows,
quantize_linear_f32, dynamic_quantize_linear), so the bits are the nodes'. An input the call does
not take runs the nodes, which raise what they would.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun

from .. import _core
from ._common import plan_links, replaced

_F32 = np.dtype(np.float32)
_CODES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1}  # qmm::IntType
_FLOAT_OUT, _DYNAMIC_OUT = -1, -2  # layer_norm_staged's out_type besides the IntType of codes


class NormGroup:
    """A LayerNormalization with a head (None, "add" or "dequantize") and a tail (None, "quantize" or
    "dynamic") in the session's plan: ``_run(*reads)`` returns its outputs computed node by node,
    ``_bound_call`` (the run loop tries it first) in one call."""

    def __init__(self, norm, head, tail, entries, reads, outputs, constants, call):
        self.norm, self.head, self.tail = norm, head, tail
        self.entries = entries  # (node, input names, output names) of the group's nodes, in order
        self.reads, self.outputs, self.constants, self.call = reads, outputs, constants, call
        self.op_type = "+".join(node.op_type for node, _, _ in entries)
        self.onnx_node = norm.onnx_node  # (error messages name the LayerNormalization)
        self._qmm_attributes = {}  # (the session's _call: no attributes)
        self.x_parameters = (0.0, 0)
        if head == "dequantize":
            scale, zero_point, self.x_dtypes = entries[0][0]._dequantize.per_tensor
            self.x_parameters = (scale, zero_point)
        self.out = (_FLOAT_OUT, 0.0, 0)
        if tail == "quantize":
            scale, zero_point, dtype = entries[-1][0]._quantize.per_tensor
            self.out = (_CODES[dtype], scale, zero_point)
        elif tail == "dynamic":
            self.out = (_DYNAMIC_OUT, 0.0, 0)

    def _bound_call(self, inputs):
        scale, bias, epsilon, fits = self.norm._rows
        x, residual = inputs[0], None
        if not fits(x) or x.size == 0:
            return None
        if self.head == "dequantize":
            if x.dtype not in self.x_dtypes or x.dtype not in _CODES:
                return None
            x_type = _CODES[x.dtype]
        else:
            if x.dtype != _F32:
                return None
            x_type = _FLOAT_OUT
            if self.head == "add":
                residual = inputs[1]
                if type(residual) is not np.ndarray or residual.dtype != _F32 or residual.shape != x.shape:
                    return None
                if not residual.flags.c_contiguous:
                    return None
        y = _core.layer_norm_staged(x, residual, x_type, *self.x_parameters, scale, bias, epsilon, *self.out)
        return y if self.tail == "dynamic" else (y,)

    def _run(self, *inputs):
        values = dict(self.constants)
        values.update(zip(self.reads, inputs))
        for node, names, outputs in self.entries:
            values.update(zip(outputs, self.call(node, [values[name] if name else None for name in names])))
        return tuple(values[name] for name in self.outputs)


def layer_norm_groups(entries: list, constants: dict, graph_outputs: set, call, classes: dict) -> list:
    """entries (the plan's, as onnx/_pairs.py's matmul_adds takes them) with each bound LayerNormalization and
    the nodes around it that fit (the module's docstring) as one NormGroup entry where the LayerNormalization
    was. classes: the session's node classes by name ("LayerNormalization", "DequantizeLinear",
    "QuantizeLinear", "DynamicQuantizeLinear")."""
    readers, producers = plan_links(entries)
    placed, used = {}, set()
    for i, (node, inputs, outputs, _, _) in enumerate(entries):
        if not isinstance(node, classes["LayerNormalization"]) or node._rows is None or i in used:
            continue
        if any(outputs[1:]) or not outputs or not inputs:  # (Mean and InvStdDev wanted: the node alone)
            continue
        (y,) = outputs[:1]
        head, k = None, producers.get(inputs[0])
        if k is not None and k not in used and readers[inputs[0]] == {i} and inputs[0] not in graph_outputs:
            before = entries[k][0]
            dequantize = getattr(before, "_dequantize", None)
            if _plain_add(before, entries[k]) and not set(entries[k][1]) & set(constants):  # (a residual, not a bias)
                head = "add"
            elif isinstance(before, classes["DequantizeLinear"]) and dequantize is not None:
                head = "dequantize" if set(dequantize.per_tensor[2]) & set(_CODES) else None
        tail, j = None, None
        after = sorted(readers.get(y, ()))
        if y not in graph_outputs and len(after) == 1 and after[0] not in used:
            last = entries[after[0]][0]
            quantize = getattr(last, "_quantize", None)
            if isinstance(last, classes["QuantizeLinear"]) and quantize and quantize.per_tensor[2] in _CODES:
                tail, j = "quantize", after[0]
        if tail is None:
            j = next((r for r in after if isinstance(entries[r][0], classes["DynamicQuantizeLinear"])), None)
            tail = None if j is None or j in used or entries[j][1][:1] != (y,) else "dynamic"
        if head is None and tail is None:
            continue
        chosen = [c for c in (k if head else None, i, j if tail else None) if c is not None]
        group = [(entries[c][0], entries[c][1], entries[c][2]) for c in chosen]
        reads = entries[k][1] if head else inputs[:1]
        kept = {name: constants[name] for _, names, _ in group for name in names if name in constants}
        if tail == "quantize":
            produced = entries[j][2]
        elif tail == "dynamic":
            produced = (y, *entries[j][2])
        else:
            produced = (y,)
        fused = NormGroup(node, head, tail, group, tuple(reads), tuple(produced), kept, call)
        placed[i] = (fused, tuple(reads), tuple(produced), False, tuple(reads))
        used.update(chosen)
    return replaced(entries, placed, used)


def _plain_add(node, entry) -> bool:
    """Whether the node is onnx.reference's Add of two given values (no attributes: opset 7 on)."""
    onnx_node = node.onnx_node
    return (
        isinstance(node, OpRun)
        and onnx_node.op_type == "Add"
        and (onnx_node.domain or "") in ("", "ai.onnx")
        and not onnx_node.attribute
        and len(entry[1]) == 2
        and all(entry[1])
        and not entry[3]
    )
