"""transformer_shapes.py: QLinearMatMul and MatMulNBits at the shapes a small transformer runs (MiniLM / BERT: 64-256 tokens, hidden 384 or 768, MLP 4x), against ONNX Runtime and oneDNN, per kernel level and thread count.

Usage: python benchmarks/transformer_shapes.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/transformer_shapes.py avx512_vnni 2 15 results.json

Calls of tens to hundreds of microseconds, where a call's fixed costs (waking the helper threads,
preparing A, the epilogue) weigh as much as the kernel's rate: the issues' target shapes are large
(K = N = 4096), these are what a sentence encoder calls 36 times per batch (docs/models.md).
Constant weights (QLinearMatMul / MatMulNBits held once), u8 a x s8 b -> u8 per tensor; MatMulNBits
4-bit blocks of 32 at levels 4 and 0.
"""

import sys

from levels import per_level

from quantmatmul import bench
from quantmatmul.bench import Case, NBitsCase

SHAPES = [(64, 384, 384), (128, 384, 1536), (128, 1536, 384), (256, 384, 384), (256, 768, 3072), (256, 3072, 768)]
QLINEAR = [Case(M, K, N) for M, K, N in SHAPES]
NBITS = [NBitsCase(M, K, N, 4, 32, level) for level in (4, 0) for M, K, N in SHAPES]


def run(threads: int, repeat: int, progress) -> dict:
    return {
        "qlinear": bench.run(QLINEAR, threads=threads, repeat=repeat, progress=progress),
        "nbits": bench.run_nbits(NBITS, threads=threads, repeat=repeat, progress=progress),
    }


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    per_level(levels, threads, path, lambda t, progress: run(t, int(repeat), progress))


if __name__ == "__main__":
    main(*sys.argv[1:5])
