"""cnn.py: a ResNet-18-shaped CNN quantized by ONNX Runtime's quantize_static (QDQ and QOperator, uint8 / int8 activations) run in quantmatmul.onnx.InferenceSession against ONNX Runtime: time per image and the logits' agreement.

Usage: python benchmarks/cnn.py THREADS ROUNDS [SIZE] [MODEL]
       e.g. python benchmarks/cnn.py 2 7 224 mobilenet_v2     (MODEL: resnet18, the default, or mobilenet_v2)

The float model is ResNet-18's topology (a 7x7 stride-2 stem, max pooling, four stages of two basic
blocks with 64-512 channels and 1x1 stride-2 shortcuts, global average pooling, a 1000-way Gemm; no
batch normalization: it folds into the convolutions) with random weights (He initialization),
calibrated on four random images. Both runtimes run the same model file on the same image,
interleaved, ORT with its spinning off and the same thread count; medians of ROUNDS.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    """A float CNN under construction: He-initialized convolutions (with bias, optional ReLU) appended in order,
    finished by global average pooling and a 1000-way Gemm."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.inits, self.nodes = [], []

    def conv(self, x, cin, cout, k, stride, name, group=1, relu=True):
        fan_in = cin // group * k * k
        w = (self.rng.normal(size=(cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (self.rng.normal(size=cout) * 0.05).astype(np.float32)
        self.inits.extend([numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")])
        attrs = dict(pads=[k // 2] * 4, strides=[stride] * 2, **({"group": group} if group > 1 else {}))
        self.nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], name=name, **attrs))
        if not relu:
            return f"{name}_c"
        self.nodes.append(helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"]))
        return f"{name}_r"

    def model(self, x, channels: int, name: str, size: int) -> onnx.ModelProto:
        fc = (self.rng.normal(size=(channels, 1000)) * np.sqrt(1.0 / channels)).astype(np.float32)
        self.inits += [numpy_helper.from_array(fc, "fc_w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
        self.nodes += [
            helper.make_node("GlobalAveragePool", [x], ["gap"]),
            helper.make_node("Flatten", ["gap"], ["flat"]),
            helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
        ]
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def resnet18(size: int, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    x = g.conv("x", 3, 64, 7, 2, "stem")
    g.nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"s{stage}b{block}"
            h = g.conv(x, cin, cout, 3, stride, f"{name}_1")
            h = g.conv(h, cout, cout, 3, 1, f"{name}_2", relu=False)
            shortcut = g.conv(x, cin, cout, 1, stride, f"{name}_down", relu=False) if stride != 1 or cin != cout else x
            g.nodes.append(helper.make_node("Add", [h, shortcut], [f"{name}_sum"]))
            g.nodes.append(helper.make_node("Relu", [f"{name}_sum"], [f"{name}_out"]))
            x, cin = f"{name}_out", cout
    return g.model(x, cin, "resnet18", size)


def mobilenet_v2(size: int, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2's topology (a 3x3 stride-2 stem of 32 channels, 17 inverted residual blocks: a 1x1
    expansion by 6 (none in the first), a 3x3 depthwise convolution, a 1x1 projection, the residual Add
    where the stride is 1 and the channels stay; a 1x1 convolution to 1280, global average pooling and a
    1000-way Gemm), ReLU for ReLU6, no batch normalization, random weights (He initialization)."""
    g = _Graph(seed)
    x, cin = g.conv("x", 3, 32, 3, 2, "stem"), 32
    settings = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]
    for i, (t, c, n, s) in enumerate(settings):
        for j in range(n):
            stride, name, hidden = (s if j == 0 else 1), f"b{i}_{j}", cin * t
            h = g.conv(x, cin, hidden, 1, 1, f"{name}_expand") if t != 1 else x
            h = g.conv(h, hidden, hidden, 3, stride, f"{name}_dw", group=hidden)
            h = g.conv(h, hidden, c, 1, 1, f"{name}_project", relu=False)
            if stride == 1 and cin == c:
                g.nodes.append(helper.make_node("Add", [h, x], [f"{name}_sum"]))
                h = f"{name}_sum"
            x, cin = h, c
    return g.model(g.conv(x, cin, 1280, 1, 1, "head"), 1280, "mobilenet_v2", size)


MODELS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}


def quantized(model: onnx.ModelProto, folder: Path, fmt: str, activations: str) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(1)

    class Images:
        def __init__(self):
            self.batches = iter([{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    src, dst = folder / "float.onnx", folder / f"{fmt}_{activations}.onnx"
    onnx.save(model, src)
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(
        src,
        dst,
        Images(),
        quant_format=getattr(QuantFormat, fmt),
        activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return onnx.load(dst)


def main(threads: int, rounds: int, size: int = 224, name: str = "resnet18") -> None:
    import onnxruntime as ort

    import quantmatmul
    import quantmatmul.onnx as qo

    quantmatmul.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    image = {"x": np.random.default_rng(2).normal(size=(1, 3, size, size)).astype(np.float32)}
    print(
        f"{name}: {quantmatmul.cpu_info()['features']['brand']}, {threads} threads, ONNX Runtime {ort.__version__}, "
        f"{size}x{size}"
    )
    with tempfile.TemporaryDirectory() as folder:
        model = MODELS[name](size)
        for fmt in ("QDQ", "QOperator"):
            for activations in ("uint8", "int8"):
                q = quantized(model, Path(folder), fmt, activations)
                ours = qo.InferenceSession(q)
                theirs = ort.InferenceSession(q.SerializeToString(), options, providers=["CPUExecutionProvider"])
                times = {"quantmatmul": [], "onnxruntime": []}
                for _ in range(rounds):
                    for name, run in (("quantmatmul", ours.run), ("onnxruntime", theirs.run)):
                        start = time.perf_counter()
                        y = run(None, image)[0]
                        times[name].append(time.perf_counter() - start)
                        if name == "quantmatmul":
                            y_ours = y
                        else:
                            y_theirs = y
                scale = float(np.abs(y_theirs).max())
                diff = float(np.abs(y_ours - y_theirs).max())
                same = int(np.count_nonzero(y_ours == y_theirs))
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                print(
                    f"{fmt:9s} {activations:5s}: quantmatmul {med['quantmatmul']:7.1f} ms, ONNX Runtime "
                    f"{med['onnxruntime']:6.1f} ms ({med['onnxruntime'] / med['quantmatmul']:.2f}x); logits "
                    f"identical {same}/{y_ours.size}, max |diff| {diff:.3g} (max |logit| {scale:.3g})"
                )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]), *sys.argv[4:5])
