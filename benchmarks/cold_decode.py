"""cold_decode.py: one-row MatMulNBits on weights that stream from memory (levels 0 and 4, ours and ORT's), per kernel level and thread count.

Usage: python benchmarks/cold_decode.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/cold_decode.py amx,avx512_vnni 16,2 9 results.json

Real decoding multiplies one row by each layer's weight in turn: the weights come from memory, not
from a cache that the previous call of the same weight filled. bench.run_cold_nbits cycles through
enough 4-bit weights ([4096, N], blocks of 32 and 128, N = 4096 and 11008) for their codes to
exceed COLD_MB megabytes (default 256: above a Xeon's last-level cache), REPEAT rounds in rotating
order; it reports GB/s of codes, so ratios between entries are time ratios.
"""

import math
import os
import sys

from levels import per_level

from quantmatmul import bench

SHAPES = [(4096, 32), (4096, 128), (11008, 128)]


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    megabytes = float(os.environ.get("COLD_MB", "256"))

    def run(t, progress):
        rows = []
        for n, block_size in SHAPES:
            count = math.ceil(megabytes * 1e6 / (4096 * n / 2))  # 4-bit codes
            rows.append(
                bench.run_cold_nbits(
                    threads=t, count=count, N=n, block_size=block_size, rounds=int(repeat), progress=progress
                )
            )
        return rows

    per_level(levels, threads, path, run)


if __name__ == "__main__":
    main(*sys.argv[1:5])
