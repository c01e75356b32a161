"""level0_decode.py: MatMulNBits level 0 decode (M = 1) against ONNX Runtime's level 0, and our level 4 beside it (issue 11: level 0 within 1.3x of our level 4), per kernel level and thread count.

Usage: python benchmarks/level0_decode.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/level0_decode.py avx512_vnni,avx2 2,1 15 results.json

4-bit codes, K = 4096, N = 4096 and 11008, blocks of 32 and 128, each at level 0 and level 4; a
3-bit and an 8-bit level-0 case (the layout's 4-bit and 8-bit storage). Every case interleaves
quantmatmul with ORT (level 0 and level 4) in one process.
"""

import sys

from levels import nbits_per_level

from quantmatmul import bench

C = bench.NBitsCase
CASES = [C(1, 4096, n, 4, bs, level) for n in (4096, 11008) for bs in (32, 128) for level in (0, 4)] + [
    C(1, 4096, 4096, 3, 32, 0),
    C(1, 4096, 4096, 8, 32, 0),
]


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    nbits_per_level(CASES, levels, threads, repeat, path)


if __name__ == "__main__":
    main(*sys.argv[1:5])
