"""levels.py: the QLinearMatMul benchmark per kernel level and thread count, for comparing tables on one machine.

Usage: python benchmarks/levels.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/levels.py avx512_vnni,amx 16,2 7 results.json
"""

import json
import sys

import quantmatmul as qm
from quantmatmul import bench


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    cases = [c for c in bench.CASES if not c.a.name.startswith("float8")]
    report = {}
    for t in (int(x) for x in threads.split(",")):
        for level in levels.split(","):
            qm.set_isa(level)
            print(f"== {level}, {t} threads: {qm.cpu_info()['kernels']}", flush=True)
            report[f"{level}/{t}"] = bench.run(
                cases, threads=t, repeat=int(repeat), progress=lambda s: print(s, flush=True)
            )
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
