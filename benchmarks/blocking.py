"""blocking.py: the QLinearMatMul driver's blocking (rows per task, bytes of packed b per task, k per kernel call, tasks per thread) compared in one process, per kernel level and thread count.

Usage: python benchmarks/blocking.py LEVELS THREADS REPEAT OUT.json [SETTINGS]
       e.g. python benchmarks/blocking.py amx 16,2 9 results.json
            python benchmarks/blocking.py avx512_vnni 2 15 r.json "task_rows=64;task_panel_bytes=262144,tasks_per_thread=1"

SETTINGS: blockings separated by ";", each "field=value,..." with the fields of
`_core.set_qgemm_blocking` (task_rows, task_panel_bytes, k_block, tasks_per_thread; 0 or absent: the
layout's default); the default blocking always runs first, as the baseline. Without SETTINGS, a grid
of one change at a time around the default (the knobs the ninth session varied by hand on the Xeon),
led by the default set explicitly (tasks_per_thread=16), whose ratio shows the noise: on Zen 4 at 2
threads identical blockings read 0.94-1.07 of each other over 7 rounds.

Each round runs every (case, blocking) pair once, in a shuffled order (a fixed seed), u8 a x
s8 b constant weight (QLinearMatMul, packed once) with ORT's numerics; medians over REPEAT rounds,
(each sample the mean of at least 5 ms of calls after warm calls), and the default's median
over each blocking's (above 1: faster than the default). The bits of every
blocking are checked against the default's. No peer runs here: this tunes our own driver.
"""

import json
import sys
import time

import numpy as np

import quantmatmul as qm
from quantmatmul import _core

SHAPES = [(128, 4096, 4096), (512, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024), (1, 4096, 4096)]
GRID = [
    dict(tasks_per_thread=16),  # the default again, set explicitly: the spread of identical runs
    dict(tasks_per_thread=1),
    dict(tasks_per_thread=4),
    dict(task_rows=128),
    dict(task_rows=16),
    dict(task_panel_bytes=256 << 10),
    dict(task_panel_bytes=2 << 20),
    dict(k_block=512),
    dict(k_block=4096),
    dict(tasks_per_thread=1, task_panel_bytes=256 << 10),
]


def parse(settings: str) -> list[dict]:
    out = []
    for item in filter(None, settings.split(";")):
        fields = dict(kv.split("=") for kv in item.split(","))
        out.append({k.strip(): int(v) for k, v in fields.items()})
    return out


def name(blocking: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in blocking.items()) or "default"


def run(threads: int, repeat: int, blockings: list[dict]) -> dict:
    qm.set_num_threads(threads)
    rng = np.random.default_rng(0)
    cases = []
    for M, K, N in SHAPES:
        b = rng.integers(-128, 128, (K, N), dtype=np.int8)
        a = rng.integers(0, 256, (M, K), dtype=np.uint8)
        weight = qm.QLinearMatMul(b, np.float32(0.01), np.int8(0))
        y_scale = np.float32(0.02 * 0.01 * np.sqrt(K) * 8)
        cases.append(
            ((M, K, N), lambda w=weight, a=a, y=y_scale: w(a, np.float32(0.02), np.uint8(128), y, np.uint8(128)))
        )
    settings = [{}] + blockings
    times = {(c, s): [] for c in range(len(cases)) for s in range(len(settings))}
    reference = {}
    pairs = [(c, s) for c in range(len(cases)) for s in range(len(settings))]
    order = np.random.default_rng(1)
    for _ in range(repeat):
        for i in order.permutation(len(pairs)):
            c, s = pairs[i]
            _core.set_qgemm_blocking(**settings[s])
            call = cases[c][1]
            # Warm for 2 calls and 2 ms at least (the first calls after another case's run out of
            # cache: one warm call left a 1x4096x4096 call 2.4x slower than the third), then time
            # calls for 5 ms at least and take their mean.
            start, calls = time.perf_counter(), 0
            while calls < 2 or time.perf_counter() - start < 0.002:
                y = call()
                calls += 1
            start, calls = time.perf_counter(), 0
            while calls < 1 or time.perf_counter() - start < 0.005:
                call()
                calls += 1
            times[(c, s)].append((time.perf_counter() - start) / calls)
            reference.setdefault(c, y)  # the first blocking to run this case
            assert np.array_equal(y, reference[c]), (cases[c][0], name(settings[s]))
    _core.set_qgemm_blocking()
    results = []
    for c, (shape, _) in enumerate(cases):
        base = float(np.median(times[(c, 0)]))
        line = []
        for s, blocking in enumerate(settings):
            ms = float(np.median(times[(c, s)])) * 1e3
            ratio = base * 1e3 / ms
            results.append({"shape": shape, "blocking": blocking, "median_ms": ms, "default_over_this": ratio})
            line.append(f"{name(blocking)} {ms:.3f} ms ({ratio:.2f})")
        print(f"{shape[0]}x{shape[1]}x{shape[2]}: " + "; ".join(line), flush=True)
    return {"defaults": _core.qgemm_blocking(), "results": results}


def main(levels: str, threads: str, repeat: str, path: str, settings: str = "") -> None:
    blockings = parse(settings) if settings else GRID
    report = {}
    for t in (int(x) for x in threads.split(",")):
        for level in levels.split(","):
            qm.set_isa(level)
            print(
                f"== {level}, {t} threads: {qm.cpu_info()['kernels']['qgemm']}, defaults {_core.qgemm_blocking()}",
                flush=True,
            )
            report[f"{level}/{t}"] = run(t, int(repeat), blockings)
    with open(path, "w") as f:
        json.dump({"cpu": qm.cpu_info()["features"]["brand"], "runs": report}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:6])
