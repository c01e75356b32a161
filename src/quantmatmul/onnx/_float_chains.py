"""onnx/_float_chains.py: the session's chains of float element-wise nodes (an erf-GELU's Div -> Erf -> Add -> Mul -> Mul, an attention's scaling and mask Div -> Add) as one call with the bits of onnx.reference's numpy operations.

onnx.reference runs each Add, Sub, Mul, Div, Erf, Sqrt and Neg node as one numpy operation on whole
arrays: a few microseconds of Python a node, and a pass over memory each. Where each node of a chain
reads the value the node before it made (that value read by it alone, and by no graph output), the
session runs the chain as one call (csrc/float_ops.cpp: float_chain) over blocks of 256 elements,
broadcasting its other operands as numpy does. Each operation rounds to float32 on its own (numpy's
float32 add, subtract, multiply, divide and sqrt are IEEE operations; Erf is the session's, which gives
onnx.reference's bits), so the values are the nodes' (a NaN's sign aside where two NaNs of different
signs meet in one addition or product: x86 returns one operand's, and which one the compiled loop's
operand order decides, numpy's as ours). A call with an operand that is not a float32 array runs the
nodes, which raise what they would.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun

from .. import _core
from ._common import linear_chains, replaced

_F32 = np.dtype(np.float32)
# the operators and their codes in csrc (qmm::ChainOp)
_BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3}
_UNARY = {"Erf": 4, "Sqrt": 5, "Neg": 6}
_VALUE = -1  # a step's source: the chain's value (qmm::kChainValue)


class FloatChain:
    """Float element-wise nodes, each reading the one before it, as one entry of the session's plan:
    ``_run(*operands)`` returns the last node's output computed node by node; ``_bound_call`` (the run
    loop tries it first) in one C++ call. ``reads`` are the values the chain reads from outside it."""

    def __init__(self, nodes: list, slots: list, reads: tuple, call):
        self.nodes = nodes  # onnx.reference's nodes, in order
        self.slots = slots  # per node, per input: the index of the operand in reads, or None (the value before)
        self.reads, self.call = reads, call
        steps = []
        for node, slot in zip(nodes, slots):
            a, b = (_VALUE if k is None else k for k in (slot[0], slot[-1]))  # (a unary node: b unused)
            steps.append((_code(node), a, b))
        self.steps = np.array(steps, np.int32)
        self.op_type = "+".join(node.op_type for node in nodes)
        self.onnx_node = nodes[0].onnx_node  # (error messages name the chain's first node)
        self._qmm_attributes = {}  # (the session's _call: no attributes)

    def _bound_call(self, operands):
        for x in operands:
            if type(x) is not np.ndarray or x.dtype != _F32:
                return None
        return (_core.float_chain(operands, self.steps),)

    def _run(self, *operands):
        value = None
        for node, slot in zip(self.nodes, self.slots):
            (value,) = self.call(node, [value if k is None else operands[k] for k in slot])
        return (value,)


def _code(node) -> int:
    op_type = node.onnx_node.op_type
    return _BINARY[op_type] if op_type in _BINARY else _UNARY[op_type]


def _link(node, context) -> bool:
    """Whether the node may be a link of a chain: one of the operators above, of the ONNX domain, with no
    attributes (before opset 7 Add and the others had broadcast ones), its inputs all given."""
    onnx_node = node.onnx_node
    arity = 2 if onnx_node.op_type in _BINARY else 1 if onnx_node.op_type in _UNARY else 0
    return (
        isinstance(node, OpRun)
        and arity > 0
        and not context
        and (onnx_node.domain or "") in ("", "ai.onnx")
        and not onnx_node.attribute
        and len(onnx_node.input) == arity
        and all(onnx_node.input)
        and len(onnx_node.output) == 1
    )


def float_chains(entries: list, graph_outputs: set, call) -> list:
    """entries (the plan's, as onnx/_pairs.py's matmul_adds takes them) with each chain of two or more float
    element-wise nodes (_link), each after the first reading the one before it, whose values are read by the
    next node alone and are no graph output, as one FloatChain entry where its last node was."""
    placed, used = {}, set()
    for chain in linear_chains(entries, graph_outputs, lambda entry: _link(entry[0], entry[3])):
        reads, slots, previous = [], [], None
        for k in chain:
            slot = []
            for name in entries[k][1]:
                if name == previous:
                    slot.append(None)
                else:
                    if name not in reads:
                        reads.append(name)
                    slot.append(reads.index(name))
            slots.append(slot)
            (previous,) = entries[k][2]
        fused = FloatChain([entries[k][0] for k in chain], slots, tuple(reads), call)
        placed[chain[-1]] = (fused, tuple(reads), entries[chain[-1]][2], False, tuple(reads))
        used.update(chain)
    return replaced(entries, placed, used)
