"""benchmarks/gptq.py: times quantize_nbits(method="gptq") on one layer-sized weight, with the time of each phase (docs/benchmarks.md).

    python benchmarks/gptq.py [--K 4096] [--N 11008] [--bits 4] [--block-size 32] [--desc-act] [--no-act-order]

The weight is random normal, the Hessian X^T X / n of inputs with a few dominant directions; the
phases are timed by wrapping _gptq's functions: the "mse" scale search, the inverse-Hessian factor
and the sweep (whose own time includes the searches of dynamic groups, reported apart).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from quantmatmul import _gptq
from quantmatmul.quantize_nbits import quantize_nbits


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--K", type=int, default=4096)
    p.add_argument("--N", type=int, default=11008)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--desc-act", action="store_true")
    p.add_argument("--no-act-order", action="store_true")
    p.add_argument("--samples", type=int, default=2048)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    W = rng.standard_normal((a.K, a.N), dtype=np.float32)
    Z = rng.standard_normal((a.samples, 32), dtype=np.float32)
    X = Z @ rng.standard_normal((32, a.K), dtype=np.float32) + rng.standard_normal((a.samples, a.K), dtype=np.float32)
    H = (X.T @ X) / np.float32(a.samples)

    spent = {}

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    for name in ("_search", "inverse_cholesky_upper", "_sweep", "check_hessian"):
        setattr(_gptq, name, timed(name, getattr(_gptq, name)))
    t = time.perf_counter()
    quantize_nbits(
        W,
        bits=a.bits,
        block_size=a.block_size,
        method="gptq",
        hessian=H,
        desc_act=a.desc_act,
        act_order=not a.no_act_order,
    )
    total = time.perf_counter() - t
    print(
        f"gptq K={a.K} N={a.N} bits={a.bits} block_size={a.block_size} desc_act={a.desc_act} "
        f"act_order={not a.no_act_order}: {total:.2f} s"
    )
    for name, s in spent.items():
        print(f"  {name:24s} {s:7.2f} s")
    dynamic = a.desc_act or a.no_act_order
    print(f"  (sweep without the group searches: {spent['_sweep'] - (spent['_search'] if dynamic else 0):.2f} s)")


if __name__ == "__main__":
    main()
