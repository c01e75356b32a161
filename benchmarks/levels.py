"""levels.py: the QLinearMatMul benchmark per kernel level and thread count, for comparing tables on one machine.

Usage: python benchmarks/levels.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/levels.py avx512_vnni,amx 16,2 7 results.json
"""

import json
import sys

import quantmatmul as qm
from quantmatmul import bench


def per_level(levels: str, threads: str, path: str, run) -> None:
    """run(threads, progress) for each thread count and kernel level ("16,2", "avx2,amx"), the
    reports written to path as JSON, keyed "level/threads". Shared by the per-level scripts."""
    report = {}
    for t in (int(x) for x in threads.split(",")):
        for level in levels.split(","):
            qm.set_isa(level)
            print(f"== {level}, {t} threads: {qm.cpu_info()['kernels']}", flush=True)
            report[f"{level}/{t}"] = run(t, lambda s: print(s, flush=True))
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def nbits_per_level(cases, levels: str, threads: str, repeat: str, path: str) -> None:
    """bench.run_nbits(cases) for each thread count and kernel level: the MatMulNBits scripts' main."""
    per_level(
        levels,
        threads,
        path,
        lambda t, progress: bench.run_nbits(cases, threads=t, repeat=int(repeat), progress=progress),
    )


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    cases = [c for c in bench.CASES if not c.a.name.startswith("float8")]
    per_level(
        levels, threads, path, lambda t, progress: bench.run(cases, threads=t, repeat=int(repeat), progress=progress)
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
