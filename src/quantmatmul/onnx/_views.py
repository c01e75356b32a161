"""onnx/_views.py: the session's chains of view nodes (Reshape with a fixed shape, Transpose: an attention's split and merged heads) as one entry, each node's numpy view in turn.

A transformer block splits its query, key and value into heads (Reshape -> Transpose) and merges the
context back (Transpose -> Reshape): four pairs a layer whose work is a numpy view or copy each, and
whose cost is the run loop's and the node's Python. Where a Reshape (bound: its shape an initializer)
or a Transpose reads the node before it alone, the chain runs as one entry calling each node's own
numpy operation in turn (the bound Reshape's ``reshape``, onnx.reference's ``np.transpose``), so the
values, views and copies are the nodes'. An input the chain does not take runs the nodes.
"""

from __future__ import annotations

import numpy as np

from ._common import linear_chains, replaced


class ViewChain:
    """Reshape and Transpose nodes, each reading the one before it, as one entry of the session's plan:
    ``_bound_call(inputs)`` applies each node's view in turn; ``_run(*inputs)`` runs the nodes. The inputs
    are the first node's data, then each Reshape's shape."""

    def __init__(self, entries: list, call):
        self.entries = entries  # (node, input names, output names), in order
        self.call = call
        self.steps = [_step(node) for node, _, _ in entries]
        self.op_type = "+".join(node.op_type for node, _, _ in entries)
        self.onnx_node = entries[0][0].onnx_node  # (error messages name the first node)
        self._qmm_attributes = {}  # (the session's _call: no attributes)

    def _bound_call(self, inputs):
        x = inputs[0]
        for step in self.steps:
            x = step(x)
            if x is None:
                return None
        return (x,)

    def _run(self, x, *shapes):
        shapes = iter(shapes)
        for node, names, _ in self.entries:
            (x,) = self.call(node, [x, *(next(shapes) for _ in names[1:])])[:1]
        return (x,)


def _step(node):
    """The node's view as a function of its data (None for data it does not take: the nodes run then)."""
    if node.onnx_node.op_type == "Transpose":
        perm = getattr(node, "perm", None)
        perm = None if perm is None or len(perm) == 0 else tuple(int(p) for p in perm)

        def transpose(x):
            if type(x) is not np.ndarray or (perm is not None and len(perm) != x.ndim):
                return None
            return np.transpose(x) if perm is None else np.transpose(x, axes=perm)

        return transpose
    bound = node._bound_call  # (a bound Reshape: its shape fixed)

    def reshape(x):
        outputs = bound((x,))
        return None if outputs is None else outputs[0]

    return reshape


def _link(node, context, reshape_class) -> bool:
    """Whether the node may be a link: a bound Reshape, or onnx.reference's Transpose (no linked attribute)."""
    if context or (node.onnx_node.domain or "") not in ("", "ai.onnx") or len(node.onnx_node.output) != 1:
        return False
    if isinstance(node, reshape_class):
        return callable(getattr(node, "_bound_call", None)) and len(node.onnx_node.input) == 2
    return (
        node.onnx_node.op_type == "Transpose"
        and type(node).__module__.startswith("onnx.reference")
        and not node.has_linked_attribute
        and len(node.onnx_node.input) == 1
    )


def view_chains(entries: list, graph_outputs: set, call, reshape_class) -> list:
    """entries (the plan's, as onnx/_pairs.py's matmul_adds takes them) with each chain of two or more view
    nodes (_link), each after the first reading the one before it, whose values are read by the next node
    alone and are no graph output, as one ViewChain entry where its last node was."""
    placed, used = {}, set()

    def link(entry):
        return _link(entry[0], entry[3], reshape_class)

    for chain in linear_chains(entries, graph_outputs, link, data_first=True):
        i = chain[0]
        group = [(entries[k][0], entries[k][1], entries[k][2]) for k in chain]
        reads = (entries[i][1][0], *(name for _, names, _ in group for name in names[1:]))
        placed[chain[-1]] = (ViewChain(group, call), reads, entries[chain[-1]][2], False, reads)
        used.update(chain)
    return replaced(entries, placed, used)
