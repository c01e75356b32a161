"""onnx/_quantize.py: quantize(): MatMul and Gemm nodes with constant float weights become com.microsoft MatMulNBits nodes, in ONNX Runtime's MatMulNBitsQuantizer's form."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..matmul_nbits import ACCURACY_LEVELS
from ..quantize_nbits import CALIBRATED_METHODS as _H_METHODS
from ..quantize_nbits import METHODS as _W_METHODS
from ..quantize_nbits import quantize_nbits
from ._common import MS_DOMAIN, attributes, load_model, to_array

__all__ = ["quantize", "quantize_model", "QuantizedNode", "SkippedNode"]

_FN = "quantize"
_log = logging.getLogger("quantmatmul.onnx")
# "rtn", "mse", "hqq" from W alone; "gptq" also needs the layer's input statistics (calibration)
METHODS = tuple(_W_METHODS) + tuple(_H_METHODS)
_WEIGHT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class QuantizedNode:
    """One MatMul / Gemm replaced: its name, the weight's K x N, the settings, and the relative squared error
    ||W_q - W||^2 / ||W||^2 of the quantized weight (W_q as MatMulNBits dequantizes it)."""

    node: str
    op_type: str
    weight: str
    K: int
    N: int
    bits: int
    block_size: int
    error: float
    shared: bool = False  # the weight was already quantized for an earlier node
    method: str = ""  # the method that produced the codes ("mse" where gptq had no statistics: a subgraph)
    output_error: float | None = None  # with calibration: ||X W_q - X W||^2 / ||X W||^2 on its calibration inputs
    output_error_rtn: float | None = None  # the same for rtn at the same bits and block size
    sensitivity: float | None = None  # with bits_budget: the model outputs' error with this weight alone at `bits`


@dataclass(frozen=True)
class SkippedNode:
    node: str
    op_type: str
    reason: str


@dataclass
class _Settings:
    bits: int
    block_size: int
    method: str
    symmetric: bool
    accuracy_level: int | None
    exclude: frozenset = field(default_factory=frozenset)
    desc_act: bool = False
    sequential: bool = False
    bits_budget: float | None = None


def quantize(
    model,
    *,
    bits=4,
    block_size=128,
    method="mse",
    symmetric=False,
    accuracy_level=None,
    exclude=(),
    calibration=None,
    sequential=False,
    bits_budget=None,
    desc_act=False,
) -> onnx.ModelProto:
    """Quantize a model's MatMul / Gemm weights to ``bits``-wide blocks: ONNX Runtime's MatMulNBits.

    Every ``MatMul`` whose B is a constant float32 / float16 / bfloat16 initializer of rank 2, and every
    ``Gemm`` with such a B (either ``transB``; ``transA=0``), whose name is not in ``exclude``, becomes a
    ``com.microsoft`` ``MatMulNBits`` node (plus an ``Add`` for a Gemm's C) written as ONNX Runtime's
    ``MatMulNBitsQuantizer`` writes it: inputs ``(A, B_Q{bits}, B_scales[, B_zero_points])``, attributes
    ``K, N, bits, block_size`` (and ``accuracy_level`` when given and nonzero), initializers named
    after B, node named ``<name>_Q{bits}``, the float weight removed. A weight shared by several nodes is
    quantized once. With ``method="rtn"`` the initializers are byte-identical to ONNX Runtime's (bits 2,
    4, 8, block sizes 16..256); ``"mse"`` and ``"hqq"`` lower the error (docs/quantizer.md); ``"gptq"``
    lowers the error of each node's output on calibration data (docs/onnx.md, "Calibration").

    Parameters
    ----------
    model : onnx.ModelProto or a path (external data files are read). Never modified.
    bits : int in 2..8. ONNX Runtime runs 2, 4 and 8.
    block_size : int, a power of two >= 16.
    method : "rtn", "mse", "hqq" (float zero points; not symmetric) or "gptq" (needs calibration).
    symmetric : bool. No zero-point tensor (the operator's default ``2**(bits-1)``).
    accuracy_level : None or 0..4. None and 0 write no attribute (the operator's default 0).
    exclude : node names to leave as they are.
    calibration : None, an iterable of input feeds ({input name: numpy array}, each a complete input of
        the model) or an onnxruntime ``CalibrationDataReader`` (``get_next()`` returns a feed, then None).
        The float model runs on every feed; each weight's ``X^T X`` is accumulated from its inputs
        (rows where an ``attention_mask`` input is 0 left out). Needed by ``"gptq"``, ``sequential`` and
        ``bits_budget``; with the other methods it adds each node's output error to the rows.
    sequential : bool. Quantize group by group in topological order, each group's statistics collected
        with the groups before it already quantized.
    bits_budget : None or a number >= bits. Raise the weights whose quantization at ``bits`` moves the
        model's outputs most to 8 bits while the average bits per weight (codes only, weighted by each
        weight's element count) stays within the budget; the bits chosen go into the model's
        ``metadata_props`` (key ``quantmatmul.bits``, JSON).
    desc_act : bool. ``"gptq"`` only: quantize rows in order of decreasing Hessian diagonal (a g_idx input).

    Returns
    -------
    onnx.ModelProto, passing ``onnx.checker.check_model``. A Gemm that cannot be expressed (``transA=1``,
    or ``beta != 1`` with a C that is not an initializer) is left as it is and logged (logger
    ``quantmatmul.onnx``); a model with nothing to quantize is a ValueError.
    """
    return quantize_model(
        model,
        bits=bits,
        block_size=block_size,
        method=method,
        symmetric=symmetric,
        accuracy_level=accuracy_level,
        exclude=exclude,
        calibration=calibration,
        sequential=sequential,
        bits_budget=bits_budget,
        desc_act=desc_act,
    )[0]


def quantize_model(
    model,
    *,
    bits=4,
    block_size=128,
    method="mse",
    symmetric=False,
    accuracy_level=None,
    exclude=(),
    calibration=None,
    sequential=False,
    bits_budget=None,
    desc_act=False,
    progress=None,
):
    """quantize() that also returns what it did: ``(model, [QuantizedNode | SkippedNode, ...])``.
    progress, if given, is called as ``progress(done, total, name, phase=...)`` before each step of each
    phase: "reading calibration", "collecting X^T X", "measuring sensitivity", "quantizing" (each step a
    batch, a weight or a node)."""
    settings = _settings(bits, block_size, method, symmetric, accuracy_level, exclude)
    _calibration_settings(settings, calibration, sequential, bits_budget, desc_act)
    model = load_model(_FN, model, copy=True)
    known = _node_names(model.graph)
    unknown = sorted(settings.exclude - known)
    if unknown:
        raise ValueError(f"{_FN}: exclude names nodes the model does not have: {', '.join(map(repr, unknown))}")
    prepared, summary = {}, None
    if calibration is not None:
        from . import _calibrate

        feeds = _calibrate.read_feeds(_FN, model, calibration, progress)
        found = plan(model, settings.exclude)
        if found:
            prepared, summary = _calibrate.calibrate(model, found, feeds, settings, progress)
    job = _Job(model, settings, progress, prepared, phase="writing" if prepared else "quantizing")
    job.run()
    if not any(isinstance(r, QuantizedNode) for r in job.rows):
        reasons = "; ".join(f"{r.node or r.op_type}: {r.reason}" for r in job.rows if isinstance(r, SkippedNode))
        raise ValueError(
            f"{_FN}: the model has no quantizable node (a MatMul or Gemm with a constant rank-2 float weight"
            + (f"; {reasons})" if reasons else ")")
        )
    if settings.bits_budget is not None:
        _write_bits(model, settings, job.rows, summary)
    return model, job.rows


def plan(model, exclude) -> list:
    """Every MatMul / Gemm quantize() will replace, in graph order: (Found, depth of its graph: 0 for the
    main graph, index of the node in its graph)."""
    out = []

    def walk(stack):
        for index, node in enumerate(stack[-1].node):
            for sub in _subgraphs(node):
                walk(stack + [sub])
            if is_candidate(node, exclude):
                found = examine(node, stack)
                if not isinstance(found, str):
                    out.append((found, len(stack) - 1, index))

    walk([model.graph])
    return out


BITS_KEY = "quantmatmul.bits"


def _write_bits(model, settings, rows, summary):
    """metadata_props[BITS_KEY]: the bits of every quantized node (by name; an unnamed node by its output)."""
    import json

    nodes = {}
    for k, r in enumerate(rows):
        if isinstance(r, QuantizedNode):
            nodes[r.node or f"#{k}"] = r.bits
    value = {
        "bits": settings.bits,
        "bits_budget": settings.bits_budget,
        "average_bits": summary["average_bits"] if summary else float(settings.bits),
        "counted": "codes only (scales and zero points not counted), weighted by each weight's elements",
        "nodes": nodes,
    }
    for prop in model.metadata_props:
        if prop.key == BITS_KEY:
            prop.value = json.dumps(value)
            break
    else:
        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, BITS_KEY: json.dumps(value)})


# ---------------------------------------------------------------------------------------------------
# Validation


def _settings(bits, block_size, method, symmetric, accuracy_level, exclude) -> _Settings:
    for name, value in (("bits", bits), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{_FN}: {name} must be an integer, got {value!r}")
    bits, block_size = int(bits), int(block_size)
    if not 2 <= bits <= 8:
        raise ValueError(f"{_FN}: bits must be in 2..8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{_FN}: block_size must be a power of two >= 16, got {block_size}")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"{_FN}: method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"{_FN}: symmetric must be a bool, got {symmetric!r}")
    if symmetric and method == "hqq":
        raise ValueError(f"{_FN}: method 'hqq' fits a float zero point per block and cannot be symmetric")
    if accuracy_level is not None:
        if isinstance(accuracy_level, bool) or not isinstance(accuracy_level, (int, np.integer)):
            raise TypeError(f"{_FN}: accuracy_level must be None or an integer in 0..4, got {accuracy_level!r}")
        if int(accuracy_level) not in ACCURACY_LEVELS:
            raise ValueError(f"{_FN}: accuracy_level must be None or one of 0, 1, 2, 3, 4, got {accuracy_level}")
        accuracy_level = int(accuracy_level)
    if isinstance(exclude, str):
        exclude = (exclude,)
    try:
        names = frozenset(exclude)
    except TypeError:
        raise TypeError(f"{_FN}: exclude must be a collection of node names, got {type(exclude).__name__}") from None
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{_FN}: exclude must hold node names (strings)")
    return _Settings(bits, block_size, method, bool(symmetric), accuracy_level, names)


def _calibration_settings(s: _Settings, calibration, sequential, bits_budget, desc_act):
    """The calibration options, checked together (the feeds themselves are checked by _calibrate.read_feeds)."""
    for name, value in (("sequential", sequential), ("desc_act", desc_act)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{_FN}: {name} must be a bool, got {value!r}")
    if bits_budget is not None:
        if isinstance(bits_budget, (bool, np.bool_)) or not isinstance(
            bits_budget, (int, float, np.integer, np.floating)
        ):
            raise TypeError(
                f"{_FN}: bits_budget must be None or a number (average bits per weight), got {bits_budget!r}"
            )
        bits_budget = float(bits_budget)
        if not np.isfinite(bits_budget):
            raise ValueError(f"{_FN}: bits_budget must be a finite number, got {bits_budget}")
        if bits_budget < s.bits:
            raise ValueError(
                f"{_FN}: bits_budget {bits_budget:g} is below bits={s.bits}: every weight takes at least `bits`"
            )
    if calibration is None:
        if s.method == "gptq":
            raise ValueError(f"{_FN}: method 'gptq' needs calibration data: pass calibration=[{{input: array}}, ...]")
        for name, value in (("sequential", sequential), ("bits_budget", bits_budget)):
            if value not in (None, False):
                raise ValueError(f"{_FN}: {name} needs calibration data: pass calibration=[{{input: array}}, ...]")
    if desc_act and s.method != "gptq":
        raise ValueError(f"{_FN}: desc_act applies to method 'gptq' only, got method {s.method!r}")
    s.desc_act, s.sequential, s.bits_budget = bool(desc_act), bool(sequential), bits_budget


def _node_names(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.add(node.name)
        for sub in _subgraphs(node):
            names |= _node_names(sub)
    return names


def _subgraphs(node):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _all_value_names(graph: onnx.GraphProto, names: set):
    names.update(t.name for t in graph.initializer)
    names.update(v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info))
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for sub in _subgraphs(node):
            _all_value_names(sub, names)


# ---------------------------------------------------------------------------------------------------
# The rewrite


@dataclass
class _Weight:
    """A quantized weight, held by the graph that owns its float initializer."""

    b_quant: str
    scales: str
    zero_points: str | None
    K: int
    N: int
    error: float
    bits: int = 0
    method: str = ""
    g_idx: str | None = None
    output_error: float | None = None
    output_error_rtn: float | None = None
    sensitivity: float | None = None


@dataclass
class Found:
    """A MatMul / Gemm that can become MatMulNBits: its weight as quantized (``W``: [K, N], B's dtype,
    transposed for transB=1, alpha applied) and what the rewrite needs. ``key`` names the quantized weight:
    nodes with the same key (in the same graph) share it."""

    node: onnx.NodeProto
    tensor: onnx.TensorProto
    owner: onnx.GraphProto
    W: np.ndarray
    trans_b: int = 0
    alpha: float = 1.0
    beta: float = 1.0
    c: str | None = None

    @property
    def key(self) -> tuple:
        return (self.tensor.name, self.trans_b, self.alpha)


def examine(node, stack) -> Found | str:
    """What quantize() can do with a MatMul / Gemm node: a Found, or the reason it is left alone."""
    if len(node.input) < 2:
        return "fewer than two inputs"
    found = _initializer(node.input[1], stack)
    if found is None:
        return "B is not a constant initializer"
    tensor, owner = found
    alpha, beta, trans_b, c = 1.0, 1.0, 0, None
    if node.op_type == "Gemm":
        attrs = attributes(node)
        if attrs.get("transA", 0):
            return "transA=1 (MatMulNBits takes A as it is)"
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        trans_b = int(attrs.get("transB", 0))
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if c is not None and beta == 0.0:
            c = None
        if c is not None and beta != 1.0 and _initializer(c, stack) is None:
            return f"beta={beta:g} with a C that is not a constant initializer"
    if len(tensor.dims) != 2:
        return f"B has rank {len(tensor.dims)}, not 2"
    W = to_array(tensor)
    if W.dtype not in _WEIGHT_TYPES:
        return f"B is {W.dtype}, not float32, float16 or bfloat16"
    if W.size == 0:
        return "B is empty"
    if trans_b:
        W = W.T
    if alpha != 1.0:
        W = (W.astype(np.float32) * np.float32(alpha)).astype(W.dtype)
    return Found(node, tensor, owner, W, trans_b, alpha, beta, c)


def is_candidate(node, exclude) -> bool:
    return node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx") and node.name not in exclude


def weight_error(W, deq) -> float:
    """||deq - W||^2 / ||W||^2 (||deq||^2 for an all-zero W)."""
    w64 = W.astype(np.float64)
    norm = float(np.sum(w64 * w64))
    diff = deq.astype(np.float64) - w64
    return float(np.sum(diff * diff)) / norm if norm else float(np.sum(diff * diff))


def quantize_weight(s: _Settings, W, *, bits=None, hessian=None):
    """quantize_nbits(W) with the call's settings (bits overridden by bits; gptq with hessian)."""
    options = dict(bits=s.bits if bits is None else bits, block_size=s.block_size, symmetric=s.symmetric)
    if s.method == "gptq":
        if hessian is None:  # a weight the calibration does not reach (a subgraph's): the best method without data
            return quantize_nbits(W, method="mse", **options)
        # ONNX Runtime refuses 8-bit weights with a g_idx: those keep static groups
        desc_act = s.desc_act and options["bits"] != 8
        return quantize_nbits(W, method="gptq", hessian=hessian, desc_act=desc_act, **options)
    return quantize_nbits(W, method=s.method, **options)


class _Job:
    """One quantize() call: walks the graph (and subgraphs, as ORT's tool does), replaces each node.
    ``prepared`` holds the weights already quantized with calibration data: {Found.key: Prepared} for the
    main graph's weights."""

    def __init__(self, model, settings: _Settings, progress, prepared=None, phase="quantizing"):
        self.model, self.s, self.progress, self.phase = model, settings, progress, phase
        self.prepared = prepared or {}
        self.rows: list = []
        self.names: set = set()
        _all_value_names(model.graph, self.names)
        self.weights: dict = {}  # (id(graph), B name, transposed, alpha) -> _Weight
        self.replaced: dict = {}  # id(graph) -> (graph, {float weight names replaced there})
        self.total = sum(1 for _ in self._candidates(model.graph))
        self.done = 0

    def _candidates(self, graph):
        for node in graph.node:
            if is_candidate(node, self.s.exclude):
                yield node
            for sub in _subgraphs(node):
                yield from self._candidates(sub)

    def run(self):
        # ORT's tool sets the com.microsoft opset to 1 (adding it when absent)
        for opset in self.model.opset_import:
            if opset.domain == MS_DOMAIN:
                opset.version = 1
                break
        else:
            self.model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
        self._graph([self.model.graph])
        self._remove_replaced()

    def unique(self, base: str) -> str:
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def _graph(self, stack):
        graph = stack[-1]
        new_nodes = []
        for node in graph.node:
            for sub in _subgraphs(node):
                self._graph(stack + [sub])
            if node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx"):
                if node.name in self.s.exclude:
                    self.rows.append(SkippedNode(node.name, node.op_type, "excluded"))
                    _log.info("%s: excluded", node.name)
                    new_nodes.append(node)
                    continue
                new_nodes.extend(self._node(node, stack))
            else:
                new_nodes.append(node)
        graph.ClearField("node")
        graph.node.extend(new_nodes)

    def _skip(self, node, reason):
        self.rows.append(SkippedNode(node.name, node.op_type, reason))
        _log.info("%s (%s) not quantized: %s", node.name, node.op_type, reason)
        return [node]

    def _node(self, node, stack):
        if self.progress is not None:
            self.progress(self.done, self.total, node.name, phase=self.phase)
        self.done += 1
        found = examine(node, stack)
        if isinstance(found, str):
            return self._skip(node, found)
        key = (id(found.owner),) + found.key
        weight = self.weights.get(key)
        shared = weight is not None
        if weight is None:
            prepared = self.prepared.get(found.key) if len(stack) == 1 else None
            weight = self._write_weight(found, prepared)
            self.weights[key] = weight
            self.replaced.setdefault(id(found.owner), (found.owner, set()))[1].add(found.tensor.name)
        # ORT's tool removes B from the graph inputs of the graph that holds it
        for vi in found.owner.input:
            if vi.name == found.tensor.name:
                found.owner.input.remove(vi)
                break
        self.rows.append(
            QuantizedNode(
                node.name,
                node.op_type,
                found.tensor.name,
                weight.K,
                weight.N,
                weight.bits,
                self.s.block_size,
                weight.error,
                shared,
                weight.method,
                weight.output_error,
                weight.output_error_rtn,
                weight.sensitivity,
            )
        )
        inputs = [node.input[0], weight.b_quant, weight.scales, weight.zero_points or ""]
        if weight.g_idx:
            inputs.append(weight.g_idx)
        while not inputs[-1]:
            inputs.pop()
        attrs = {"K": weight.K, "N": weight.N, "bits": weight.bits, "block_size": self.s.block_size}
        if self.s.accuracy_level:  # ORT's tool writes no attribute for None and 0
            attrs["accuracy_level"] = self.s.accuracy_level
        name = node.name + f"_Q{weight.bits}" if node.name else ""
        c = found.c
        if c is None:
            return [helper.make_node("MatMulNBits", inputs, [node.output[0]], name=name, domain=MS_DOMAIN, **attrs)]
        if found.beta != 1.0:
            c = self._scaled_c(c, found.beta, stack)
        product = self.unique(node.output[0] + f"_Q{weight.bits}")
        return [
            helper.make_node("MatMulNBits", inputs, [product], name=name, domain=MS_DOMAIN, **attrs),
            helper.make_node(
                "Add", [product, c], [node.output[0]], name=self.unique(node.name + "_bias") if node.name else ""
            ),
        ]

    def _write_weight(self, found: Found, prepared) -> _Weight:
        name, owner = found.tensor.name, found.owner
        if prepared is not None:
            q = prepared.weight
        else:
            q = quantize_weight(self.s, found.W)
        b_name = self.unique(f"{name}_Q{q.bits}")
        scales_name = self.unique(f"{name}_scales")
        tensors = [
            numpy_helper.from_array(np.ascontiguousarray(q.B), b_name),
            numpy_helper.from_array(np.ascontiguousarray(q.scales), scales_name),
        ]
        zp_name = g_idx_name = None
        if q.zero_points is not None:
            zp = q.zero_points
            if getattr(q, "g_idx", None) is not None and zp.dtype == np.uint8:
                # ONNX Runtime ignores uint8 zero points beside a g_idx; float ones (the same values) it applies
                zp = q.zero_point_values().astype(q.scales.dtype)
            zp_name = self.unique(f"{name}_zero_points")
            tensors.append(numpy_helper.from_array(np.ascontiguousarray(zp), zp_name))
        if getattr(q, "g_idx", None) is not None:
            g_idx_name = self.unique(f"{name}_g_idx")
            tensors.append(numpy_helper.from_array(np.ascontiguousarray(q.g_idx), g_idx_name))
        owner.initializer.extend(tensors)
        weight = _Weight(b_name, scales_name, zp_name, q.K, q.N, weight_error(found.W, q.dequantize()))
        weight.bits, weight.method, weight.g_idx = q.bits, q.method, g_idx_name
        if prepared is not None:
            weight.output_error = prepared.output_error
            weight.output_error_rtn = prepared.output_error_rtn
            weight.sensitivity = prepared.sensitivity
        return weight

    def _scaled_c(self, c, beta, stack):
        tensor, owner = _initializer(c, stack)
        values = to_array(tensor)
        scaled = (values.astype(np.float32) * np.float32(beta)).astype(values.dtype)
        name = self.unique(f"{c}_beta")
        owner.initializer.append(numpy_helper.from_array(scaled, name))
        return name

    def _remove_replaced(self):
        """Float weights no longer read by any node are removed (ORT's tool removes every unused initializer;
        here only the weights this call replaced, so that nothing else in the model changes)."""
        used: set = set()
        _used_names(self.model.graph, used)
        for graph, names in self.replaced.values():
            keep = [t for t in graph.initializer if t.name not in names or t.name in used]
            if len(keep) != len(graph.initializer):
                graph.ClearField("initializer")
                graph.initializer.extend(keep)


def _initializer(name, stack):
    """(tensor, graph holding it) for the initializer `name` visible from the innermost graph, or None."""
    for graph in reversed(stack):
        for tensor in graph.initializer:
            if tensor.name == name:
                return tensor, graph
    return None


def _used_names(graph, used: set):
    for node in graph.node:
        used.update(node.input)
        for sub in _subgraphs(node):
            _used_names(sub, used)
    used.update(o.name for o in graph.output)
