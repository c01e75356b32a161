"""scaling.py: thread scaling (issues 10 and 11: 1 -> 2 -> 4 -> 8 -> 16 threads) of the main QLinearMatMul and MatMulNBits cases, beside the scaling of the kernel table's own peak and ONNX Runtime's.

Usage: python benchmarks/scaling.py LEVELS THREADS REPEAT OUT.json
       e.g. python benchmarks/scaling.py amx,avx512_vnni 1,2,4,8,16 7 results.json

For each kernel level and thread count (in the order given), the cases run through `quantmatmul.bench` (ours and ONNX
Runtime interleaved in one process, medians of REPEAT rounds), and the int8 table's peak
(`_core.measure_peak_gops`, all threads) is read once per count. The summary gives, per case, our
time at each count and the speedup over the first count, ONNX Runtime's speedup likewise, and the
peak's: a kernel that scales like its peak is limited by the machine (shared cores, memory), not by
the partition.
"""

import json
import sys

import quantmatmul as qm
from quantmatmul import bench
from quantmatmul.bench import E4M3, Case, NBitsCase

QLINEAR = [
    Case(128, 4096, 4096),
    Case(2048, 2048, 2048),
    Case(1, 4096, 4096),
    Case(1024, 1024, 1024, b=bench.u8, constant_b=False),
    Case(128, 4096, 4096, a=E4M3, b=E4M3, y=E4M3, baseline="u8s8"),
]
NBITS = [NBitsCase(M, 4096, 4096, 4, 32, level) for M, level in ((1, 4), (1, 0), (128, 4), (128, 0), (128, 3))]


def measure(threads: int, repeat: int) -> dict:
    """Our and ONNX Runtime's medians (ms) per case name, and the table's peak, at one thread count."""
    qlinear = bench.run(QLINEAR, threads=threads, repeat=repeat, progress=lambda s: None)
    times = {r["case"]: r["median_ms"] for r in qlinear["results"]}
    for row in bench.run_nbits(NBITS, threads=threads, repeat=repeat, progress=lambda s: None):
        times[row["case"]] = {
            "quantmatmul": row["median_ms"]["quantmatmul"],
            "onnxruntime": row["median_ms"].get(f"onnxruntime level {row['level']}"),
        }
    return {"peak_gops": qlinear["peak_gops"], "median_ms": times}


def summary(report: dict) -> list[str]:
    """One line per case: times per thread count, our speedup over the first count, ORT's."""
    counts = list(report)
    first = report[counts[0]]
    lines = ["peak: " + "  ".join(f"{t}t {report[t]['peak_gops']:.0f} GOP/s" for t in counts)]
    lines.append(
        "peak speedup: " + "  ".join(f"{t}t {report[t]['peak_gops'] / first['peak_gops']:.2f}x" for t in counts)
    )

    def speedups(case, peer):
        base = first["median_ms"][case].get(peer)
        if not base:
            return ""
        return " ".join(f"{base / report[t]['median_ms'][case][peer]:.2f}" for t in counts)

    for case in first["median_ms"]:
        ours = " ".join(f"{report[t]['median_ms'][case]['quantmatmul']:.3f}" for t in counts)
        lines.append(
            f"{case:<40} ms {ours}  speedup {speedups(case, 'quantmatmul')}  ORT {speedups(case, 'onnxruntime')}"
        )
    return lines


def main(levels: str, threads: str, repeat: str, path: str) -> None:
    out = {"cpu": qm.cpu_info()["features"]["brand"], "by_level": {}}
    for level in levels.split(","):
        qm.set_isa(level)
        print(f"== {level}: {qm.cpu_info()['kernels']}", flush=True)
        report = {t: measure(t, int(repeat)) for t in (int(x) for x in threads.split(","))}
        for line in summary(report):
            print(line, flush=True)
        out["by_level"][level] = report
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
