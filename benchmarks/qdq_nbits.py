"""qdq_nbits.py: all-MiniLM-L6-v2 through ONNX Runtime's MatMulNBitsQuantizer in QDQ format (blocked int4 DequantizeLinear before each MatMul) and in QOperator format (MatMulNBits nodes), in quantmatmul.onnx.InferenceSession fused / as written against ONNX Runtime: time per batch and the output's distance from ORT's.

Usage: python benchmarks/qdq_nbits.py THREADS ROUNDS [BATCH]
       e.g. python benchmarks/qdq_nbits.py 2 7 8

The model is quantmatmul.models.minilm's float graph without its final L2 normalization (its
ReduceL2 uses the `axes` attribute, which the opset 21 that the QDQ format needs no longer has);
4-bit, blocks of 32, asymmetric. Interleaved, ORT with its spinning off and the same thread count;
medians of ROUNDS.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

import numpy as np


def minilm_without_normalization():
    from quantmatmul.models import minilm

    model = minilm.onnx_model()
    keep = [n for n in model.graph.node if not n.name.startswith("normalize") and n.name != "sentence_embedding"]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    model.graph.output[0].name = "pooling/mean"
    return model


def main(threads: int, rounds: int, batch: int = 8) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    import quantmatmul
    import quantmatmul.onnx as qo
    from quantmatmul.models import minilm

    logging.getLogger().setLevel(logging.ERROR)
    quantmatmul.set_num_threads(threads)
    model = minilm_without_normalization()
    names = {i.name for i in model.graph.input}
    sentences = ["The quick brown fox jumps over the lazy dog, twice."] * batch
    feeds = {k: v for k, v in minilm.tokenize(sentences).items() if k in names}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    print(
        f"{quantmatmul.cpu_info()['features']['brand']}, {threads} threads, ONNX Runtime {ort.__version__}, {batch} x {feeds['input_ids'].shape[1]} tokens"
    )
    for fmt in ("QDQ", "QOperator"):
        copy = type(model).FromString(model.SerializeToString())  # the quantizer rewrites the model it is given
        quantizer = MatMulNBitsQuantizer(
            copy, block_size=32, is_symmetric=False, quant_format=getattr(QuantFormat, fmt)
        )
        quantizer.process()
        q = quantizer.model.model
        sessions = {
            "fused": qo.InferenceSession(q),
            "as written": qo.InferenceSession(q, fuse_qdq=False),
            "ONNX Runtime": ort.InferenceSession(q.SerializeToString(), options, providers=["CPUExecutionProvider"]),
        }
        times = {k: [] for k in sessions}
        outputs = {}
        for _ in range(rounds):
            for name, session in sessions.items():
                start = time.perf_counter()
                outputs[name] = session.run(None, feeds)[0]
                times[name].append(time.perf_counter() - start)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        theirs = outputs["ONNX Runtime"]
        scale = float(np.abs(theirs).max())
        distance = {k: float(np.abs(outputs[k] - theirs).max()) / scale for k in ("fused", "as written")}
        print(
            f"{fmt:9s}: fused {ms['fused']:6.1f} ms ({len(sessions['fused'].fused)} groups), as written "
            f"{ms['as written']:6.1f} ms, ONNX Runtime {ms['ONNX Runtime']:6.1f} ms; max |y - ORT| / max |ORT|: "
            f"fused {distance['fused']:.2g}, as written {distance['as written']:.2g}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
