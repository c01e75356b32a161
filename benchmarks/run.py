"""run.py: the long benchmark run behind docs/benchmarks.md: `make bench` (or python benchmarks/run.py [--threads N])."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform

import quantmatmul
from quantmatmul import bench

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[quantmatmul.get_num_threads()])
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args()
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    for threads in args.threads:
        print(f"--- {threads} thread(s)")
        report = bench.run(threads=threads, repeat=args.repeat)
        print("MatMulNBits (constant weights; ratios are ORT time / quantmatmul time)")
        report["matmul_nbits"] = bench.run_nbits(threads=threads, repeat=args.repeat)
        report["matmul_nbits_cold"] = bench.run_cold_nbits(threads=threads)
        print("quantize_nbits against ONNX Runtime's quantizer")
        report["quantize"] = bench.run_quantize(threads=threads, repeat=min(args.repeat, 7))
        report["machine"] = {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        }
        stem = f"qlinear_{report['isa']}_{threads}t"
        (results / f"{stem}.json").write_text(json.dumps(report, indent=1))
        try:
            bench.plot(report, str(results / f"{stem}.png"))
        except ImportError:
            print("(matplotlib not installed: no plot)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
