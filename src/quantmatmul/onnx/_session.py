"""onnx/_session.py: InferenceSession: onnx.reference.ReferenceEvaluator with quantmatmul's QLinearMatMul, QGemm and QLinearConv (QDQ MatMul / Gemm / Conv groups fused into them), QLinearAdd / Mul / Softmax, MatMulNBits, QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger, Erf and LayerNormalization."""

from __future__ import annotations

import os
from math import prod
from operator import itemgetter

import ml_dtypes
import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpFunction, OpRun
from onnx.reference.ops._op import OpRunBinaryNumpy
from onnx.reference.ops.op_matmul import MatMul as _ReferenceMatMul
from onnx.reference.ops.op_matmul import numpy_matmul

from .. import _core
from ..matmul_nbits import MatMulNBits, matmul_nbits
from ..qlinear import NUMERICS, QLinearMatMul, _bind_batched, qlinear_matmul
from ..quantize_linear import _QUANT_TYPES as DEQUANTIZE_TYPES
from ..quantize_linear import _bind_dequantize, _bind_quantize, dequantize_linear, quantize_linear
from ._common import (
    AVERAGE_POOL_ATTRIBUTES,
    CONV_ATTRIBUTES,
    MAX_POOL_ATTRIBUTES,
    MS_DOMAIN,
    NodeArg,
    attributes,
    check_feed,
    feed_spec,
    load_model,
    node_arg,
    np_dtype,
    to_array,
    without_leading_ones,
)
from ._dynamic import ScaledMatMulInteger, SiblingProducts, scaled_matmuls, sibling_products
from ._float_chains import FloatChain, float_chains
from ._fuse import fuse_qdq as _fuse_qdq
from ._fuse import subgraph_reads
from ._integer import _integer_operand, _matmul_integer, dynamic_quantize_linear, matmul_integer
from ._layer_norms import NormGroup, layer_norm_groups
from ._pairs import ConvAdd, MatMulAdd, matmul_adds
from ._pool import max_pool
from ._qconv import QLinearConvCall, conv_integer, conv_weight, qlinear_conv
from ._qgemm import QGemmCall, qgemm, qgemm_weight
from ._qlinear_ops import BinaryScalars, bind_binary, bind_softmax, qlinear_add, qlinear_mul, qlinear_softmax
from ._qlinear_pool import bind_global_average_pool, qlinear_average_pool, qlinear_global_average_pool
from ._qlinear_unary import qlinear_concat, qlinear_leaky_relu, qlinear_sigmoid
from ._tables import CodeTable, code_tables
from ._views import ViewChain, view_chains

__all__ = ["InferenceSession", "NodeArg", "OPS", "dynamic_quantize_linear", "matmul_integer"]

# (domain, op_type) of every node run by quantmatmul rather than by onnx.reference
OPS = (
    ("", "QLinearMatMul"),
    (MS_DOMAIN, "MatMulNBits"),
    ("", "QuantizeLinear"),
    ("", "DequantizeLinear"),
    ("", "DynamicQuantizeLinear"),
    ("", "MatMulInteger"),
    ("", "Erf"),
    ("", "LayerNormalization"),
    (MS_DOMAIN, "QGemm"),
    (MS_DOMAIN, "QLinearAdd"),
    (MS_DOMAIN, "QLinearMul"),
    (MS_DOMAIN, "QLinearSoftmax"),
    ("", "QLinearConv"),
    ("", "ConvInteger"),
    (MS_DOMAIN, "QLinearGlobalAveragePool"),
    (MS_DOMAIN, "QLinearAveragePool"),
    (MS_DOMAIN, "QLinearSigmoid"),
    (MS_DOMAIN, "QLinearLeakyRelu"),
    (MS_DOMAIN, "QLinearConcat"),
)


class InferenceSession:
    """Runs an ONNX model the way ``onnxruntime.InferenceSession`` does, on quantmatmul's kernels.

    ``InferenceSession(model, *, numerics="onnxruntime", fuse_qdq=True, tabulate=True)``: model is an ``onnx.ModelProto``
    or a path.
    Every node runs in ``onnx.reference.ReferenceEvaluator``, except QLinearMatMul, com.microsoft
    MatMulNBits, QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearConv and
    ConvInteger, which run in quantmatmul (what ONNX Runtime's quantizers emit: ``quantize_static`` in
    QOperator and QDQ formats, ``quantize_dynamic``, ``MatMulNBitsQuantizer`` and
    :func:`quantmatmul.onnx.quantize`), and Erf and LayerNormalization (onnx.reference's bits, in C++:
    a BERT-style model's Erf nodes were most of its time). A constant
    weight (B and its parameters initializers) is held as a :class:`quantmatmul.QLinearMatMul` /
    :class:`quantmatmul.MatMulNBits`, packed once. ``numerics`` ("onnxruntime", "onnx-reference" or
    "exact") is passed to every QLinearMatMul; MatMulNBits runs at its node's ``accuracy_level``;
    MatMulInteger and ConvInteger compute the spec's int32 sums; QLinearConv runs in ``numerics`` too (a
    constant weight laid out and packed once); DynamicQuantizeLinear computes scale and zero point as
    ONNX Runtime does (docs/onnx.md).

    com.microsoft QGemm, QLinearAdd, QLinearMul, QLinearSoftmax, QLinearGlobalAveragePool,
    QLinearAveragePool, QLinearSigmoid, QLinearLeakyRelu and QLinearConcat (``quantize_static``'s
    QOperator operators) compute ONNX Runtime's bits; MaxPool runs in numpy (onnx.reference loops in
    Python), Reshape without onnx.reference's per-call copies. With ``fuse_qdq`` (the default), a QDQ
    model's ``DequantizeLinear -> MatMul / Gemm / Conv -> QuantizeLinear`` groups run as one
    QLinearMatMul / QGemm / QLinearConv, its uint8 element-wise, pooling and Concat groups as ORT's
    QLinear* operators, its weight-only 4- / 8-bit groups as MatMulNBits at accuracy level 4, and
    Reshape / Transpose / MaxPool / ... between equal
    quantizations on the codes, as ONNX Runtime's graph optimizer runs them (the rules: docs/onnx.md,
    "QDQ fusion"; ``fused``: the rewritten nodes' names);
    ``fuse_qdq=False`` runs the graph as written. With ``tabulate`` (the default), a group of element-wise
    nodes on one int8 / uint8 tensor (an erf-GELU on quantized codes: DequantizeLinear, Div, Erf,
    QuantizeLinear, QLinearAdd, QLinearMul) runs once on the type's 256 codes and then as a table lookup
    per element, the same bits (onnx/_tables.py; ``tabulated``: the groups' node names). In numerics
    "onnxruntime" a QLinearMatMul with a constant b whose output only a QLinearAdd of a constant row of
    codes reads (a MatMul's bias) runs with the add applied to its output blocks as they are written
    (and a residual QLinearAdd after it as a second stage), and a QLinearConv whose output only a
    QLinearAdd of another value reads (a residual) likewise, the
    two nodes' bits (onnx/_pairs.py). The caller's model is never modified.

    ``run(output_names, input_feed)`` returns a list of numpy arrays (``output_names`` None: every
    output); ``get_inputs()`` / ``get_outputs()`` return :class:`NodeArg` (name, shape, type) as
    onnxruntime does. The input feed is checked against the model's input types and fixed dimensions.
    The first session of a process asks glibc to keep up to 256 MiB of freed heap for reuse
    (M_TOP_PAD, M_MMAP_THRESHOLD; not where the environment tunes glibc's malloc): onnx.reference's
    per-node arrays otherwise fault their pages in anew (docs/onnx.md).
    """

    _FN = "InferenceSession"

    def __init__(self, model, *, numerics: str = "onnxruntime", fuse_qdq: bool = True, tabulate: bool = True):
        if numerics not in NUMERICS:
            raise ValueError(f"{self._FN}: numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")
        for name, flag in (("fuse_qdq", fuse_qdq), ("tabulate", tabulate)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{self._FN}: {name} must be True or False, got {type(flag).__name__}")
        self.numerics = numerics
        owned = not isinstance(model, onnx.ModelProto)  # read from a file: the session's own to rewrite
        self._model = load_model(self._FN, model, copy=False)
        runs, self.fused = self._model, []
        if fuse_qdq:
            runs, self.fused = _fuse_qdq(self._model, in_place=owned)
        constants = {t.name: t for t in runs.graph.initializer}
        self._folded = {}  # values computed once from initializers alone (_run_plan)
        try:
            self._evaluator = ReferenceEvaluator(runs, new_ops=_op_classes(constants, numerics, self._folded))
        except _NodeError as error:
            raise error.public(self._FN) from None
        except Exception as error:  # onnx.reference refuses an operator or an attribute
            raise ValueError(f"{self._FN}: onnx.reference cannot run this model: {_first_line(error)}") from None
        self._plan, self.tabulated = _run_plan(self._evaluator, numerics, tabulate, self._folded)
        # graph outputs of a node that reads a folded value: copied for the caller (a Reshape's view of a
        # folded array must not let the caller write into what the next runs read)
        outputs = set(self._evaluator.output_names)
        self._copied = {
            name for entry in self._plan for name in entry[2] if name in outputs and self._folded.keys() & set(entry[1])
        }
        self._lean = None  # (the plan, its entries as the run loop reads them and the first values: run)
        self._feed_spec = feed_spec(self._model)  # (the initializers' names read once, not per run)
        self._inputs = [arg for arg, _ in self._feed_spec.values()]
        self._outputs = [node_arg(v) for v in self._model.graph.output]
        _keep_heap()

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def run(self, output_names, input_feed, run_options=None) -> list[np.ndarray]:
        fn = "InferenceSession.run"
        names = [o.name for o in self._outputs]
        if not output_names:
            output_names = names
        elif isinstance(output_names, str):
            raise TypeError(f"{fn}: output_names must be a list of names or None, got a string")
        else:
            output_names = list(output_names)
            unknown = [n for n in output_names if n not in names]
            if unknown:
                raise ValueError(
                    f"{fn}: the model has no output named {unknown[0]!r} (its outputs: {', '.join(names)})"
                )
        feed = check_feed(fn, self._model, input_feed, spec=self._feed_spec)
        if self._lean is None or self._lean[0] is not self._plan:  # (made again where the plan was replaced)
            self._lean = (self._plan, (_lean_plan(self._plan), _first_values(self._evaluator, self._folded)))
        try:
            with np.errstate(all="ignore"), _core.ParallelRegion():
                return _run_nodes(*self._lean[1], output_names, feed, self._copied)
        except _NodeError as error:
            raise error.public(fn) from None

    def __repr__(self) -> str:
        ins = ", ".join(i.name for i in self._inputs)
        outs = ", ".join(o.name for o in self._outputs)
        return f"InferenceSession(({ins}) -> ({outs}), numerics={self.numerics!r})"


# ---------------------------------------------------------------------------------------------------
# The run loop: onnx.reference's (ReferenceEvaluator.run: each node's run on the values of its
# inputs, in order), except that each intermediate value is let go after the last node that reads it,
# where the evaluator keeps every one until the run ends: a batch holds its live values only, and the
# heap reuses their memory for the next nodes'. all-MiniLM-L6-v2 on Zen 4, 2 threads, in one process
# with ORT interleaved: the 4-bit model 1.10-1.11x, ORT's QDQ MatMul model 1.13-1.19x, the models with
# every default op type 0.97-1.08x (8 x 16 and 36 x 19 tokens).


def _run_plan(evaluator, numerics: str, tabulate: bool, folded: dict) -> tuple[list[tuple], list]:
    """(for each node: (the node, its input names, its output names, whether it runs a subgraph that reads
    the outer values, and the values no later node reads: graph outputs, initializers and feeds are kept);
    with tabulate, element-wise groups on one 8-bit tensor as one lookup-table node each (onnx/_tables.py),
    and their nodes' names); in numerics "onnxruntime", QLinearMatMul -> QLinearAdd(bias) pairs as one
    call (onnx/_pairs.py); quantize_dynamic's MatMulInteger -> Cast -> Mul (-> Add) as one call
    (onnx/_dynamic.py). A node that runs a subgraph (If, Loop, Scan) reads outer values inside it:
    they count as its inputs. Nodes that read initializers alone are run here, once (_fold: their outputs
    go to folded), and the others bind to what they read that is fixed (_Op._bind)."""
    entries = [
        (
            node,
            tuple(node.input),
            tuple(node.output),
            bool(node.need_context()),
            (*node.input, *subgraph_reads(node.onnx_node)),
        )
        for node in evaluator.rt_nodes_
    ]
    overridden = set(evaluator.input_names)
    constants = {name: value for name, value in evaluator.rt_inits_.items() if name not in overridden}
    entries = _fold(entries, constants, set(evaluator.output_names), folded)
    constants.update(folded)
    for entry in entries:
        if isinstance(entry[0], _Op):
            entry[0]._bind()
    entries = scaled_matmuls(entries, constants, set(evaluator.output_names), _call)
    entries = sibling_products(entries, _node_call)
    entries = matmul_adds(entries, constants, set(evaluator.output_names), numerics, _call)
    entries = layer_norm_groups(entries, constants, set(evaluator.output_names), _node_call, _NORM_NEIGHBOURS)
    tabulated = []
    if tabulate:
        entries, tabulated = code_tables(entries, constants, set(evaluator.output_names), _call)
    entries = float_chains(entries, set(evaluator.output_names), _node_call)
    entries = view_chains(entries, set(evaluator.output_names), _node_call, _Reshape)
    last = {}
    for i, entry in enumerate(entries):
        for name in entry[4]:
            last[name] = i
    kept = set(evaluator.output_names) | set(evaluator.rt_inits_) | set(evaluator.input_names)
    done = [[] for _ in entries]
    for name, i in last.items():
        if name and name not in kept:
            done[i].append(name)
    plan = [
        (node, inputs, outputs, context, tuple(gone), _bound_call(node))
        for (node, inputs, outputs, context, _), gone in zip(entries, done)
    ]
    return plan, tabulated


def _bound_call(node):
    """The node's bound call (_Op._bound_call, and the pairs' and tables'; onnx.reference's float Add, Sub,
    Mul, Div, Max, Min and MatMul as the numpy function they call), or None."""
    fused = (_Op, MatMulAdd, ConvAdd, CodeTable, ScaledMatMulInteger, SiblingProducts, FloatChain, NormGroup, ViewChain)
    if isinstance(node, fused):
        call = getattr(node, "_bound_call", None)
        return call if callable(call) else None
    if isinstance(node, _ReferenceMatMul) and node.onnx_node.domain in ("", "ai.onnx"):
        return _float_matmul
    ufunc = _NUMPY_BINARY.get(node.onnx_node.op_type)
    if ufunc is None or not isinstance(node, OpRunBinaryNumpy) or node.onnx_node.domain not in ("", "ai.onnx"):
        return None
    if node.onnx_node.attribute or len(node.onnx_node.input) != 2:  # (before opset 7: broadcast and axis)
        return None
    return lambda inputs: _float_binary(ufunc, inputs)


def _node_call(node, inputs) -> tuple:
    """The node's outputs as the run loop computes them: its bound call where it takes the inputs, else
    _call (a fused entry's nodes when its own call does not take them)."""
    bound = _bound_call(node)
    if bound is not None:
        try:
            outputs = bound(inputs)
        except (TypeError, ValueError):  # the general call raises it, naming the node
            outputs = None
        if outputs is not None:
            return outputs
    return _call(node, inputs)


# onnx.reference's Add, Sub, Mul, Div and (two inputs) Max and Min: OpRunBinaryNumpy._run's numpy function, for
# floats.
_NUMPY_BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Max": np.maximum,
    "Min": np.minimum,
}


def _float_binary(ufunc, inputs):
    """(ufunc(a, b),) for two float arrays of one dtype, as onnx.reference's node computes it (a numpy scalar
    wrapped into a 0-d array, as its output check does); None for anything else (the node's own run)."""
    a, b = inputs
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != b.dtype or a.dtype.kind != "f":
        return None
    return (np.asarray(ufunc(a, b)),)


def _float_matmul(inputs):
    """(numpy_matmul(a, b),) for two float arrays of one dtype: onnx.reference's MatMul node's own function (its
    np.dot or np.matmul, so its bits), without the node's per-call layers (2-3 us of a 5-10 us attention
    product); a 0-d result as a 0-d array. None for anything else (the node's own run)."""
    a, b = inputs
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != b.dtype or a.dtype.kind != "f":
        return None
    return (np.asarray(numpy_matmul(a, b)),)


def _fold(entries: list, constants: dict, graph_outputs: set, folded: dict) -> list:
    """entries without the nodes that read initializers (constants) alone, run once here in order, their
    outputs put in folded (a QDQ model's DequantizeLinear of a LayerNormalization's weights, a Constant
    node), whose values are the same on every run. A node that runs a subgraph or draws random
    numbers, one that writes a graph output, and one that fails (its run raises then) stay in the plan."""
    kept = []
    for entry in entries:
        node, inputs, outputs, context, reads = entry
        fixed = all(not name or name in constants or name in folded for name in reads)
        if not fixed or context or node.onnx_node.op_type in _UNFOLDED or any(o in graph_outputs for o in outputs):
            kept.append(entry)
            continue
        try:
            with np.errstate(all="ignore"):
                values = _call(node, [None if not name else folded.get(name, constants.get(name)) for name in inputs])
        except Exception:  # noqa: BLE001 (the node raises it at the run, as it would have)
            kept.append(entry)
            continue
        folded.update((name, value) for name, value in zip(outputs, values) if name)
    return kept


# Operators whose outputs are not a function of their inputs (random draws; Dropout in training mode).
_UNFOLDED = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


def _run_nodes(entries, first, output_names, feed, copied) -> list[np.ndarray]:
    """The plan's entries (_lean_plan) in order on the first values (_first_values) and the feed."""
    results = dict(first)
    results.update(feed)
    for node, get_inputs, outputs_named, single, context, done, bound_call in entries:
        try:
            inputs = get_inputs(results)
        except KeyError as error:  # a graph out of topological order, or an input never produced
            raise ValueError(
                f"InferenceSession.run: node {node.onnx_node.name!r} ({node.op_type}) reads {error}, which no "
                "node before it writes"
            ) from None
        outputs = None
        if bound_call is not None:
            try:
                outputs = bound_call(inputs)
            except (TypeError, ValueError):  # the general call raises it, naming the node
                outputs = None
        if outputs is None:
            if context:  # If / Loop / Scan: the subgraph reads the outer values
                outputs = node.run(*inputs, context=results, bindings=None)
            else:
                outputs = _call(node, inputs)
        if single is not None:
            results[single] = outputs[0]
        else:
            for name, value in zip(outputs_named, outputs):
                if name:  # (an omitted optional output is not stored: "" stays the absent input)
                    results[name] = value
        if done:
            for name in done:
                results.pop(name, None)
    # in C order, as ONNX Runtime returns them (the convolutions and pools pass channels-last views on)
    outputs = [results[name] for name in output_names]
    return [
        v.copy() if isinstance(v, np.ndarray) and (not v.flags.c_contiguous or name in copied) else v
        for name, v in zip(output_names, outputs)
    ]


def _first_values(evaluator, folded) -> dict:
    """The values every run starts from: "" (an absent optional input) None, the initializers, the folded
    values (the feed goes on top)."""
    results = {"": None}
    results.update(evaluator.rt_inits_)
    results.update(folded)
    return results


def _lean_plan(plan) -> list:
    """The plan's entries as the run loop reads them: (node, a function of the values giving its inputs as a
    tuple, its output names, the one output's name (None where it has several or none), whether it runs a
    subgraph, the names let go after it (None for none), its bound call). About 0.35 us a node less than
    reading the plan's names on every run (0.89 -> 0.55 us a node of loop and a trivial bound call, Zen 4)."""
    entries = []
    for node, inputs_named, outputs_named, context, done, bound_call in plan:
        single = outputs_named[0] if len(outputs_named) == 1 and outputs_named[0] else None
        entries.append((node, _getter(inputs_named), outputs_named, single, context, tuple(done) or None, bound_call))
    return entries


def _getter(names):
    """A function of the values giving those named as a tuple (KeyError for one that is not there)."""
    if not names:
        return lambda values: ()
    if len(names) == 1:
        (name,) = names
        return lambda values: (values[name],)
    return itemgetter(*names)


def _call(node, inputs) -> tuple:
    """node.run(*inputs) without OpRun.run's per-call checks, logging and keyword building (about 8 us a
    node: a fifth of a small transformer's time here): a node with no linked attributes, subgraph or
    function body gets its attributes read once and passed to _run; numpy scalars come back as 0-d arrays,
    as OpRun.run returns them."""
    attributes = node.__dict__.get("_qmm_attributes")
    if attributes is None:
        plain = not (node.has_linked_attribute or node.has_subgraph or isinstance(node, OpFunction))
        attributes = {name: getattr(node, name) for name in node.attributes_names_} if plain else False
        node._qmm_attributes = attributes
    if attributes is False:
        return node.run(*inputs)
    outputs = node._run(*inputs, **attributes)
    for x in outputs:
        if type(x) is not np.ndarray:  # a numpy scalar to wrap (the usual case has none)
            return tuple(np.array(x) if np.isscalar(x) else x for x in outputs)
    return outputs


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


class _NodeError(RuntimeError):
    """An error inside one of our operators, carried through onnx.reference (which rewraps TypeErrors)."""

    def __init__(self, node, error):
        super().__init__(str(error))
        self.node, self.error = node, error

    def public(self, fn):
        label = f"node {self.node.name!r} ({self.node.op_type})" if self.node.name else f"a {self.node.op_type} node"
        cls = TypeError if isinstance(self.error, TypeError) else ValueError
        return cls(f"{fn}: {label}: {self.error}")


# ---------------------------------------------------------------------------------------------------
# The C library's heap. onnx.reference allocates a fresh numpy array for every node's output and frees
# it soon after; glibc hands freed memory at the top of its heap back to the system, so the next
# node's array faults its pages in again: more than half of an all-MiniLM-L6-v2 batch's time in the
# session (Zen 4, 2 threads: 8 x 12 tokens 41.7 ms, 21 ms with the settings below; 36 x 19 tokens
# 251 -> 107 ms; ORT 14 / 75 ms). The first session asks glibc to keep up to 256 MiB of freed memory
# at the top of its heap (M_TOP_PAD) and to serve blocks below 32 MiB from it (M_MMAP_THRESHOLD, the
# most its own adaptive threshold reaches), unless the environment tunes glibc's malloc itself
# (MALLOC_TOP_PAD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES' glibc.malloc:
# e.g. MALLOC_TOP_PAD_=131072, glibc's default, keeps the heap as it was). The process then holds up
# to 256 MiB of memory it freed, for reuse.
HEAP_TOP_PAD = 256 << 20
HEAP_MMAP_THRESHOLD = 32 << 20
_MALLOC_ENVIRONMENT = ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_heap_kept = False


def _keep_heap() -> None:
    global _heap_kept
    tuned = any(name in os.environ for name in _MALLOC_ENVIRONMENT) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )
    if not _heap_kept and not tuned:
        _core.keep_heap(HEAP_TOP_PAD, HEAP_MMAP_THRESHOLD)
    _heap_kept = True


# ---------------------------------------------------------------------------------------------------
# The operators. Each session makes its own classes (the names are the op types, as onnx.reference
# requires), bound to the model's initializers and the session's numerics.


class _Op(OpRun):
    constants: dict = {}  # the model's initializers (TensorProto)
    folded: dict = {}  # values the session computed once from them (_fold; arrays)
    numerics = "onnxruntime"

    # The bound call (_bind): _bound_call(inputs) -> the outputs, or None for inputs it does not take (the
    # node's general call then runs, with its checks and errors). The run loop calls it first, _compute too.
    _bound_call = None

    def _bind(self):
        """Binds the node's call to the inputs it reads on every run (initializers, values the session folded),
        checking them once, and sets _bound_call: the operators with such a call override it. The session's plan
        calls it for the nodes of the main graph (_run_plan); a subgraph's nodes run unbound."""

    def _run(self, *inputs, **attributes):
        try:
            return self._compute(*inputs, **attributes)
        except (TypeError, ValueError) as error:
            raise _NodeError(self.onnx_node, error) from error

    def _fixed(self, indices):
        """The inputs at these indices where each is an initializer or absent (None), as arrays: what the node
        reads on every run, for the operators that check them once (bound calls); None otherwise."""
        values = [self._constant(i) for i in indices]
        return None if any(v is False for v in values) else values

    def _fixed_attributes(self):
        """The attributes the session's run passes to _compute (its _call: every one the node has, with the
        schema's defaults), where none is linked (a function's); else None."""
        if self.has_linked_attribute:
            return None
        return {name: getattr(self, name) for name in self.attributes_names_}

    def _constant(self, index):
        """The initializer at input `index`, as an array: None when the input is absent, False when it is not
        an initializer."""
        names = self.onnx_node.input
        if index >= len(names) or not names[index]:
            return None
        tensor = self.constants.get(names[index])
        if tensor is None:
            value = self.folded.get(names[index])
            return False if value is None else value
        return to_array(tensor)


class _QLinearMatMul(_Op):
    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        b = [self._constant(i) for i in (3, 4, 5)]
        self._held = None
        if all(x is not None and x is not False for x in b):
            try:
                self._held = QLinearMatMul(*b)
            except (TypeError, ValueError) as error:
                raise _NodeError(onnx_node, error) from error

    def _bind(self):
        # numerics "onnxruntime" with every parameter fixed: the fast product bound to them (checked once)
        self._bound_call = None
        fixed = [self._constant(i) for i in (1, 2, 4, 5, 6, 7)]
        if self.numerics != "onnxruntime" or not _arrays(fixed):
            return
        a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point = fixed
        if self._held is not None:
            product = self._held._bind(a_scale, a_zero_point, y_scale, y_zero_point)
            if product is not None:
                self._bound_call = lambda inputs: _outputs(product(inputs[0]))
        else:
            batched = _bind_batched(*fixed)
            if batched is not None:
                self._bound_call = lambda inputs: _outputs(batched(inputs[0], inputs[3]))

    def _compute(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, **_):
        if self._bound_call is not None:
            outputs = self._bound_call((a, None, None, b))
            if outputs is not None:
                return outputs
        if self._held is not None:
            return (self._held(a, a_scale, a_zero_point, y_scale, y_zero_point, numerics=self.numerics),)
        return (
            qlinear_matmul(
                a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, numerics=self.numerics
            ),
        )


class _MatMulNBits(_Op):
    op_domain = MS_DOMAIN

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        attrs = attributes(onnx_node)
        self._attrs = {
            "K": attrs.get("K"),
            "N": attrs.get("N"),
            "bits": attrs.get("bits", 4),
            "block_size": attrs.get("block_size"),
        }
        if self._attrs["K"] is None or self._attrs["N"] is None or self._attrs["block_size"] is None:
            raise _NodeError(onnx_node, ValueError("MatMulNBits needs the attributes K, N and block_size"))
        self._level = int(attrs.get("accuracy_level", 0))
        weights = [self._constant(i) for i in range(1, 6)]  # B, scales, zero_points, g_idx, bias
        self._held = None
        if weights[0] is not None and all(w is not False for w in weights):
            try:
                self._held = MatMulNBits(*weights, **self._attrs, accuracy_level=self._level)
            except (TypeError, ValueError) as error:
                raise _NodeError(onnx_node, error) from error

    def _compute(self, A, B=None, scales=None, zero_points=None, g_idx=None, bias=None, **_):
        if self._held is not None:
            return (self._held(A),)
        return (matmul_nbits(A, B, scales, zero_points, g_idx, bias, **self._attrs, accuracy_level=self._level),)


class _QuantizeLinear(_Op):
    _quantize = None

    def _bind(self):
        # fixed scale and zero point: the per-tensor call bound to them once
        fixed, attributes = self._fixed((1, 2)), self._fixed_attributes()
        arguments = None if fixed is None or attributes is None else self._arguments(*fixed, **attributes)
        quantize = None if arguments is None else _bind_quantize(*arguments[0], **arguments[1])
        self._quantize = quantize  # (onnx/_layer_norms.py reads its per-tensor parameters)
        self._bound_call = None if quantize is None else lambda inputs: _quantize_float32(quantize, inputs[0])

    @staticmethod
    def _arguments(y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0, **rest):
        """((y_scale, y_zero_point), quantize_linear's keywords) for the node's inputs and attributes; None for
        the precision attribute (opset 25), which is not supported."""
        if rest.get("precision"):
            return None
        if y_zero_point is None and output_dtype:
            y_zero_point = np.zeros(np.shape(y_scale), np_dtype(output_dtype))
        keywords = {"axis": axis, "block_size": block_size or 0, "saturate": bool(1 if saturate is None else saturate)}
        return (y_scale, y_zero_point), keywords

    def _compute(self, x, *inputs, **attributes):
        if self._bound_call is not None:
            outputs = self._bound_call((x,))
            if outputs is not None:
                return outputs
        arguments = self._arguments(*inputs, **attributes)
        if arguments is None:
            raise ValueError("the precision attribute (opset 25) is not supported")
        return (quantize_linear(x, *arguments[0], **arguments[1]),)


class _DequantizeLinear(_Op):
    _dequantize = None

    def _bind(self):
        fixed, attributes = self._fixed((1, 2)), self._fixed_attributes()
        self._bound_call = None
        if fixed is not None and attributes is not None and not attributes.get("output_dtype"):
            axis, block_size = attributes.get("axis", 1), attributes.get("block_size", 0) or 0
            dequantize = _bind_dequantize(*fixed, axis=axis, block_size=block_size)
            self._dequantize = dequantize  # (onnx/_layer_norms.py reads its per-tensor parameters)
            if dequantize is not None:
                self._bound_call = lambda inputs: _outputs(dequantize(inputs[0]))

    def _compute(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, **rest):
        if self._bound_call is not None:
            outputs = self._bound_call((x,))
            if outputs is not None:
                return outputs
        if np.asarray(x).dtype not in DEQUANTIZE_TYPES or rest.get("output_dtype"):
            # int32 (a quantized bias) and the types quantmatmul lacks: onnx.reference's own kernel
            return _reference_op(self).run(x, x_scale, *([] if x_zero_point is None else [x_zero_point]))
        return (dequantize_linear(x, x_scale, x_zero_point, axis=axis, block_size=block_size or 0),)


def _reference_op(op: OpRun) -> OpRun:
    """onnx.reference's implementation of op's node (for the cases quantmatmul does not implement)."""
    if getattr(op, "_reference", None) is None:
        from onnx.reference.ops import load_op

        domain, op_type = op.onnx_node.domain, op.onnx_node.op_type
        try:
            cls = load_op(domain, op_type, op.run_params["opsets"][domain])
        except RuntimeError:
            # onnx.reference implements DequantizeLinear from opset 19 on only; an opset-10..18 node's
            # int32 input (a QDQ model's quantized bias) means the same in every version: the latest
            cls = load_op(domain, op_type, None)
        op._reference = cls(op.onnx_node, op.run_params)
    return op._reference


class _DynamicQuantizeLinear(_Op):
    def _bind(self):
        self._bound_call = self._arrays

    @staticmethod
    def _arrays(inputs):
        """The function's outputs for a float32 ndarray x (one C++ call where it is C-contiguous); else None."""
        (x,) = inputs
        return dynamic_quantize_linear(x) if type(x) is np.ndarray and x.dtype == np.float32 else None

    def _compute(self, x, **_):
        return dynamic_quantize_linear(x)


class _Erf(_Op):
    """Erf as onnx.reference computes it (math.erf of each element, the double result rounded to
    float32, then to x's dtype), in C++ over the thread pool with the same bits (the C library's erf,
    or on AVX-512 a polynomial that falls back to it near float32 midpoints: docs/onnx.md): numpy's
    element-by-element call was most of a BERT-style model's time (MiniLM's six Erf nodes, 72 %)."""

    _EXACT_IN_FLOAT32 = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))

    def _compute(self, x, **_):
        x = np.asarray(x)
        if x.dtype == np.float64:
            source = np.ascontiguousarray(x)
        elif x.dtype in self._EXACT_IN_FLOAT32:  # exactly float32 values
            source = np.ascontiguousarray(x, dtype=np.float32)
        else:
            return _reference_op(self).run(x)
        y = np.empty(x.shape, np.float32)
        _core.erf(source.reshape(-1), y.reshape(-1))
        return (y.astype(x.dtype, copy=False),)


class _MatMulInteger(_Op):
    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        b, b_zp = self._constant(1), self._constant(3)
        self._held, self._b_zero_points = None, None
        if b is not None and b is not False and b_zp is not False:
            self._held = _integer_operand("b", b, b_zp, "MatMulInteger", pack=True)

    def _bind(self):
        self._bound_call = None if self._held is None else self._rows_product

    def _rows_product(self, inputs):
        A, a_zero_point = inputs[0], inputs[2] if len(inputs) > 2 else None
        operands = self._rows_operands(A, a_zero_point)
        if operands is None:
            return None
        return (_core.matmul_integer(*operands).reshape(A.shape[:-1] + (self._held.x.shape[1],)),)

    def _compute(self, A, B, a_zero_point=None, b_zero_point=None, **_):
        b = self._held if self._held is not None else _integer_operand("b", B, b_zero_point, "MatMulInteger")
        return (_matmul_integer(_integer_operand("a", A, a_zero_point, "MatMulInteger"), b),)

    def _scaled(self, A, a_zero_point, scale, bias):
        """The node's product with a constant b (a matrix) as float32, times scale and plus bias, as
        Cast(to=FLOAT) -> Mul(scale) (-> Add(bias)) give it (onnx/_dynamic.py): scale a float32 array of one
        value or one per column (leading ones aside, no more dimensions than the product), bias float32 [N]
        or None; None for what it does not take (the nodes then run and raise what they would)."""
        if type(scale) is not np.ndarray or scale.dtype != np.float32:
            return None
        operands = self._rows_operands(A, a_zero_point)
        N = self._held.x.shape[1]
        if operands is None or scale.ndim > A.ndim or without_leading_ones(scale.shape) not in ((), (1,), (N,)):
            return None
        y = _core.matmul_integer_scaled(*operands, np.ascontiguousarray(scale).reshape(-1), bias)
        return y.reshape(A.shape[:-1] + (N,))

    _ROW = np.zeros(1, np.int64)  # (the batch index of one product)

    def _rows_operands(self, A, a_zero_point):
        """_core.matmul_integer's arguments for A [..., K] (int8 or uint8, rank >= 2, some rows) with a zero point
        per tensor (None, or one value of A's type) times the held b (a matrix), A's leading dimensions folded
        into its rows: the general call's product without its broadcasting; None for any other call."""
        held = self._held
        if type(A) is not np.ndarray or A.ndim < 2 or held.x.ndim != 2 or held.packed is None:
            return None
        if A.dtype not in _INTEGER_TYPES or A.shape[-1] != held.x.shape[0] or A.size == 0:
            return None
        if a_zero_point is None:
            za = 0
        elif (
            isinstance(a_zero_point, (np.ndarray, np.generic))
            and a_zero_point.dtype == A.dtype
            and a_zero_point.size == 1
        ):
            za = int(a_zero_point.reshape(-1)[0]) if type(a_zero_point) is np.ndarray else int(a_zero_point)
        else:
            return None
        rows = A.size // A.shape[-1]
        if self._b_zero_points is None:  # b's zero point per column, [1, N] int32, once
            self._b_zero_points = np.ascontiguousarray(np.broadcast_to(held.zp, (1, held.x.shape[1])), np.int32)
        a3 = np.ascontiguousarray(A).reshape(1, rows, A.shape[-1])
        b = (held.packed, held.x.dtype == np.int8, self._ROW, self._b_zero_points)
        return (a3, A.dtype == np.int8, self._ROW, np.full((1, rows), za, np.int32), *b)


class _QGemm(_Op):
    """com.microsoft QGemm as ONNX Runtime computes it (onnx/_qgemm.py), whatever the numerics: it is
    ORT's operator, defined by its kernel. A constant B (with its zero point) is transposed and packed once."""

    op_domain = MS_DOMAIN

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        attrs = attributes(onnx_node)
        self._alpha = float(attrs.get("alpha", 1.0))
        self._trans_a, self._trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
        b, b_zp = self._constant(3), self._constant(5)
        self._held = self._call = None
        if b is not None and b is not False and b_zp is not False:
            try:
                self._held = qgemm_weight(b, b_zp, self._trans_b)
                # every input but A an initializer (or absent): its checks and scales once
                rest = [self._constant(i) for i in (1, 2, 4, 6, 7, 8)]
                if all(v is not False for v in rest):
                    a_s, a_zp, b_s, C, y_s, y_zp = rest
                    self._call = QGemmCall(
                        self._held, a_s, a_zp, b_s, C, y_s, y_zp, alpha=self._alpha, trans_a=self._trans_a
                    )
            except (TypeError, ValueError) as error:
                raise _NodeError(onnx_node, error) from error

    def _compute(
        self, A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None, **_
    ):
        if self._call is not None:
            return (self._call(A),)
        return (
            qgemm(
                A,
                a_scale,
                a_zero_point,
                B,
                b_scale,
                b_zero_point,
                C,
                y_scale,
                y_zero_point,
                alpha=self._alpha,
                trans_a=self._trans_a,
                trans_b=self._trans_b,
                weight=self._held,
            ),
        )


class _ConvOp(_Op):
    """QLinearConv and ConvInteger (onnx/_qconv.py): a constant w (with its scale and zero point) laid out
    and packed once."""

    _W, _W_SCALE, _W_ZP = 3, 4, 5  # QLinearConv's input indices (ConvInteger: w 1, zero point 3)

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        self._attrs = attributes(onnx_node, CONV_ATTRIBUTES)
        self._group = int(self._attrs.pop("group", 1))
        w, w_zp = self._constant(self._W), self._constant(self._W_ZP)
        w_scale = self._constant(self._W_SCALE) if self._W_SCALE is not None else None
        self._held = None
        if w is not None and w is not False and w_zp is not False and w_scale is not False:
            try:
                self._held = conv_weight(w, w_scale, w_zp, self._group, self._fn)
            except (TypeError, ValueError) as error:
                raise _NodeError(onnx_node, error) from error


class _QLinearConv(_ConvOp):
    _fn = "qlinear_conv"

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        # Every parameter but x an initializer (as quantizers write them): checked and formed once (the
        # multiplier, the requantization's arrays), and each x shape's geometry once, not per run.
        self._call = None
        params = [self._constant(i) for i in (1, 2, 6, 7, 8)]
        if self._held is not None and all(p is not False for p in params) and all(p is not None for p in params[:4]):
            attrs = self._attrs
            geometry = (
                attrs.get("auto_pad", "NOTSET"),
                *(attrs.get(k) for k in ("dilations", "kernel_shape", "pads", "strides")),
            )
            try:
                self._call = QLinearConvCall(self._held, *params[:4], params[4], geometry, self.numerics)
            except (TypeError, ValueError) as error:
                raise _NodeError(onnx_node, error) from error

    def _bind(self):
        conv = None if self._call is None else self._call.bound()
        self._bound_call = None if conv is None else lambda inputs: _outputs(conv(inputs[0]))

    def _compute(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, **_):
        if self._call is not None:
            return (self._call(x, "channels_last"),)
        return (
            qlinear_conv(
                x,
                x_scale,
                x_zero_point,
                w,
                w_scale,
                w_zero_point,
                y_scale,
                y_zero_point,
                B,
                group=self._group,
                numerics=self.numerics,
                weight=self._held,
                memory_format="channels_last",
                **self._attrs,
            ),
        )


class _ConvInteger(_ConvOp):
    _fn = "conv_integer"
    _W, _W_SCALE, _W_ZP = 1, None, 3

    def _compute(self, x, w, x_zero_point=None, w_zero_point=None, **_):
        sums = conv_integer(
            x,
            w,
            x_zero_point,
            w_zero_point,
            group=self._group,
            weight=self._held,
            memory_format="channels_last",
            **self._attrs,
        )
        return (sums,)


class _QLinearBinary(_Op):
    """com.microsoft QLinearAdd / QLinearMul as ONNX Runtime computes them (onnx/_qlinear_ops.py): scales and
    zero points that are all initializers (or absent) are checked once per type of A and B (BinaryScalars)."""

    op_domain = MS_DOMAIN
    _fn, _function = "", None

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        values = [self._constant(i) for i in (1, 2, 4, 5, 6, 7)]
        self._scalars = None
        if all(v is not False for v in values):
            self._scalars = BinaryScalars(self._fn, *values)

    def _bind(self):
        # fixed scales and zero points (the BinaryScalars above; folded values too): the checks and roles
        # once per shapes
        if self._scalars is None:
            fixed = self._fixed((1, 2, 4, 5, 6, 7))
            self._scalars = None if fixed is None else BinaryScalars(self._fn, *fixed)
        binary = None if self._scalars is None else bind_binary(self._fn, self._scalars)
        self._bound_call = None if binary is None else lambda inputs: _outputs(binary(inputs[0], inputs[3]))

    def _compute(self, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None, **_):
        args = (A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
        if self._bound_call is not None:
            outputs = self._bound_call(args)
            if outputs is not None:
                return outputs
        return (type(self)._function(*args, scalars=self._scalars),)


class _QLinearAdd(_QLinearBinary):
    _fn, _function = "QLinearAdd", qlinear_add


class _QLinearMul(_QLinearBinary):
    _fn, _function = "QLinearMul", qlinear_mul


class _QLinearSoftmax(_Op):
    """com.microsoft QLinearSoftmax as ONNX Runtime computes it (onnx/_qlinear_ops.py); ``opset`` (the
    replaced Softmax's) is required, ``axis`` defaults to -1 as in ORT."""

    op_domain = MS_DOMAIN

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        attrs = attributes(onnx_node)
        if "opset" not in attrs:
            raise _NodeError(onnx_node, ValueError("QLinearSoftmax needs the attribute opset"))
        self._axis, self._opset = attrs.get("axis", -1), attrs["opset"]

    def _bind(self):
        fixed = self._fixed((1, 2, 3, 4))  # fixed scales and zero points: checked once
        softmax = None if fixed is None else bind_softmax(*fixed, axis=self._axis, opset=self._opset)
        self._bound_call = None if softmax is None else lambda inputs: _outputs(softmax(inputs[0]))

    def _compute(self, X, X_scale, x_zero_point, y_scale, y_zero_point, **_):
        if self._bound_call is not None:
            outputs = self._bound_call((X,))
            if outputs is not None:
                return outputs
        return (qlinear_softmax(X, X_scale, x_zero_point, y_scale, y_zero_point, axis=self._axis, opset=self._opset),)


class _MsAttributes(_Op):
    """A com.microsoft operator of ORT's CPU kernels computed by one of quantmatmul's functions, its
    attributes passed as keywords (those ``_KEYWORDS`` names; bytes decoded)."""

    op_domain = MS_DOMAIN
    _KEYWORDS: tuple = ()

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        self._attrs = attributes(onnx_node, self._KEYWORDS)


class _QLinearGlobalAveragePool(_MsAttributes):
    """com.microsoft QLinearGlobalAveragePool as ONNX Runtime computes it (onnx/_qlinear_pool.py)."""

    _KEYWORDS = ("channels_last",)

    def _bind(self):
        fixed = self._fixed((1, 2, 3, 4))  # fixed scales and zero points: checked once
        pool = None if fixed is None else bind_global_average_pool(*fixed, **self._attrs)
        self._bound_call = None if pool is None else lambda inputs: _outputs(pool(inputs[0]))

    def _compute(self, X, x_scale, x_zero_point, y_scale, y_zero_point, **_):
        if self._bound_call is not None:
            outputs = self._bound_call((X,))
            if outputs is not None:
                return outputs
        return (qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, **self._attrs),)


class _QLinearAveragePool(_MsAttributes):
    """com.microsoft QLinearAveragePool as ONNX Runtime computes it (onnx/_qlinear_pool.py)."""

    _KEYWORDS = (*AVERAGE_POOL_ATTRIBUTES, "channels_last")

    def _compute(self, X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, **_):
        return (qlinear_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, **self._attrs),)


class _QLinearSigmoid(_MsAttributes):
    """com.microsoft QLinearSigmoid as ONNX Runtime computes it (onnx/_qlinear_unary.py)."""

    def _compute(self, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, **_):
        return (qlinear_sigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point),)


class _QLinearLeakyRelu(_MsAttributes):
    """com.microsoft QLinearLeakyRelu as ONNX Runtime computes it (onnx/_qlinear_unary.py)."""

    _KEYWORDS = ("alpha",)

    def _compute(self, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, **_):
        return (qlinear_leaky_relu(X, X_scale, X_zero_point, Y_scale, Y_zero_point, **self._attrs),)


class _QLinearConcat(_MsAttributes):
    """com.microsoft QLinearConcat as ONNX Runtime computes it (onnx/_qlinear_unary.py)."""

    _KEYWORDS = ("axis",)

    def _compute(self, Y_scale, Y_zero_point, *inputs, **_):
        return (qlinear_concat(Y_scale, Y_zero_point, *inputs, **self._attrs),)


class _AxisSoftmax(_Op):
    """Softmax, LogSoftmax and Hardmax before opset 13 (onnx.reference's own code applies the opset-13
    reading, one axis alone, to every version): the input is coerced to 2-D at ``axis`` (default 1),
    ``[prod(shape[:axis]), prod(shape[axis:])]``, each row is one softmax, and the result takes the
    input's shape again. From opset 13, onnx.reference's implementation as it is. A Softmax over the last
    axis of a C-contiguous float32 X is bound (_softmax_rows)."""

    def _bind(self):
        if self.onnx_node.op_type == "Softmax":
            opset = self.run_params["opsets"][self.onnx_node.domain]
            self._axis = int(attributes(self.onnx_node).get("axis", -1 if opset >= 13 else 1))
            self._bound_call = self._softmax_rows

    def _softmax_rows(self, inputs):
        """onnx.reference's Softmax (``tmp = X - X.max(axis)``, ``Y = np.exp(tmp)``, ``Y /= Y.sum(axis)``) for
        the last axis of a C-contiguous float32 X, with its bits: the maximum and the subtraction, then the sums
        (numpy's pairwise order) and the division in C++ (csrc/float_ops.cpp), numpy's exp between them. Before
        opset 13 the 2-D coercion at the last axis is the same rows. None for any other X."""
        (x,) = inputs
        if type(x) is not np.ndarray or x.dtype != np.float32 or x.ndim == 0 or x.size == 0:
            return None
        if self._axis not in (-1, x.ndim - 1) or not x.flags.c_contiguous:
            return None
        rows = x.reshape(-1, x.shape[-1])
        y = np.empty_like(rows)
        _core.softmax_shift_rows(rows, y)
        np.exp(y, out=y)
        _core.softmax_normalize_rows(y)
        return (y.reshape(x.shape),)

    def _compute(self, X, **_):
        reference = _reference_op(self)
        opset = self.run_params["opsets"][self.onnx_node.domain]
        X = np.asarray(X)
        if opset >= 13 or X.ndim == 0:
            return reference.run(X)
        attrs = attributes(self.onnx_node)
        axis = int(attrs.get("axis", 1))
        if not -X.ndim <= axis <= X.ndim:
            raise ValueError(f"{self.onnx_node.op_type}: axis {axis} is out of range for {X.ndim}-D input")
        axis %= X.ndim + 1 if axis == X.ndim else X.ndim
        rows = X.reshape(prod(X.shape[:axis]), prod(X.shape[axis:]))
        reference.axis = 1  # the private reference op: each row of the 2-D coercion
        (y,) = reference.run(rows)
        return (np.asarray(y).reshape(X.shape),)


class _LayerNormalization(_Op):
    """LayerNormalization as onnx.reference computes it (numpy's float32 sums in their pairwise order, then
    float32 arithmetic step by step), in C++ with the same bits (csrc/layer_norm.cpp): a C-contiguous
    float32 X, stash_type 1, a float32 Scale (and B) of the normalized shape (leading ones allowed);
    anything else, onnx.reference's own. numpy's code was a tenth of a MiniLM batch in the session."""

    _rows = None  # (scale, bias, epsilon, fits(X): X takes the bound rows) where bound

    def _bind(self):
        # fixed Scale and B (float32, one shape): laid out for the C++ rows once, with what X's normalized
        # dimensions must be (leading ones aside) and the least rank X may have
        fixed, attributes = self._fixed((1, 2)), self._fixed_attributes()
        self._bound_call = None
        weights = [] if fixed is None else [w for w in fixed if w is not None]
        if fixed is None or fixed[0] is None or attributes is None or not _arrays(weights):
            return
        shapes = {without_leading_ones(w.shape) for w in weights}
        kept = all(w.dtype == np.float32 and w.size for w in weights)  # (no columns: numpy's 0 / 0, below)
        if attributes.get("stash_type", 1) == 1 and len(shapes) == 1 and kept:
            scale, bias = (None if w is None else np.ascontiguousarray(w).reshape(-1) for w in fixed)
            normalized, least_rank = shapes.pop(), max(w.ndim for w in weights)
            axis, epsilon = attributes.get("axis", -1), attributes.get("epsilon", 1e-5)

            def fits(X) -> bool:
                """Whether X is a C-contiguous ndarray whose dimensions from axis are the weights' (any dtype)."""
                if type(X) is not np.ndarray or not X.flags.c_contiguous or least_rank > X.ndim:
                    return False
                return -X.ndim <= axis < X.ndim and without_leading_ones(X.shape[axis % X.ndim :]) == normalized

            def bound_call(inputs):
                X = inputs[0]
                if not fits(X) or X.dtype != np.float32:
                    return None
                return self._normalized(X, axis % X.ndim, scale, bias, epsilon)

            self._rows = (scale, bias, float(np.float32(epsilon)), fits)  # (onnx/_layer_norms.py)
            self._bound_call = bound_call

    def _compute(self, X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1, **_):
        if self._bound_call is not None:
            outputs = self._bound_call((X,))
            if outputs is not None:
                return outputs
        X = np.asarray(X)
        axis = int(axis)
        if not (
            type(X) is np.ndarray
            and X.dtype == np.float32
            and X.flags.c_contiguous
            and X.ndim > 0
            and -X.ndim <= axis < X.ndim
            and stash_type == 1
            and all(_normalized_operand(w, X, axis) for w in ((Scale,) if B is None else (Scale, B)))
        ):
            return _reference_op(self).run(X, Scale, *([] if B is None else [B]))
        axis %= X.ndim
        if X.shape[:axis].count(0) == 0 and X.shape[axis:].count(0):  # (no columns: numpy's mean and variance 0 / 0)
            return _reference_op(self).run(X, Scale, *([] if B is None else [B]))
        bias = None if B is None else np.ascontiguousarray(B).reshape(-1)
        return self._normalized(X, axis, np.ascontiguousarray(Scale).reshape(-1), bias, epsilon)

    def _normalized(self, X, axis: int, scale, bias, epsilon):
        """(Y, Mean, InvStdDev) of a C-contiguous float32 X over its dimensions from axis (0 <= axis < X.ndim),
        scale and bias (or None) of those dimensions' elements (some, unless X has no rows)."""
        rows, cols = prod(X.shape[:axis]), prod(X.shape[axis:])
        y = np.empty(X.shape, np.float32)
        reduced = X.shape[:axis] + (1,) * (X.ndim - axis)
        mean, inv_std_dev = np.empty(reduced, np.float32), np.empty(reduced, np.float32)
        if rows and cols:
            _core.layer_norm_rows(
                X.reshape(rows, cols),
                scale,
                bias,
                float(np.float32(epsilon)),
                y.reshape(rows, cols),
                mean.reshape(-1),
                inv_std_dev.reshape(-1),
            )
        return (y, mean, inv_std_dev)


_INTEGER_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def _arrays(values) -> bool:
    return all(type(v) is np.ndarray for v in values)


def _outputs(y):
    """A bound call's single output as the node's outputs, or None where it did not take the call."""
    return None if y is None else (y,)


def _quantize_float32(quantize, x):
    return (quantize(x),) if type(x) is np.ndarray and x.dtype == np.float32 else None


def _normalized_operand(w, X, axis: int) -> bool:
    """Whether w (LayerNormalization's Scale or B) is a float32 array of X's normalized shape X.shape[axis:]
    (leading ones aside, and no more dimensions than X): one value per column of X's rows."""
    if type(w) is not np.ndarray or w.dtype != np.float32 or w.ndim > X.ndim:
        return False
    return without_leading_ones(w.shape) == without_leading_ones(X.shape[axis:])


class _Flatten(_Op):
    """Flatten as onnx.reference computes it (a reshape to the product of the dimensions before axis by -1; a
    view) as a bound call: the reference's per-call work took 5 us a node (a CNN's one before its Gemm)."""

    def _bind(self):
        attributes = self._fixed_attributes()
        self._bound_call = None
        if attributes is not None:
            axis = attributes.get("axis", 1)
            self._bound_call = lambda inputs: (_flattened(inputs[0], axis),) if type(inputs[0]) is np.ndarray else None

    def _compute(self, x, axis=1, **_):
        return (_flattened(x, axis),)


def _flattened(x, axis: int) -> np.ndarray:
    """onnx.reference's Flatten: (1, -1) for axis 0, else (the product of x.shape[:axis], -1), Python's
    slicing for a negative axis or one past the rank (as the reference reads it)."""
    return x.reshape((1, -1) if axis == 0 else (prod(x.shape[:axis]), -1))


class _Reshape(_Op):
    """Reshape as onnx.reference computes it (``np.reshape``: a view where numpy can make one; a 0 takes
    the input's dimension there unless allowzero) without its per-call arrays for the shape (a fifth of
    a microsecond of work took 20-60 us a node: MiniLM has 24); a shape that is not a 1-D int64 array,
    data that is not an array, or a 0 past the input's dimensions: onnx.reference's own."""

    def _bind(self):
        # a fixed shape: its dimensions and the places of its zeros (the input's dimension there) read once
        fixed, attributes = self._fixed((1,)), self._fixed_attributes()
        self._bound_call = None
        if fixed is not None and attributes is not None and self._plain_shape(fixed[0]):
            dims = fixed[0].tolist()
            zeros = [] if attributes.get("allowzero", 0) else [i for i, d in enumerate(dims) if d == 0]

            def bound_call(inputs):
                data = inputs[0]
                if type(data) is not np.ndarray:
                    return None
                if not zeros:
                    return (data.reshape(dims),)
                if zeros[-1] >= data.ndim:
                    return None
                shape = list(dims)
                for i in zeros:
                    shape[i] = data.shape[i]
                return (data.reshape(shape),)

            self._bound_call = bound_call

    @staticmethod
    def _plain_shape(shape) -> bool:
        return type(shape) is np.ndarray and shape.dtype == np.int64 and shape.ndim == 1

    def _compute(self, data, shape, allowzero=0, **_):
        if self._bound_call is not None:
            outputs = self._bound_call((data,))
            if outputs is not None:
                return outputs
        if type(data) is np.ndarray and self._plain_shape(shape):
            dims = shape.tolist()
            if not allowzero and 0 in dims:
                if any(d == 0 for d in dims[data.ndim :]):  # (onnx.reference: an IndexError, naming nothing)
                    raise ValueError(
                        f"Reshape: shape {dims} has a 0 (copy the input's dimension) at dimension "
                        f"{dims.index(0, data.ndim)}, past the input's {data.ndim} dimensions (allowzero=1 makes it "
                        "a zero)"
                    )
                dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
            return (data.reshape(dims),)
        return _reference_op(self).run(data, shape)


class _MaxPool(_Op):
    """MaxPool's values in numpy (onnx/_pool.py: onnx.reference loops over every output in Python); with an
    Indices output, ceil_mode, or a float input holding NaN, onnx.reference's own."""

    def _compute(self, X, **_):
        attrs = attributes(self.onnx_node)
        X = np.asarray(X)
        indices = len(self.onnx_node.output) > 1 and self.onnx_node.output[1]
        if indices or attrs.get("ceil_mode", 0) or (X.dtype.kind == "f" and np.isnan(X).any()) or X.ndim < 3:
            return _reference_op(self).run(X)
        kept = {k: v for k, v in attrs.items() if k in MAX_POOL_ATTRIBUTES}
        return (max_pool(X, memory_format="channels_last", **kept),)


# The node classes onnx/_layer_norms.py fuses (the session's own subclasses derive from them).
_NORM_NEIGHBOURS = {
    "LayerNormalization": _LayerNormalization,
    "DequantizeLinear": _DequantizeLinear,
    "QuantizeLinear": _QuantizeLinear,
    "DynamicQuantizeLinear": _DynamicQuantizeLinear,
}


def _op_classes(constants: dict, numerics: str, folded: dict) -> list:
    bases = {
        "QLinearMatMul": _QLinearMatMul,
        "MatMulNBits": _MatMulNBits,
        "QuantizeLinear": _QuantizeLinear,
        "DequantizeLinear": _DequantizeLinear,
        "DynamicQuantizeLinear": _DynamicQuantizeLinear,
        "MatMulInteger": _MatMulInteger,
        "Erf": _Erf,
        "QGemm": _QGemm,
        "QLinearAdd": _QLinearAdd,
        "QLinearMul": _QLinearMul,
        "QLinearSoftmax": _QLinearSoftmax,
        "QLinearConv": _QLinearConv,
        "ConvInteger": _ConvInteger,
        "MaxPool": _MaxPool,
        "LayerNormalization": _LayerNormalization,
        "Reshape": _Reshape,
        "Flatten": _Flatten,
        "QLinearGlobalAveragePool": _QLinearGlobalAveragePool,
        "QLinearAveragePool": _QLinearAveragePool,
        "QLinearSigmoid": _QLinearSigmoid,
        "QLinearLeakyRelu": _QLinearLeakyRelu,
        "QLinearConcat": _QLinearConcat,
        "Softmax": _AxisSoftmax,
        "LogSoftmax": _AxisSoftmax,
        "Hardmax": _AxisSoftmax,
    }
    shared = {"constants": constants, "numerics": numerics, "folded": folded}
    return [type(name, (base,), shared) for name, base in bases.items()]
