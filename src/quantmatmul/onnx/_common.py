"""onnx/_common.py: what quantize, InferenceSession and compare share: loading a model, its inputs' types, checking an input feed."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

MS_DOMAIN = "com.microsoft"

# The ONNX attributes quantmatmul's functions take as keywords, per operator (a fused node copies them).
CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
AVERAGE_POOL_ATTRIBUTES = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
MAX_POOL_ATTRIBUTES = ("auto_pad", "dilations", "kernel_shape", "pads", "strides")


def attributes(node, names=None) -> dict:
    """node's attributes as Python values, strings decoded; only those named in names, where given."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute if names is None or a.name in names}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def load_model(fn: str, model, *, copy: bool) -> onnx.ModelProto:
    """model as a ModelProto: a path is read with its external data; a ModelProto is copied when copy is set
    (so the caller's is never modified). Anything that is not an ONNX model is a ValueError / TypeError
    starting with fn."""
    if isinstance(model, onnx.ModelProto):
        if copy:
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
            model = proto
        source = "the model"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ValueError(f"{fn}: {path!r} is not a file")
        try:
            model = onnx.load(path)
        except Exception as error:  # protobuf's DecodeError, external data not found, ...
            raise ValueError(f"{fn}: {path!r} is not an ONNX model ({_first_line(error)})") from None
        source = repr(path)
    else:
        raise TypeError(f"{fn}: model must be an onnx.ModelProto or a path, got {type(model).__name__}")
    # protobuf parses many non-ONNX byte strings (an empty file is an empty message): a model has a graph
    if not model.HasField("graph") or not model.opset_import or (not model.graph.node and not model.graph.output):
        raise ValueError(f"{fn}: {source} is not an ONNX model (no graph, opset or nodes)")
    for tensor in model.graph.initializer:
        if external_data_helper.uses_external_data(tensor):
            raise ValueError(
                f"{fn}: initializer {tensor.name!r} is stored in an external file that was not loaded: pass the "
                f"model's path, or onnx.load() it (load_external_data=True)"
            )
    return model


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]


def without_leading_ones(shape: tuple) -> tuple:
    """shape with its leading 1s dropped: the dimensions an operand broadcast over the leading ones keeps."""
    return shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)) :]


def initializers(graph: onnx.GraphProto) -> dict[str, TensorProto]:
    return {t.name: t for t in graph.initializer}


def to_array(tensor: TensorProto) -> np.ndarray:
    return numpy_helper.to_array(tensor)


def type_string(elem_type: int) -> str:
    """ONNX Runtime's name of a tensor type: 'tensor(float)', 'tensor(uint8)', ..."""
    return f"tensor({TensorProto.DataType.Name(elem_type).lower()})"


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


@dataclass(frozen=True)
class NodeArg:
    """A model input or output as onnxruntime describes it: name, shape (ints for fixed dimensions, the
    dimension's name or None otherwise) and type ('tensor(float)')."""

    name: str
    shape: list | None
    type: str


def node_arg(value_info: onnx.ValueInfoProto) -> NodeArg:
    t = value_info.type
    if not t.HasField("tensor_type"):
        return NodeArg(value_info.name, None, t.WhichOneof("value") or "unknown")
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return NodeArg(value_info.name, shape, type_string(tt.elem_type))


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs that are not initializers (IR < 4 lists initializers as inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def feed_spec(model: onnx.ModelProto) -> dict[str, tuple[NodeArg, int | None]]:
    """What check_feed checks a feed against, read from the model once: per input a caller feeds, its NodeArg
    and its tensor element type (None where it is not a tensor or has none)."""
    spec = {}
    for i in graph_inputs(model):
        tensor = i.type.HasField("tensor_type") and i.type.tensor_type.elem_type
        spec[i.name] = (node_arg(i), i.type.tensor_type.elem_type if tensor else None)
    return spec


def check_feed(
    fn: str, model: onnx.ModelProto, feed, *, complete: bool = True, spec: dict | None = None
) -> dict[str, np.ndarray]:
    """input_feed checked against the model's inputs: every name known, every input given (unless not
    complete), each value of the declared type and rank with the declared fixed dimensions. Returns {name:
    ndarray}. spec: feed_spec(model), where the caller keeps it (a session: the model's initializers are not
    read again on every run)."""
    if not isinstance(feed, dict):
        raise TypeError(f"{fn}: input_feed must be a dict {{input name: numpy array}}, got {type(feed).__name__}")
    inputs = spec if spec is not None else feed_spec(model)
    unknown = [name for name in feed if name not in inputs]
    if unknown:
        raise ValueError(
            f"{fn}: the model has no input named {unknown[0]!r} (its inputs: {', '.join(inputs) or 'none'})"
        )
    missing = [name for name in inputs if name not in feed]
    if missing and complete:
        raise ValueError(f"{fn}: input {missing[0]!r} is missing from input_feed")
    checked = {}
    for name, value in feed.items():
        arg, elem_type = inputs[name]
        array = np.asarray(value)
        if elem_type:
            expected = np_dtype(elem_type)
            if array.dtype != expected:
                raise TypeError(f"{fn}: input {name!r} must be {arg.type} ({expected}), got {array.dtype}")
        if arg.shape is not None:
            if array.ndim != len(arg.shape):
                raise ValueError(f"{fn}: input {name!r} must have shape {_shape_text(arg.shape)}, got {array.shape}")
            for size, dim in zip(array.shape, arg.shape):
                if isinstance(dim, int) and dim > 0 and size != dim:
                    raise ValueError(
                        f"{fn}: input {name!r} must have shape {_shape_text(arg.shape)}, got {array.shape}"
                    )
        checked[name] = array
    return checked


def _shape_text(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A plain-text table: a header line, a rule, one line per row; align has one 'l' or 'r' per column."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" * len(headers)
    lines = []
    for k, row in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plan_links(entries: list) -> tuple[dict, dict]:
    """For the session's plan entries (node, input names, output names, runs a subgraph, names read): {value name:
    the indices of the entries that read it} (a defaultdict of sets) and {value name: the index of the entry that
    writes it}."""
    readers, producers = defaultdict(set), {}
    for i, entry in enumerate(entries):
        for name in entry[4]:
            readers[name].add(i)
        for name in entry[2]:
            producers[name] = i
    return readers, producers


def linear_chains(entries: list, graph_outputs: set, link, data_first: bool = False) -> list:
    """The chains of plan entries (lists of indices, two or more, in plan order, none sharing an entry) whose
    entries satisfy link(entry), each after the first reading the one output of the one before it (as its
    first input where data_first), that value read by it alone and no graph output. A reader before its
    producer (a graph out of order, which the run loop reports) does not continue a chain."""
    readers, _ = plan_links(entries)
    used, chains = set(), []

    def next_link(i):
        (output,) = entries[i][2]
        if output in graph_outputs or len(readers.get(output, ())) != 1:
            return None
        (j,) = readers[output]
        if j <= i or j in used or not link(entries[j]) or (data_first and entries[j][1][0] != output):
            return None
        return j

    for i, entry in enumerate(entries):
        if i in used or not link(entry):
            continue
        chain = [i]
        while (j := next_link(chain[-1])) is not None:
            chain.append(j)
        if len(chain) >= 2:
            chains.append(chain)
            used.update(chain)
    return chains


def replaced(entries: list, placed: dict, used: set) -> list:
    """entries with entries[k] replaced by placed[k] and the other indices in used left out."""
    if not placed:
        return entries
    return [placed.get(k, entry) for k, entry in enumerate(entries) if k not in used or k in placed]
