"""onnx/_calibrate.py: quantize()'s calibration: runs the float model on the calibration feeds with every weight as an input, accumulates each weight's X^T X, measures each weight's sensitivity and picks its bits for a budget."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..quantize_nbits import quantize_nbits
from ._common import check_feed, graph_inputs, to_array
from ._quantize import _subgraphs, quantize_weight

__all__ = [
    "read_feeds",
    "calibrate",
    "statistics",
    "row_mask",
    "choose_bits",
    "Prepared",
    "Stats",
    "HIGH_BITS",
    "ATTENTION_MASK",
]

ATTENTION_MASK = "attention_mask"  # a model input of this name, [batch, seq]: rows where it is 0 are left out
HIGH_BITS = 8  # what bits_budget raises a sensitive weight to
# bits_budget runs the model once per weight: on the first feeds holding this many samples (the leading axis of
# the first input), which ranks the weights as well as all of them at a fraction of the cost (docs/onnx.md)
SENSITIVITY_SAMPLES = 32
_log = logging.getLogger("quantmatmul.onnx")


# ---------------------------------------------------------------------------------------------------
# The feeds


def read_feeds(fn, model, calibration, progress=None) -> list[dict]:
    """The calibration feeds as a list (a CalibrationDataReader is read to its end once), each checked
    against the model's inputs like InferenceSession.run's feed. The arrays are the caller's, never written."""
    if isinstance(calibration, (str, bytes, dict, np.ndarray)):
        raise TypeError(
            f"{fn}: calibration must be an iterable of input feeds ({{input name: numpy array}}) or a "
            f"CalibrationDataReader, got a {type(calibration).__name__}"
            + (" (a single feed: wrap it in a list)" if isinstance(calibration, dict) else "")
        )
    get_next = getattr(calibration, "get_next", None)
    if callable(get_next):
        source = iter(get_next, None)
    else:
        try:
            source = iter(calibration)
        except TypeError:
            raise TypeError(
                f"{fn}: calibration must be an iterable of input feeds ({{input name: numpy array}}) or a "
                f"CalibrationDataReader (get_next()), got {type(calibration).__name__}"
            ) from None
    feeds = []
    for i, feed in enumerate(source):
        if not isinstance(feed, dict):
            raise TypeError(
                f"{fn}: calibration feed {i} must be a dict {{input name: numpy array}}, got {type(feed).__name__}"
            )
        feeds.append(check_feed(f"{fn}: calibration feed {i}", model, feed))
    if not feeds:
        raise ValueError(f"{fn}: calibration holds no feeds (it must give at least one {{input name: array}})")
    return feeds


# ---------------------------------------------------------------------------------------------------
# The weights calibration reaches


@dataclass
class Target:
    """One weight of the main graph, with every MatMul / Gemm that reads it (the same key): their indices in
    graph.node, their A inputs and names. ``W`` is the weight as quantized ([K, N], B's dtype)."""

    key: tuple
    W: np.ndarray
    elem_type: int
    indices: list
    inputs: list
    names: list
    level: int = 0

    @property
    def numel(self) -> int:
        return int(self.W.size)

    @property
    def label(self) -> str:
        return self.names[0] or self.key[0]


@dataclass
class Stats:
    """sum over calibration rows of x^T x (float64 [K, K]) and the number of rows."""

    xtx: np.ndarray
    rows: int = 0

    def hessian(self) -> np.ndarray:
        return self.xtx / max(self.rows, 1)

    def output_error(self, W, deq) -> float:
        """||X deq - X W||^2 / ||X W||^2 over the rows: tr(D^T XtX D) / tr(W^T XtX W)."""
        w = W.astype(np.float64)
        d = deq.astype(np.float64) - w
        den = float(np.sum(w * (self.xtx @ w)))
        num = float(np.sum(d * (self.xtx @ d)))
        return num / den if den > 0 else num


@dataclass
class Prepared:
    """A weight quantized with calibration data, for _Job: the NBitsWeight and what the rows report."""

    weight: object
    output_error: float | None = None
    output_error_rtn: float | None = None
    sensitivity: float | None = None


def _targets(found) -> tuple[list[Target], int]:
    """The main graph's weights by key, in graph order, and the element count of the other weights (in
    subgraphs: no calibration reaches them; they are quantized at `bits` without statistics)."""
    targets: dict = {}
    other: dict = {}
    for f, depth, index in found:
        if depth:
            other[(id(f.owner),) + f.key] = f.W.size
            continue
        t = targets.get(f.key)
        if t is None:
            t = targets[f.key] = Target(f.key, f.W, f.tensor.data_type, [], [], [])
        t.indices.append(index)
        t.inputs.append(f.node.input[0])
        t.names.append(f.node.name)
    return list(targets.values()), int(sum(other.values()))


def _levels(graph, targets):
    """Each target's group for sequential mode: how many quantized nodes lie on the longest path from the
    inputs to its A (a weight read at several places: its first)."""
    level_of = {i: None for t in targets for i in t.indices}
    depth: dict = {}
    for i, node in enumerate(graph.node):
        names = list(node.input)
        for sub in _subgraphs(node):
            names += _inner_inputs(sub)
        d = max((depth.get(n, 0) for n in names if n), default=0)
        if i in level_of:
            level_of[i] = d
            d += 1
        for o in node.output:
            depth[o] = d
    for t in targets:
        t.level = min(level_of[i] for i in t.indices)


def _inner_inputs(graph) -> list:
    names = []
    for node in graph.node:
        names += list(node.input)
        for sub in _subgraphs(node):
            names += _inner_inputs(sub)
    return names


# ---------------------------------------------------------------------------------------------------
# Running the float model


class _Runner:
    """The model with each target's weight turned into a graph input (fed per run: float, or a quantized
    weight dequantized) and each target's A exposed as an output, in ONNX Runtime (quantmatmul's
    InferenceSession when onnxruntime is missing or cannot run the model)."""

    def __init__(self, fn, model, targets, feeds):
        self.fn, self.feeds = fn, feeds
        m = onnx.ModelProto()
        m.CopyFrom(model)
        g = m.graph
        taken = {v.name for v in list(g.input) + list(g.output) + list(g.value_info)} | {t.name for t in g.initializer}
        for node in g.node:
            taken.update(node.input)
            taken.update(node.output)
        self.weight_inputs = {}
        for t in targets:
            name, n = f"{t.key[0]}/calibration", 0
            while name in taken:
                n += 1
                name = f"{t.key[0]}/calibration_{n}"
            taken.add(name)
            g.input.append(helper.make_tensor_value_info(name, t.elem_type, list(t.W.shape)))
            for i in t.indices:  # the node reads the weight as quantized: [K, N], alpha applied
                node = g.node[i]
                node.input[1] = name
                if node.op_type == "Gemm":
                    keep = [a for a in node.attribute if a.name not in ("transB", "alpha")]
                    node.ClearField("attribute")
                    node.attribute.extend(keep)
            self.weight_inputs[t.key] = name
        fed = {v.name for v in graph_inputs(model)}
        inits = {t.name: t for t in model.graph.initializer}
        self.has_mask = ATTENTION_MASK in fed
        self.constants = {}
        outputs = {o.name for o in g.output}
        self.exposed = set(outputs)
        for t in targets:
            for a in t.inputs:
                if a in fed or a in self.exposed:
                    continue
                if a in inits:
                    self.constants[a] = to_array(inits[a])
                    continue
                g.output.append(onnx.ValueInfoProto(name=a))
                self.exposed.add(a)
        self.float_outputs = [
            o.name
            for o in model.graph.output
            if o.type.HasField("tensor_type")
            and o.type.tensor_type.elem_type
            in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
        ]
        self.model = m
        self.session = None
        self.runtime = ""

    def _start(self, feed, weights):
        try:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            session = ort.InferenceSession(self.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            session.run(None, self._feed(feed, weights))  # bfloat16 weights, an operator ORT lacks, ...
            self.session, self.runtime = session, f"ONNX Runtime {ort.__version__}"
        except Exception as error:  # no onnxruntime, or it cannot run this model: quantmatmul's session
            from ._session import InferenceSession

            _log.info("calibration runs in quantmatmul.onnx.InferenceSession (ONNX Runtime: %s)", error)
            self.session, self.runtime = InferenceSession(self.model), "quantmatmul.onnx.InferenceSession"

    def _feed(self, feed, weights):
        return {**feed, **{self.weight_inputs[k]: w for k, w in weights.items()}}

    def run(self, feed, weights, names) -> dict:
        """{name: array} for names (model outputs and targets' A inputs) on one feed."""
        if self.session is None:
            self._start(feed, weights)
        fetch = [n for n in dict.fromkeys(names) if n in self.exposed]
        values = dict(zip(fetch, self.session.run(fetch, self._feed(feed, weights)))) if fetch else {}
        for n in names:
            if n not in values:
                values[n] = feed[n] if n in feed else self.constants[n]
        return values


# ---------------------------------------------------------------------------------------------------
# X^T X


def row_mask(lead: tuple, mask) -> np.ndarray | None:
    """Which rows of an activation with leading dimensions `lead` (flattened in C order) count, for an
    attention_mask [batch, seq]: the first rule that matches, else every row.

    1. lead == [batch, seq]: a row per token; 2. lead == [batch * seq]: the same, flattened;
    3. lead == [batch, d1, ..., seq] (e.g. [batch, heads, seq]): the token's mask, broadcast over the middle;
    4. lead == [seq, batch] (sequence-first layouts): the mask transposed."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.ndim != 2:
        return None
    keep = mask != 0
    lead = tuple(lead)
    if lead == mask.shape:
        return keep.ravel()
    if len(lead) == 1 and lead[0] == mask.size:
        return keep.ravel()
    if len(lead) >= 3 and lead[0] == mask.shape[0] and lead[-1] == mask.shape[1]:
        shape = (mask.shape[0],) + (1,) * (len(lead) - 2) + (mask.shape[1],)
        return np.broadcast_to(keep.reshape(shape), lead).ravel()
    if lead == mask.shape[::-1]:
        return keep.T.ravel()
    return None


def gram(X, mask=None) -> tuple[np.ndarray, int]:
    """(X^T X in float64, rows) for X's rows (its leading dimensions flattened), masked rows left out."""
    X = np.asarray(X)
    rows = X.reshape(-1, X.shape[-1]) if X.ndim else X.reshape(1, 1)
    keep = row_mask(X.shape[:-1], mask)
    if keep is not None:
        rows = rows[keep]
    x = rows.astype(np.float64)
    return x.T @ x, x.shape[0]


def collect(runner: _Runner, targets, weights, report, phase) -> dict:
    """{key: Stats} of targets over every calibration feed, the model fed `weights`."""
    need = list(dict.fromkeys(a for t in targets for a in t.inputs))
    K = {t.key: t.W.shape[0] for t in targets}
    stats = {t.key: Stats(np.zeros((K[t.key], K[t.key]))) for t in targets}
    n = len(runner.feeds)
    for b, feed in enumerate(runner.feeds):
        report(b, n, f"batch {b + 1}", phase)
        values = runner.run(feed, weights, need)
        mask = feed.get(ATTENTION_MASK) if runner.has_mask else None
        grams = {}
        for a in need:
            X = values[a]
            if X.ndim == 0 or not np.issubdtype(np.asarray(X).dtype, np.inexact):
                raise ValueError(f"quantize: the calibration activation {a!r} is not a float tensor")
            grams[a] = gram(X, mask)
        for t in targets:
            s = stats[t.key]
            for a in t.inputs:
                xtx, rows = grams[a]
                if xtx.shape != s.xtx.shape:
                    raise ValueError(
                        f"quantize: {t.label}: its input {a!r} has {xtx.shape[0]} columns, the weight K={K[t.key]}"
                    )
                s.xtx += xtx
                s.rows += rows
    for t in targets:
        if stats[t.key].rows == 0:
            raise ValueError(
                f"quantize: the calibration data reaches {t.label} with no rows (every position masked out)"
            )
    return stats


# ---------------------------------------------------------------------------------------------------
# Sensitivity and bits


def sensitivity(runner: _Runner, targets, float_weights, low, report) -> dict:
    """{key: sum ||y - y_float||^2 / sum ||y_float||^2} over the model's float outputs and the first feeds
    (SENSITIVITY_SAMPLES samples), with that weight alone quantized (its `low` version, dequantized) and every
    other weight float."""
    if not runner.float_outputs:
        raise ValueError("quantize: bits_budget measures the model's float outputs, and this model has none")
    outs = runner.float_outputs
    feeds, samples = [], 0
    for feed in runner.feeds:
        feeds.append(feed)
        first = next(iter(feed.values()))
        samples += first.shape[0] if first.ndim else 1
        if samples >= SENSITIVITY_SAMPLES:
            break
    reference = []
    for feed in feeds:
        values = runner.run(feed, float_weights, outs)
        reference.append([np.asarray(values[o], np.float64) for o in outs])
    den = sum(float(np.sum(r * r)) for ref in reference for r in ref)
    result = {}
    for j, t in enumerate(targets):
        report(j, len(targets), t.label, "measuring sensitivity")
        weights = dict(float_weights)
        weights[t.key] = low[t.key]
        num = 0.0
        for feed, ref in zip(feeds, reference):
            values = runner.run(feed, weights, outs)
            for o, r in zip(outs, ref):
                d = np.asarray(values[o], np.float64) - r
                num += float(np.sum(d * d))
        result[t.key] = num / den if den > 0 else num
    return result


def choose_bits(targets, other_numel, sensitivity, bits, budget) -> tuple[dict, float]:
    """({key: bits}, average bits per weight): the weights in order of decreasing sensitivity are raised to
    HIGH_BITS while the average over every quantized weight (the uncalibrated ones, other_numel elements,
    stay at bits) stays within budget; a weight that does not fit is passed over for the next."""
    total = sum(t.numel for t in targets) + other_numel
    room = (budget - bits) * total
    chosen = {t.key: bits for t in targets}
    for t in sorted(targets, key=lambda t: -sensitivity[t.key]):
        extra = (HIGH_BITS - bits) * t.numel
        if extra <= room + 1e-9 * total:
            chosen[t.key] = HIGH_BITS
            room -= extra
    average = (bits * total + sum((chosen[t.key] - bits) * t.numel for t in targets)) / total
    return chosen, float(average)


# ---------------------------------------------------------------------------------------------------
# The whole calibration


def _dequantized(q, W) -> np.ndarray:
    return q.dequantize().astype(W.dtype)


def calibrate(model, found, feeds, s, progress) -> tuple[dict, dict]:
    """({key: Prepared} for the main graph's weights, summary) for quantize_model. found: _quantize.plan()."""

    def report(done, total, name, phase):
        if progress is not None:
            progress(done, total, name, phase=phase)

    targets, other_numel = _targets(found)
    if not targets:
        return {}, {"average_bits": float(s.bits), "runtime": ""}
    runner = _Runner("quantize", model, targets, feeds)
    float_weights = {t.key: t.W for t in targets}
    bits = {t.key: s.bits for t in targets}
    stats, low, sens = None, {}, {}
    average = float(s.bits)
    if s.bits_budget is not None:
        stats = collect(runner, targets, float_weights, report, "collecting X^T X")
        for j, t in enumerate(targets):
            report(j, len(targets), t.label, f"quantizing at {s.bits} bits")
            low[t.key] = quantize_weight(s, t.W, hessian=stats[t.key].hessian())
        sens = sensitivity(
            runner, targets, float_weights, {k: _dequantized(q, float_weights[k]) for k, q in low.items()}, report
        )
        bits, average = choose_bits(targets, other_numel, sens, s.bits, s.bits_budget)

    quantized, used_stats = {}, {}
    if s.sequential:
        _levels(model.graph, targets)
        groups = sorted({t.level for t in targets})
        weights = dict(float_weights)
        for g, level in enumerate(groups):
            group = [t for t in targets if t.level == level]
            phase = f"collecting X^T X (group {g + 1}/{len(groups)})"
            group_stats = collect(runner, group, weights, report, phase)
            for j, t in enumerate(group):
                report(j, len(group), t.label, f"quantizing (group {g + 1}/{len(groups)})")
                q = quantize_weight(s, t.W, bits=bits[t.key], hessian=group_stats[t.key].hessian())
                quantized[t.key], used_stats[t.key] = q, group_stats[t.key]
                weights[t.key] = _dequantized(q, t.W)
    else:
        if stats is None:
            stats = collect(runner, targets, float_weights, report, "collecting X^T X")
        for j, t in enumerate(targets):
            report(j, len(targets), t.label, "quantizing")
            q = low.get(t.key) if bits[t.key] == s.bits else None
            if q is None:
                q = quantize_weight(s, t.W, bits=bits[t.key], hessian=stats[t.key].hessian())
            quantized[t.key], used_stats[t.key] = q, stats[t.key]

    prepared = {}
    for t in targets:
        q, st = quantized[t.key], used_stats[t.key]
        rtn = quantize_nbits(t.W, bits=q.bits, block_size=s.block_size, symmetric=s.symmetric, method="rtn")
        prepared[t.key] = Prepared(
            q, st.output_error(t.W, q.dequantize()), st.output_error(t.W, rtn.dequantize()), sens.get(t.key)
        )
    _log.info("calibration: %d feeds in %s", len(feeds), runner.runtime)
    return prepared, {"average_bits": average, "runtime": runner.runtime}


def statistics(model, calibration, *, weights=None, exclude=()) -> dict:
    """{(weight name, transB, alpha): Stats} of every main-graph weight quantize() would replace, over the
    calibration feeds, the model fed its float weights (or weights: {key: [K, N] array} in their place)."""
    from ._common import load_model
    from ._quantize import plan

    model = load_model("quantize", model, copy=False)
    feeds = read_feeds("quantize", model, calibration)
    targets, _ = _targets(plan(model, frozenset(exclude)))
    runner = _Runner("quantize", model, targets, feeds)
    fed = {t.key: t.W for t in targets}
    fed.update(weights or {})
    return collect(runner, targets, fed, lambda *_: None, "")
