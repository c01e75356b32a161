"""level4_decode.py: MatMulNBits level 4 against ONNX Runtime's level 4 on decode and small-batch shapes (M = 1-12, small K and N) and M = 128, per kernel level and thread count.

Usage: python benchmarks/level4_decode.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/level4_decode.py avx2,avx512_vnni,amx 16,2 15 results.json

The held weight (MatMulNBits) reads its packed form ("quads x16") where the level's kernels have one.
"""

import sys

from levels import nbits_per_level

from quantmatmul import bench

C = bench.NBitsCase
CASES = [
    C(1, 4096, 4096, 4, 32, 4),
    C(1, 4096, 4096, 4, 128, 4),
    C(1, 4096, 11008, 4, 128, 4),
    C(1, 4096, 4096, 8, 32, 4),
    C(1, 4096, 4096, 2, 32, 4),
    C(4, 4096, 4096, 4, 32, 4),
    C(4, 4096, 4096, 4, 128, 4),
    C(8, 4096, 4096, 4, 32, 4),
    C(12, 4096, 4096, 4, 32, 4),
    C(1, 384, 384, 4, 32, 4),
    C(1, 1024, 1024, 4, 32, 4),
    C(1, 2048, 2048, 4, 32, 4),
    C(128, 4096, 4096, 4, 32, 4),
    C(128, 4096, 4096, 4, 128, 4),
    C(128, 4096, 4096, 8, 32, 4),
]


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    nbits_per_level(CASES, levels, threads, repeat, path)


if __name__ == "__main__":
    main(*sys.argv[1:5])
