"""bench.py: `quantmatmul bench`: quantmatmul against ONNX Runtime and oneDNN (through torch) on identical inputs, interleaved in one process."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from . import _core
from ._runtime import cpu_info, get_num_threads, set_num_threads
from .qlinear import QLinearMatMul, qlinear_matmul

u8, s8, f32 = np.dtype(np.uint8), np.dtype(np.int8), np.float32
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def shape_label(M: int, K: int, N: int, batch: int = 1) -> str:
    """The shape part of a case's label, from the shape itself: "1024^3" for a cube, else "M=.. K=.. N=..";
    a batch of products first ("96 x M=16 K=32 N=16")."""
    shape = f"{M}^3" if M == K == N else f"M={M} K={K} N={N}"
    return shape if batch == 1 else f"{batch} x {shape}"


def _type_label(dtype) -> str:
    return "e4m3" if dtype == E4M3 else ("u8" if dtype == u8 else "s8")


@dataclass
class Case:
    M: int
    K: int
    N: int
    a: np.dtype = u8
    b: np.dtype = s8
    y: np.dtype = u8
    constant_b: bool = True
    baseline: str | None = None  # for combinations ORT lacks: the kind of the case (same shape) ours is compared with
    quick: tuple | None = None  # (M, K, N) for `bench --quick`; None: the same shape
    note: str = ""  # a word after the shape ("call": a tiny call, timed for the fixed overhead)
    batch: int = 1  # products per call, a [batch, M, K] x [batch, K, N] (attention's; b per call)

    @property
    def kind(self) -> str:
        """What is multiplied, without the shape: the operand types (and the output's when it differs
        from a's), then "inputs" when b is not a constant weight."""
        if self.a == self.b == self.y == E4M3:
            types = "e4m3"
        else:
            types = _type_label(self.a) + _type_label(self.b)
            if self.y != self.a:
                types += "->" + _type_label(self.y)
        return types + ("" if self.constant_b else " inputs")

    @property
    def name(self) -> str:
        """The label, derived from what runs: kind, shape, note."""
        return " ".join(
            part for part in (self.kind, shape_label(self.M, self.K, self.N, self.batch), self.note) if part
        )

    @property
    def baseline_name(self) -> str | None:
        """The label of the case ours is compared with: the baseline kind at this case's shape."""
        return None if self.baseline is None else f"{self.baseline} {shape_label(self.M, self.K, self.N, self.batch)}"

    def quick_case(self) -> Case:
        """This case at its --quick shape."""
        return (
            self if self.quick is None else dataclasses.replace(self, M=self.quick[0], K=self.quick[1], N=self.quick[2])
        )

    @property
    def ops(self) -> float:
        return 2.0 * self.batch * self.M * self.K * self.N


# The target shapes (docs/benchmarks.md): per-tensor u8 x s8 -> u8 with constant b, both
# operands as inputs, combinations ONNX Runtime lacks, and a tiny call for the fixed overhead. The
# combinations ORT lacks are compared with our u8s8 at the same shape, in the quick run too.
CASES = [
    Case(128, 4096, 4096, quick=(64, 1024, 1024)),
    Case(2048, 2048, 2048, quick=(512, 512, 512)),
    Case(1, 4096, 4096, quick=(1, 1024, 1024)),
    Case(1024, 1024, 1024, b=u8, constant_b=False, quick=(256, 256, 256)),
    Case(1024, 1024, 1024, quick=(256, 256, 256)),
    Case(1024, 1024, 1024, a=s8, b=u8, y=s8, baseline="u8s8", quick=(256, 256, 256)),
    Case(1024, 1024, 1024, a=E4M3, b=E4M3, y=E4M3, baseline="u8s8", quick=(256, 256, 256)),
    Case(128, 4096, 4096, a=E4M3, b=E4M3, y=E4M3, baseline="u8s8", quick=(64, 1024, 1024)),
    Case(1, 16, 16, constant_b=False, note="call"),
    # attention's products in a transformer (12 heads of 32, a batch of 8 sentences): scores q k^T at
    # 16 and 64 tokens, both operands per call
    Case(16, 32, 16, b=u8, constant_b=False, batch=96),
    Case(64, 32, 64, b=u8, constant_b=False, batch=96, quick=(16, 32, 16)),
]


@dataclass
class Result:
    case: str
    shape: tuple
    median_ms: dict = field(default_factory=dict)
    identical_to_onnxruntime: bool | None = None
    difference_explained: bool | None = None


def _inputs(case: Case, rng):
    def values(dtype, shape):
        if dtype == E4M3:
            return rng.normal(0, 2, shape).astype(E4M3)
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)

    zero = lambda dtype: np.zeros((), dtype)  # symmetric b: what oneDNN's qint8 weights need
    a_zp = zero(case.a) if case.a == E4M3 else np.array(128 if case.a == u8 else 0, case.a)
    y_zp = zero(case.y) if case.y == E4M3 else np.array(128 if case.y == u8 else 0, case.y)
    batch = () if case.batch == 1 else (case.batch,)
    a, b = values(case.a, batch + (case.M, case.K)), values(case.b, batch + (case.K, case.N))
    y_scale = f32(0.02 * 0.01 * 40 * np.sqrt(case.K) / 64)
    return a, f32(0.02), a_zp, b, f32(0.01), zero(case.b), y_scale, y_zp


def _quantmatmul_runner(case, args):
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    if case.constant_b:
        w = QLinearMatMul(b, b_s, b_z)
        return lambda: w(a, a_s, a_z, y_s, y_z)
    return lambda: qlinear_matmul(*args)


def _onnxruntime_runner(case, args, threads):
    try:
        from .peers import INPUTS, qlinear_model
        from .peers import session as ort_session
    except ImportError:
        return None
    try:
        # Interleaved timing: threads that spin after a run would steal the cores from whoever runs
        # next. quantmatmul's pool sleeps; ask the peers to do the same (docs/benchmarks.md).
        session = ort_session(qlinear_model(args, 21, b_constant=case.constant_b), threads=threads, spinning=False)
    except Exception:  # NOT_IMPLEMENTED: a type combination ORT does not run
        return None
    feeds = {n: np.asarray(x) for n, x in zip(INPUTS, args) if not (case.constant_b and n.startswith("b"))}
    return lambda: session.run(None, feeds)[0]


def _onednn_runner(case, args, threads):
    """torch.ops.quantized.linear on the onednn engine: u8 activations x s8 symmetric weights -> u8."""
    if not (case.a == u8 and case.b == s8 and case.y == u8 and case.constant_b):
        return None
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP: no spinning threads
    try:
        import torch
    except ImportError:
        return None
    if "onednn" not in torch.backends.quantized.supported_engines:
        return None
    torch.backends.quantized.engine = "onednn"
    torch.set_num_threads(threads)
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors; they are oneDNN's int8 API still
        warnings.simplefilter("ignore", UserWarning)
        x = torch._make_per_tensor_quantized_tensor(torch.from_numpy(a.copy()), float(a_s), int(a_z))
        w = torch._make_per_tensor_quantized_tensor(torch.from_numpy(np.ascontiguousarray(b.T)), float(b_s), 0)
        packed = torch.ops.quantized.linear_prepack(w, None)
    return lambda: torch.ops.quantized.linear(x, packed, float(y_s), int(y_z))


def run(cases=None, *, threads=None, repeat=15, quick=False, seed=0, progress=print) -> dict:
    """Times every case for each available competitor, interleaved round by round; medians in ms."""
    threads = threads or get_num_threads()
    set_num_threads(threads)
    rng = np.random.default_rng(seed)
    peak = _core.measure_peak_gops(0.5)
    results = []
    for case in cases or CASES:
        if quick:
            case = case.quick_case()
        args = _inputs(case, rng)
        runners = {
            "quantmatmul": _quantmatmul_runner(case, args),
            "onnxruntime": _onnxruntime_runner(case, args, threads),
            "onednn": _onednn_runner(case, args, threads),
        }
        runners = {k: v for k, v in runners.items() if v is not None}
        result = Result(case.name, (case.M, case.K, case.N))
        if "onnxruntime" in runners:
            ours, theirs = runners["quantmatmul"](), runners["onnxruntime"]()
            result.identical_to_onnxruntime = bool(np.array_equal(ours.view(np.uint8), theirs.view(np.uint8)))
            result.difference_explained = result.identical_to_onnxruntime or "UNEXPLAINED" not in _why_different(case)
        times = {name: [] for name in runners}
        small = case.batch * case.M * case.K * case.N < 1e6
        inner = 200 if small else 1  # tiny calls: time a batch of calls, report per call
        for fn in runners.values():  # warm up
            fn()
        for _ in range(repeat):
            for name, fn in runners.items():
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                times[name].append((time.perf_counter() - start) / inner)
        result.median_ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        results.append((case, result))
        progress(_format_row(case, result, peak, {c.name: r for c, r in results}))
    return {
        "cpu": cpu_info()["features"]["brand"],
        "isa": cpu_info()["isa"],
        "kernels": cpu_info()["kernels"],
        "threads": threads,
        "peak_gops": peak,
        "results": [
            dict(
                case=r.case,
                M=c.M,
                K=c.K,
                N=c.N,
                batch=c.batch,
                a=str(c.a),
                b=str(c.b),
                y=str(c.y),
                constant_b=c.constant_b,
                median_ms=r.median_ms,
                gops={k: c.ops / (v * 1e-3) / 1e9 for k, v in r.median_ms.items()},
                identical_to_onnxruntime=r.identical_to_onnxruntime,
                difference_explained=r.difference_explained,
                baseline=c.baseline_name,
            )
            for c, r in results
        ],
    }


def _format_row(case, result, peak, by_name):
    t = result.median_ms
    ours = t["quantmatmul"]
    gops = case.ops / (ours * 1e-3) / 1e9
    parts = [f"{case.name:<32} {ours:9.3f} ms {gops:7.1f} GOP/s {100 * gops / peak:5.1f}% peak"]
    for peer in ("onnxruntime", "onednn"):
        if peer in t:
            parts.append(f"{peer} {t[peer]:9.3f} ms (x{t[peer] / ours:.2f})")
    if case.baseline_name in by_name:
        base = by_name[case.baseline_name].median_ms["quantmatmul"]
        parts.append(f"{ours / base:.2f}x our {case.baseline_name}")
    if result.identical_to_onnxruntime is not None:
        parts.append("bit-identical" if result.identical_to_onnxruntime else "differs from ORT" + _why_different(case))
    return "  ".join(parts)


def _why_different(case) -> str:
    """The known reason ORT's bits differ, when it applies on this CPU."""
    from .peers import onnxruntime_u8s8_saturates

    if case.a == u8 and case.b == s8 and onnxruntime_u8s8_saturates():
        return " (its AVX2 u8s8 kernel saturates int16 pair sums on this CPU: onnxruntime#16105)"
    return " (UNEXPLAINED)"


# --------------------------------------------------------------------------------------------------
# MatMulNBits: constant weights, against ONNX Runtime's MatMulNBits at the same accuracy level and
# at level 4 (its fastest path).


@dataclass
class NBitsCase:
    M: int
    K: int
    N: int
    bits: int = 4
    block_size: int = 32
    level: int = 0

    @property
    def name(self) -> str:
        return f"{self.bits}-bit b{self.block_size} level {self.level} M={self.M} K={self.K} N={self.N}"


NBITS_CASES = (
    [
        NBitsCase(1, 4096, 4096, 4, 32, 0),
        NBitsCase(1, 4096, 4096, 4, 128, 0),
        NBitsCase(1, 4096, 11008, 4, 128, 0),
        NBitsCase(1, 4096, 4096, 4, 32, 4),
        NBitsCase(1, 4096, 4096, 4, 128, 4),
        NBitsCase(1, 4096, 4096, 8, 32, 4),
        NBitsCase(4, 4096, 4096, 4, 32, 4),
        NBitsCase(16, 4096, 4096, 4, 32, 4),
        NBitsCase(128, 4096, 4096, 4, 128, 0),
        NBitsCase(128, 4096, 4096, 4, 128, 4),
        NBitsCase(128, 4096, 4096, 4, 32, 4),
        NBitsCase(512, 4096, 4096, 4, 128, 0),
        NBitsCase(512, 4096, 4096, 4, 128, 4),
    ]
    + [NBitsCase(1, 4096, 4096, bits, 32, 0) for bits in (2, 3, 5, 6, 7, 8)]
    + [NBitsCase(128, 4096, 4096, bits, 32, 4) for bits in (2, 3, 5, 8)]
)
NBITS_QUICK = [
    NBitsCase(1, 1024, 1024, 4, 32, 0),
    NBitsCase(1, 1024, 1024, 4, 32, 4),
    NBitsCase(16, 512, 512, 3, 32, 0),
]


def run_nbits(cases=None, *, threads=None, repeat=15, quick=False, seed=0, progress=print) -> list:
    from .matmul_nbits import MatMulNBits
    from .quantize_nbits import quantize_nbits

    threads = threads or get_num_threads()
    set_num_threads(threads)
    rng = np.random.default_rng(seed)
    try:
        from .peers import matmul_nbits_model
        from .peers import session as ort_session
    except ImportError:
        ort_session = None
    rows = []
    for case in cases or (NBITS_QUICK if quick else NBITS_CASES):
        W = (rng.standard_normal((case.K, case.N)) * 0.02).astype(np.float32)
        q = quantize_nbits(W, bits=case.bits, block_size=case.block_size)
        A = rng.standard_normal((case.M, case.K)).astype(np.float32)
        ours = MatMulNBits(*q.tensors(), **q.attributes(), accuracy_level=case.level)
        runners = {"quantmatmul": lambda ours=ours, A=A: ours(A)}
        if ort_session is not None and case.bits in (2, 4, 8):
            for level in sorted({case.level, 4}):
                model = matmul_nbits_model(np.float32, *q.tensors(), **q.attributes(), accuracy_level=level)
                session = ort_session(model, threads=threads, spinning=False)
                runners[f"onnxruntime level {level}"] = lambda session=session, A=A: session.run(None, {"A": A})[0]
        for fn in runners.values():
            fn()
        times = {name: [] for name in runners}
        for _ in range(repeat):
            for name, fn in runners.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        weight_gb = q.B.nbytes / 1e9
        row = dict(
            case=case.name,
            M=case.M,
            K=case.K,
            N=case.N,
            bits=case.bits,
            block_size=case.block_size,
            level=case.level,
            median_ms=medians,
            weight_gbps=weight_gb / (medians["quantmatmul"] * 1e-3),
        )
        rows.append(row)
        parts = [f"{case.name:<40} {medians['quantmatmul']:8.3f} ms {row['weight_gbps']:6.1f} GB/s of codes"]
        parts += [
            f"{name} {t:8.3f} ms (x{t / medians['quantmatmul']:.2f})"
            for name, t in medians.items()
            if name != "quantmatmul"
        ]
        progress("  ".join(parts))
    return rows


@dataclass
class QuantizeCase:
    K: int
    N: int
    bits: int = 4
    block_size: int = 32

    @property
    def name(self) -> str:
        return f"quantize {self.bits}-bit b{self.block_size} K={self.K} N={self.N}"


QUANTIZE_CASES = [QuantizeCase(4096, 11008, 4, 32)]  # one LLaMA-7B MLP weight (issue 15's figure)
QUANTIZE_QUICK = [QuantizeCase(256, 512, 4, 32)]
QUANTIZE_METHODS = ("rtn", "mse", "hqq")


def _ort_block_quantizer(W, bits, block_size):
    """ONNX Runtime's weight quantizer as MatMulNBitsQuantizer's default algorithm runs it on a float32
    weight (DefaultWeightOnlyQuantizer.qbits_block_quant, QOperator format): K padded to whole blocks,
    the output buffers allocated, then the C++ quantize_matmul_{bits}bits (MLAS's MlasQuantizeBlockwise,
    on ONNX Runtime's own thread pool). None where ONNX Runtime is missing or lacks the width."""
    try:
        from onnxruntime.capi import _pybind_state as pybind
    except ImportError:
        return None
    fn = getattr(pybind, f"quantize_matmul_{bits}bits", None)
    if fn is None:
        return None
    K, N = W.shape
    k_blocks = -(-K // block_size)
    per_byte = 8 // bits

    def quantize():
        x = np.pad(W, ((0, k_blocks * block_size - K), (0, 0))) if k_blocks * block_size > K else W
        packed = np.zeros((N, k_blocks, block_size // per_byte), np.uint8)
        zero_points = np.zeros((N, -(-k_blocks // per_byte)), np.uint8)
        scales = np.zeros((N, k_blocks), W.dtype)
        fn(packed, np.ascontiguousarray(x), scales, zero_points, block_size, N, K, False)
        return packed, scales, zero_points

    return quantize


def run_quantize(cases=None, *, threads=None, repeat=5, quick=False, seed=0, progress=print) -> list:
    """quantize_nbits ("rtn", "mse", "hqq", asymmetric) against ONNX Runtime's quantizer
    (_ort_block_quantizer) on the same float32 weight, interleaved round by round; medians in ms,
    and whether "rtn" wrote ORT's bytes."""
    from .quantize_nbits import quantize_nbits

    threads = threads or get_num_threads()
    set_num_threads(threads)
    rng = np.random.default_rng(seed)
    rows = []
    for case in cases or (QUANTIZE_QUICK if quick else QUANTIZE_CASES):
        W = rng.standard_normal((case.K, case.N)).astype(np.float32)
        runners = {
            method: (
                lambda method=method, W=W, case=case: quantize_nbits(
                    W, bits=case.bits, block_size=case.block_size, method=method
                )
            )
            for method in QUANTIZE_METHODS
        }
        ort = _ort_block_quantizer(W, case.bits, case.block_size)
        if ort is not None:
            runners["onnxruntime"] = ort
        outputs = {name: fn() for name, fn in runners.items()}  # warm-up, and the bytes compared below
        times = {name: [] for name in runners}
        for _ in range(repeat):
            for name, fn in runners.items():
                times[name].append(_time(fn))
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        row = dict(
            case=case.name,
            K=case.K,
            N=case.N,
            bits=case.bits,
            block_size=case.block_size,
            threads=threads,
            median_ms=medians,
        )
        if ort is not None:
            w, (packed, scales, zero_points) = outputs["rtn"], outputs["onnxruntime"]
            row["rtn_identical_to_onnxruntime"] = bool(
                np.array_equal(w.B, packed)
                and np.array_equal(w.scales.view(np.uint8), scales.view(np.uint8))
                and np.array_equal(w.zero_points, zero_points)
            )
            row["time_over_onnxruntime"] = {m: medians[m] / medians["onnxruntime"] for m in QUANTIZE_METHODS}
        rows.append(row)
        parts = [f"{case.name:<34}"] + [f"{m} {medians[m]:8.1f} ms" for m in QUANTIZE_METHODS]
        if ort is not None:
            parts.append(f"onnxruntime {medians['onnxruntime']:8.1f} ms")
            parts.append("time / ORT's: " + ", ".join(f"{m} {r:.2f}x" for m, r in row["time_over_onnxruntime"].items()))
            parts.append("rtn " + ("bit-identical" if row["rtn_identical_to_onnxruntime"] else "DIFFERS FROM ORT"))
        progress("  ".join(parts))
    return rows


def memory_bandwidth_gbps(megabytes: int = 256, repeat: int = 5) -> float:
    """This machine's measured memory bandwidth: bytes read + written per second by a large copy (numpy)."""
    source = np.ones(megabytes * (1 << 20) // 4, np.float32)
    target = np.empty_like(source)
    best = min(_time(lambda: np.copyto(target, source)) for _ in range(repeat))
    return 2 * source.nbytes / best / 1e9


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_cold_nbits(
    *, threads=None, count=8, K=4096, N=4096, bits=4, block_size=32, levels=(0, 4), rounds=5, progress=print
) -> dict:
    """Cold weights, as in real decoding: `count` constant weights (together larger than the last-level
    cache) multiplied in turn by one row each, at each accuracy level in `levels`, ours and ORT's, in
    rounds that rotate their order; GB/s of packed codes read (each weight's codes once per sweep)."""
    from .matmul_nbits import MatMulNBits
    from .quantize_nbits import quantize_nbits

    threads = threads or get_num_threads()
    set_num_threads(threads)
    rng = np.random.default_rng(1)
    weights = [
        quantize_nbits((rng.standard_normal((K, N)) * 0.02).astype(np.float32), bits=bits, block_size=block_size)
        for _ in range(count)
    ]
    A = rng.standard_normal((1, K)).astype(np.float32)
    total_bytes = sum(q.B.nbytes for q in weights)
    sweeps = {}
    for level in levels:
        ours = [MatMulNBits(*q.tensors(), **q.attributes(), accuracy_level=level) for q in weights]
        sweeps[f"quantmatmul level {level}"] = lambda ours=ours: [w(A) for w in ours]
    try:
        from .peers import matmul_nbits_model
        from .peers import session as ort_session

        for level in levels:
            sessions = [
                ort_session(
                    matmul_nbits_model(np.float32, *q.tensors(), **q.attributes(), accuracy_level=level),
                    threads=threads,
                    spinning=False,
                )
                for q in weights
            ]
            sweeps[f"onnxruntime level {level}"] = lambda sessions=sessions: [s.run(None, {"A": A}) for s in sessions]
    except ImportError:
        pass
    for sweep in sweeps.values():
        sweep()
    times = {name: [] for name in sweeps}
    names = list(sweeps)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(_time(sweeps[name]))
    bandwidth = memory_bandwidth_gbps()
    result = {
        "weights": count,
        "total_mb": total_bytes / 1e6,
        "levels": list(levels),
        "memory_bandwidth_gbps": bandwidth,
        "gbps": {name: total_bytes / statistics.median(t) / 1e9 for name, t in times.items()},
    }
    progress(
        f"cold weights: {count} x {bits}-bit [{K}, {N}] b{block_size} ({result['total_mb']:.0f} MB of codes), M=1: "
        + ", ".join(f"{name} {g:.1f} GB/s" for name, g in result["gbps"].items())
        + f"; memory bandwidth (copy) {bandwidth:.1f} GB/s"
    )
    return result


PEERS = ("quantmatmul", "onnxruntime", "onednn")


def chart_data(report: dict) -> tuple[list, dict]:
    """What the chart shows: the labels of the cases large enough to chart, and GOP/s per case for
    each peer that ran at least one of them (a peer that is not installed is not listed)."""
    rows = [r for r in report["results"] if r["M"] * r["K"] * r["N"] >= 1e6]
    ran = [peer for peer in PEERS if any(peer in r["gops"] for r in rows)]
    return [r["case"] for r in rows], {peer: [r["gops"].get(peer, 0.0) for r in rows] for peer in ran}


def plot(report: dict, path: str):
    """A bar chart of chart_data(report) written to path (PNG, matplotlib's Agg backend); returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, series = chart_data(report)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, (peer, values) in enumerate(series.items()):
        ax.bar(np.arange(len(names)) + (i - (len(series) - 1) / 2) * width, values, width, label=peer)
    ax.axhline(report["peak_gops"], color="gray", linestyle="--", linewidth=1, label="measured kernel peak")
    ax.set_xticks(np.arange(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GOP/s (higher is better)")
    ax.set_title(f"QLinearMatMul, {report['threads']} threads, {report['cpu']} ({report['isa']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def main(args) -> int:
    progress = (lambda _line: None) if args.json == "-" else print
    if progress is print:
        info = cpu_info()
        print(
            f"CPU {info['features']['brand']}, level {info['isa']} (int8 GEMM {info['kernels']['qgemm']}, MatMulNBits "
            f"{info['kernels']['nbits']}, float8 {info['kernels']['float8']}), {args.threads or get_num_threads()} "
            "threads; ratios are peer time / quantmatmul time (above 1: quantmatmul is faster); peak: the int8 "
            "kernel in use on cache-resident data"
        )
    only = getattr(args, "only", None)
    report = {}
    if only in (None, "qlinear"):
        report = run(threads=args.threads, repeat=args.repeat, quick=args.quick, progress=progress)
    if only in (None, "nbits"):
        if progress is print:
            print("MatMulNBits (constant weights; ratios are ORT time / quantmatmul time)")
        report["matmul_nbits"] = run_nbits(
            threads=args.threads, repeat=args.repeat, quick=args.quick, progress=progress
        )
        report["matmul_nbits_cold"] = run_cold_nbits(
            threads=args.threads,
            count=2 if args.quick else 8,
            K=1024 if args.quick else 4096,
            N=1024 if args.quick else 4096,
            rounds=2 if args.quick else 9,
            progress=progress,
        )
    if only in (None, "quantize"):
        if progress is print:
            print("quantize_nbits (asymmetric) against ONNX Runtime's quantizer (its C++ quantize_matmul_<bits>bits)")
        report["quantize"] = run_quantize(
            threads=args.threads, repeat=min(args.repeat, 7), quick=args.quick, progress=progress
        )
    report.setdefault("cpu", cpu_info()["features"]["brand"])
    report.setdefault("threads", args.threads or get_num_threads())
    if args.json == "-":
        print(json.dumps(report, indent=1))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot and "results" in report:
        plot(report, args.plot)
    return 0
