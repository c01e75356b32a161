"""float_levels.py: issue 11's figures per kernel level and thread count: float8 QLinearMatMul against our u8s8, MatMulNBits levels 0, 3 and 4 against ONNX Runtime, in one run.

Usage: python benchmarks/float_levels.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/float_levels.py avx2,avx512_vnni,amx 16,2 7 results.json

Each level's line first says which entry each family runs and whether any native entry failed its
self-test (cpu_info()["self_test"]: on a CPU whose bfloat16 instructions add in another order than
the documented one, the pair tables drop out there and this says why). Then, per level and thread
count: the float8 e4m3 case and its u8s8 baseline (ratio = e4m3 time / u8s8 time; issue 11's target
1.5 on BF16/AMX hardware), and MatMulNBits 4-bit at M = 1 and 128 (level 0, 3 and 4; ratios against
ORT at the same accuracy level, and level 3 against our level 0, target >= 1.5 at M >= 128 on
BF16 hardware).
"""

import json
import sys

import quantmatmul as qm
from quantmatmul import bench
from quantmatmul.bench import E4M3, Case, NBitsCase

FLOAT8 = [Case(128, 4096, 4096), Case(128, 4096, 4096, E4M3, E4M3, E4M3, baseline="u8s8")]
NBITS = [
    NBitsCase(M, 4096, 4096, 4, block_size, level) for M in (1, 128) for block_size in (32, 128) for level in (0, 3, 4)
]


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    report = {}
    for t in (int(x) for x in threads.split(",")):
        for level in levels.split(","):
            qm.set_isa(level)
            info = qm.cpu_info()
            print(f"== {level}, {t} threads: {info['kernels']}, self-test: {info['self_test']}", flush=True)
            float8 = bench.run(FLOAT8, threads=t, repeat=int(repeat), progress=lambda s: None)
            times = {r["case"]: r["median_ms"]["quantmatmul"] for r in float8["results"]}
            e4m3, u8s8 = times[FLOAT8[1].name], times[FLOAT8[0].name]
            print(f"   e4m3 {e4m3:.2f} ms, u8s8 {u8s8:.2f} ms: {e4m3 / u8s8:.2f}x", flush=True)
            nbits = bench.run_nbits(NBITS, threads=t, repeat=int(repeat), progress=lambda s: None)
            ours = {}
            for r in nbits:
                m = r["median_ms"]
                ours[(r["M"], r["block_size"], r["level"])] = m["quantmatmul"]
                peer = m.get(f"onnxruntime level {r['level']}")
                vs = f", ORT level {r['level']} {peer:.3f} ms: {peer / m['quantmatmul']:.2f}x" if peer else ""
                print(f"   {r['case']}: {m['quantmatmul']:.3f} ms{vs}", flush=True)
            for (M, bs, lv), ms in sorted(ours.items()):
                if lv == 3:
                    print(f"   level 3 / level 0 speed, M={M} bs {bs}: {ours[(M, bs, 0)] / ms:.2f}x", flush=True)
            report[f"{level}/{t}"] = {"cpu_info": info, "float8": float8, "nbits": nbits}
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:5])
