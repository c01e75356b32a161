"""fuzz.py: differential fuzzing of QLinearMatMul and MatMulNBits on every kernel table this machine runs (native and emulated) at several thread counts, against the numpy oracles (`make fuzz`).

Usage: python tests/fuzz.py [--minutes M] [--seed S] [--cases C]
       [--family qlinear|float8|nbits|matmul_integer|depthwise|all]
       [--threads 1,2,3,16]

Case i of a run is drawn from seed S + i alone (operand types, shapes, parameters, views, level),
so `--seed S+i --cases 1` reruns it. Each case checks, on every table (and, for MatMulNBits, the
bf16 entries with AVX512-BF16 / AMX-BF16 hidden as well):
  - QLinearMatMul: the function and a held QLinearMatMul (built under another table) bit for bit
    against the oracle of the chosen numerics, on 1 thread and another count; with a float8
    operand or output (small shapes: a scalar oracle), against the float path in the table's order
    (which rarely shows through an 8-bit output: tests/test_float8_pairs.py checks the sums);
  - MatMulNBits: within the documented error bound (oracle.error_bound) where no float32 step
    overflows; the same bits on every thread count; a held MatMulNBits (built under another table)
    equal to the function bit for bit but for a NaN's sign; level 0 equal to level 1;
  - MatMulInteger (quantmatmul.onnx's): the exact int32 sums, B per call and packed once;
  - depthwise QLinearConv (quantmatmul.onnx's): the exact numerics against the spec's sums rounded once,
    the others against the portable table's bits;
  - no input modified.
Failures print the seed and what differed; the exit status is 1 if any case failed. The fourteenth
session's campaign of this kind (about 480,000 cases) found a held MatMulNBits keeping the caller's
bias, a set_isa race and an error bound without an underflow term.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback

import ml_dtypes
import numpy as np

import quantmatmul as qm
from quantmatmul import _core
from quantmatmul.reference import matmul_nbits as nbits_oracle
from quantmatmul.reference import qlinear_matmul as qlinear_oracle

u8, s8, f32 = np.uint8, np.int8, np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
# Every table: (level, features hidden); those this machine cannot run are dropped at start.
TABLES = [
    ("portable", ()),
    ("avx2", ()),
    ("avx512_vnni", ()),
    ("avx512_vnni", ("avx512_bf16",)),
    ("amx", ()),
    ("amx", ("amx_bf16",)),
    ("avx512_vnni-emulated", ()),
    ("avx512_vnni-emulated", ("avx512_bf16",)),
    ("amx-emulated", ()),
    ("amx-emulated", ("amx_bf16",)),
]
NUMERICS = {
    "onnxruntime": qlinear_oracle.onnxruntime,
    "onnx-reference": qlinear_oracle.onnx_reference,
    "exact": qlinear_oracle.exact,
}


@contextlib.contextmanager
def table(level, hidden=(), threads=None):
    """Runs the body under one table (and thread count), restoring the settings after it."""
    isa, count = qm.cpu_info()["isa"], qm.get_num_threads()
    try:
        qm.set_isa(level)
        _core.hide_features(list(hidden))
        if threads:
            qm.set_num_threads(threads)
        yield
    finally:
        _core.hide_features([])
        qm.set_isa(isa)
        qm.set_num_threads(count)


def runnable_tables():
    here = set(qm.available_isas() + qm.emulated_isas())
    return [(level, hidden) for level, hidden in TABLES if level in here]


def _view(rng, x):
    """x as given, Fortran-ordered, or a strided view of the same values."""
    mode = rng.integers(0, 4)
    if x.ndim == 0 or mode < 2:
        return x
    if mode == 2:
        return np.asfortranarray(x)
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1] + 1,), x.dtype)
    wide[..., 1::2] = x
    return wide[..., 1::2]


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    if rng.random() < 0.2:  # extremes
        return rng.choice(np.array([info.min, info.max, 0, info.min + 1, info.max - 1], dtype), size=shape)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _size(rng, edges, top):
    return int(rng.choice(edges)) if rng.random() < 0.5 else int(rng.integers(1, top))


def qlinear_case(seed, tables, threads):
    """One QLinearMatMul case; returns what failed (empty: nothing)."""
    rng = np.random.default_rng(seed)
    M = _size(rng, [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 128, 129], 40)
    K = _size(rng, [1, 3, 4, 5, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1024, 2049], 300)
    N = _size(rng, [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257], 80)
    while M * K * N > 2_000_000:
        M, N = max(1, M // 2), max(1, N // 2)
    a_t, b_t, y_t = (rng.choice([u8, s8]) for _ in range(3))
    batch = () if rng.random() < 0.7 else (int(rng.integers(1, 4)),)
    a, b = _ints(rng, a_t, batch + (M, K)), _ints(rng, b_t, (K, N))
    per_column = rng.random() < 0.4
    b_shape = (1, N) if per_column else ()
    a_scale = f32(rng.uniform(1e-3, 0.1))
    b_scale = rng.uniform(1e-3, 0.1, b_shape).astype(f32)
    y_scale = f32(rng.uniform(0.05, 50.0) * a_scale * np.max(b_scale) * np.sqrt(K))
    a_zp, y_zp = _ints(rng, a_t, ()), _ints(rng, y_t, ())
    b_zp = _ints(rng, b_t, b_shape)
    numerics = str(rng.choice(list(NUMERICS)))
    expected = NUMERICS[numerics](a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    expected = expected.astype(y_t) if expected.dtype != y_t else expected
    inputs = [a, b, b_scale, b_zp]
    copies = [x.copy() for x in inputs]
    what = f"qlinear seed {seed}: {a_t.__name__}x{b_t.__name__}->{y_t.__name__} {batch}+{M}x{K}x{N} {numerics}"
    fails = []
    built = tables[rng.integers(0, len(tables))]
    own = [b.copy(), b_scale.copy(), b_zp.copy()]
    with table(*built):
        held = qm.QLinearMatMul(_view(rng, own[0]), own[1], own[2])
    for x in own:  # the caller's arrays change after construction: the held weight must not
        x[...] = _ints(rng, x.dtype, x.shape) if x.dtype.kind in "iu" else -x
    for level, hidden in tables:
        for t in (1, int(rng.choice(threads))):
            with table(level, hidden, t):
                got = qm.qlinear_matmul(
                    _view(rng, a), a_scale, a_zp, _view(rng, b), b_scale, b_zp, y_scale, y_zp, numerics=numerics
                )
                got_held = held(_view(rng, a), a_scale, a_zp, y_scale, y_zp, numerics=numerics)
            for name, y in (("function", got), (f"held (built on {built[0]})", got_held)):
                if y.dtype != expected.dtype or not np.array_equal(y, expected):
                    fails.append(f"{what}: {name} on {level}{hidden} at {t} threads differs from the oracle")
    fails += [f"{what}: input {i} modified" for i, (x, c) in enumerate(zip(inputs, copies)) if not np.array_equal(x, c)]
    return fails


def matmul_integer_case(seed, tables, threads):
    """One MatMulInteger case (quantmatmul.onnx's, on the int8 kernels): the exact int32 sums on every
    table and thread count, B given per call and packed once."""
    from quantmatmul.onnx._session import _integer_operand, _matmul_integer

    rng = np.random.default_rng(seed)
    M = _size(rng, [1, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65], 40)
    K = _size(rng, [1, 3, 4, 5, 63, 64, 65, 255, 256, 257, 1000], 300)
    N = _size(rng, [1, 15, 16, 17, 31, 32, 33, 63, 64, 65], 80)
    a_t, b_t = np.dtype(rng.choice([u8, s8])), np.dtype(rng.choice([u8, s8]))
    batch = () if rng.random() < 0.7 else (int(rng.integers(1, 4)),)
    a, b = _ints(rng, a_t, batch + (M, K)), _ints(rng, b_t, (K, N))
    a_zp = _ints(rng, a_t, (M,) if rng.random() < 0.5 and not batch else ())
    b_zp = _ints(rng, b_t, (N,) if rng.random() < 0.5 else ())
    a_full = a_zp.reshape(-1, 1) if a_zp.ndim else a_zp
    exact = np.matmul(a.astype(np.int64) - a_full.astype(np.int64), b.astype(np.int64) - b_zp.astype(np.int64))
    expected = ((exact + 2**31) % 2**32 - 2**31).astype(np.int32)
    what = f"matmul_integer seed {seed}: {a_t.name}x{b_t.name} {batch}+{M}x{K}x{N}"
    fails = []
    for level, hidden in tables:
        for t in (1, int(rng.choice(threads))):
            with table(level, hidden, t):
                a_op = _integer_operand("a", _view(rng, a), a_zp, "MatMulInteger")
                for packed in (False, True):
                    b_op = _integer_operand("b", _view(rng, b), b_zp, "MatMulInteger", pack=packed)
                    if not np.array_equal(_matmul_integer(a_op, b_op), expected):
                        fails.append(f"{what}: {'packed b' if packed else 'b'} on {level}{hidden} at {t} threads")
    return fails


def depthwise_case(seed, tables, threads):
    """One depthwise QLinearConv (1- or 2-D, every 8-bit type combination, a weight scale and zero point per
    tensor or per channel, with or without a bias, x in C order or channels-last memory) in one of the three
    numerics on every table and thread count: the exact numerics against tests/test_onnx_qconv.py's oracles
    (the spec's sums, plus the bias wrapped to int32, rounded once), the others against the portable table's
    bits (that file checks those against ONNX Runtime and onnx.reference)."""
    from quantmatmul.onnx._qconv import qlinear_conv

    rng = np.random.default_rng(seed)
    nd = int(rng.choice([1, 2, 2, 2]))
    C = _size(rng, [1, 7, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 144], 200)
    kernel = [int(rng.choice([1, 2, 3, 3, 3, 5, 7, 9])) for _ in range(nd)]
    dilations = [int(rng.choice([1, 1, 2, 3])) for _ in range(nd)]
    strides = [int(rng.choice([1, 1, 2, 3])) for _ in range(nd)]
    pads = [int(rng.integers(0, k + 1)) for k in kernel * 2]
    spatial = [int(rng.integers(max(1, (k - 1) * d + 1 - 2 * k), (k - 1) * d + 14)) for k, d in zip(kernel, dilations)]
    if any(s + pads[i] + pads[nd + i] < (k - 1) * d + 1 for i, (s, k, d) in enumerate(zip(spatial, kernel, dilations))):
        pads = [k for k in kernel * 2]  # (an output of at least one position)
    x_t, w_t, y_t = (np.dtype(rng.choice([u8, s8])) for _ in range(3))
    N = int(rng.integers(1, 4))
    x = _ints(rng, x_t, (N, C, *spatial))
    if rng.random() < 0.5:  # channels-last memory, as the session passes activations
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1)).transpose(0, nd + 1, *range(1, nd + 1))
    w = _ints(rng, w_t, (C, 1, *kernel))
    per_channel = rng.random() < 0.5
    xz, yz = _ints(rng, x_t, ()), _ints(rng, y_t, ())
    wz = _ints(rng, w_t, (C,) if per_channel else ())
    xs, ys = f32(rng.uniform(0.001, 0.05)), f32(rng.uniform(0.01, 2.0))
    ws = rng.uniform(0.001, 0.05, (C,) if per_channel else ()).astype(f32)
    B = rng.integers(-(2**31), 2**31, C).astype(np.int32) if rng.random() < 0.2 else None
    if B is None and rng.random() < 0.6:
        B = rng.integers(-30000, 30000, C).astype(np.int32)
    numerics = str(rng.choice(list(NUMERICS)))
    args = (x, xs, xz, w, ws, wz, ys, yz, B)
    attrs = {"group": C, "kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations}
    what = f"depthwise seed {seed}: {x_t.name}/{w_t.name}/{y_t.name} N{N} C{C} {spatial} k{kernel} s{strides} d{dilations} p{pads} {numerics}"
    if numerics == "exact":  # (the conv tests' oracles, written from the spec)
        from test_onnx_qconv import exact_output, oracle_sums

        sums = oracle_sums(x, xz, w, wz, group=C, strides=strides, pads=pads, dilations=dilations)
        want = exact_output(sums, B, xs, ws, ys, yz)
    else:
        with table("portable"):
            want = qlinear_conv(*args, **attrs, numerics=numerics)
    fails = []
    for level, hidden in tables:
        for t in (1, int(rng.choice(threads))):
            with table(level, hidden, t):
                got = qlinear_conv(*args, **attrs, numerics=numerics)
            if not np.array_equal(got, want):
                fails.append(f"{what}: {level}{hidden} at {t} threads")
    return fails


FLOAT8 = [
    np.dtype(t)
    for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)
]


def float8_case(seed, tables, threads):
    """One QLinearMatMul case on the float path (a float8 operand or output): each table's result
    bit for bit against the scalar oracle in that table's order (its pair table's, where it has one
    and every value is pair-exact), on 1 thread and another count, function and held."""
    rng = np.random.default_rng(seed)
    M, K, N = (
        int(rng.integers(1, 10)),
        int(rng.choice([1, 2, 3, 16, 31, 32, 33, 64, 65, 150])),
        int(rng.integers(1, 20)),
    )
    kinds = [FLOAT8[rng.integers(0, 4)] if rng.random() < 0.6 else np.dtype(rng.choice([u8, s8])) for _ in range(3)]
    if not any(t in FLOAT8 for t in kinds):
        kinds[int(rng.integers(0, 3))] = FLOAT8[rng.integers(0, 4)]
    a_t, b_t, y_t = kinds

    def operand(t, shape):
        if t in FLOAT8:  # over many binades, so that the order of the float32 sums shows
            top = float(ml_dtypes.finfo(t).max)
            return np.clip(rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 7, shape), -top, top).astype(t)
        return _ints(rng, t, shape)

    a, b = operand(a_t, (M, K)), operand(b_t, (K, N))
    a_scale, b_scale = f32(rng.uniform(0.01, 0.5)), rng.uniform(0.1, 0.9, N).astype(f32)
    a_zp = np.zeros((), a_t) if a_t in FLOAT8 else _ints(rng, a_t, ())
    b_zp = np.zeros(N, b_t) if b_t in FLOAT8 else _ints(rng, b_t, (N,))
    y_scale, y_zp = f32(rng.uniform(0.01, 2.0)), np.zeros((), y_t)
    maximum = float(ml_dtypes.finfo(y_t).max) if y_t in FLOAT8 else None
    args = (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    what = f"float8 seed {seed}: {a_t.name}x{b_t.name}->{y_t.name} {M}x{K}x{N}"
    expected = {}  # by pair order
    fails = []
    built = tables[rng.integers(0, len(tables))]
    with table(*built):
        held = qm.QLinearMatMul(b, b_scale, b_zp)
    for level, hidden in tables:
        for t in (1, int(rng.choice(threads))):
            with table(level, hidden, t):
                order = _core.float8_pair_order()
                got, got_held = qm.qlinear_matmul(*args), held(a, a_scale, a_zp, y_scale, y_zp)
            if order not in expected:
                expected[order] = qlinear_oracle.float8_path(
                    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, float8_max=maximum, pair_order=order
                )
            for name, y in (("function", got), (f"held (built on {built[0]})", got_held)):
                if not np.array_equal(y.view(np.uint8), expected[order].view(np.uint8)):
                    fails.append(
                        f"{what}: {name} on {level}{hidden} at {t} threads differs from the oracle (order {order})"
                    )
    return fails


def nbits_case(seed, tables, threads):
    """One MatMulNBits case; returns what failed (empty: nothing)."""
    rng = np.random.default_rng(seed)
    bits = int(rng.integers(2, 9))
    bs = int(rng.choice([16, 32, 64, 128, 256]))
    K = int(rng.choice([bs * int(rng.integers(1, 5)), int(rng.integers(1, 3 * bs)), 1000, 1024, 2049]))
    N = _size(rng, [1, 15, 16, 17, 31, 32, 33, 63, 65, 255, 257], 80)
    M = _size(rng, [1, 2, 3, 4, 8, 9, 12, 13, 16, 31, 32, 33, 64, 129], 40)
    while M * K * N > 1_500_000:
        M, N = max(1, M // 2), max(1, N // 2)
    dtype = np.dtype(rng.choice([f32, f32, f32, np.float16, BF16]))
    level = int(rng.integers(0, 5))
    kb = -(-K // bs)
    B = rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=np.uint8)
    scales = (rng.standard_normal((N, kb)) * rng.choice([0.01, 1.0])).astype(dtype)
    zp_form = rng.integers(0, 3)
    zero_points = None
    if zp_form == 1:
        zero_points = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8)
    elif zp_form == 2:
        zero_points = rng.uniform(0, 2**bits, (N, kb)).astype(dtype)
    g_idx = rng.integers(0, kb, K).astype(np.int32) if rng.random() < 0.15 else None
    bias = rng.standard_normal(N).astype(dtype) if rng.random() < 0.4 else None
    A = rng.standard_normal((M, K)) * rng.choice([1.0, 1e-3, 100.0, 2.0**-130 if dtype == f32 else 1.0])
    if rng.random() < 0.2:
        A[:, rng.integers(0, K, max(1, K // 3))] = 0
    A = A.astype(dtype)
    args = (A, B, scales, zero_points, g_idx, bias)
    copies = [None if x is None else x.copy() for x in args]
    kw = dict(K=K, N=N, bits=bits, block_size=bs)
    what = (
        f"nbits seed {seed}: {M}x{K}x{N} {bits}-bit bs {bs} {dtype.name} level {level} zp {zp_form} "
        f"g_idx {g_idx is not None} bias {bias is not None}"
    )
    decoded = nbits_oracle.Decoded(B, scales, zero_points, g_idx, K, N, bits, bs)
    exact = nbits_oracle.matmul_nbits(*args, **kw, decoded=decoded)
    bound = nbits_oracle.error_bound(*args, **kw, level=level, out_dtype=dtype, decoded=decoded, exact=exact)
    finite = np.abs(exact) + bound < float(ml_dtypes.finfo(dtype).max)
    fails = []
    built = tables[rng.integers(0, len(tables))]
    own = [None if x is None else x.copy() for x in args[1:]]
    with table(*built):
        held = qm.MatMulNBits(*own, **kw, accuracy_level=level)
    for x in own:  # the caller's arrays change after construction: the held weight must not
        if x is not None:
            x[...] = x[::-1] if x.ndim == 1 else x[::-1, ::-1]
    for level_name, hidden in tables:
        first = None
        for t in (1, int(rng.choice(threads))):
            with table(level_name, hidden, t):
                y = qm.matmul_nbits(_view(rng, A), B, scales, zero_points, g_idx, bias, **kw, accuracy_level=level)
                y_held = held(_view(rng, A))
            on = f"{level_name}{hidden} at {t} threads"
            nan = np.isnan(y) & np.isnan(y_held)
            if not np.array_equal(np.where(nan, 0, y).view(np.uint8), np.where(nan, 0, y_held).view(np.uint8)):
                fails.append(f"{what}: held (built on {built[0]}) differs from the function on {on}")
            if first is None:
                first = y
                err = np.abs(y.astype(np.float64) - exact)
                if np.any(finite & ~(err <= bound)):
                    fails.append(f"{what}: outside the documented bound on {on}")
            elif not np.array_equal(first.view(np.uint8), y.view(np.uint8)):
                fails.append(f"{what}: {on} differs from 1 thread")
        if level in (0, 1):
            with table(level_name, hidden):
                other = qm.matmul_nbits(A, B, scales, zero_points, g_idx, bias, **kw, accuracy_level=1 - level)
            if not np.array_equal(first.view(np.uint8), other.view(np.uint8)):
                fails.append(f"{what}: level {1 - level} differs on {level_name}{hidden}")
    fails += [
        f"{what}: input {i} modified"
        for i, (x, c) in enumerate(zip(args, copies))
        if x is not None and not np.array_equal(x.view(np.uint8), c.view(np.uint8))
    ]
    return fails


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 1_000_000 * 1000)
    parser.add_argument("--cases", type=int, default=0, help="stop after this many cases (0: when time is up)")
    parser.add_argument(
        "--family", choices=["qlinear", "float8", "nbits", "matmul_integer", "depthwise", "all"], default="all"
    )
    parser.add_argument("--threads", default="2,3,16", help="thread counts besides 1, one per case and table")
    options = parser.parse_args(argv)
    threads = [int(t) for t in options.threads.split(",")]
    tables = runnable_tables()
    every = [qlinear_case, float8_case, nbits_case, matmul_integer_case, depthwise_case]
    families = every if options.family == "all" else [c for c in every if c.__name__ == f"{options.family}_case"]
    names = ", ".join(level + "".join(f" without {h}" for h in hidden) for level, hidden in tables)
    print(f"fuzz: seed {options.seed}, {options.minutes} minutes, tables: {names}", flush=True)
    deadline, cases, failed = time.monotonic() + 60 * options.minutes, 0, 0
    while (options.cases and cases < options.cases) or (not options.cases and time.monotonic() < deadline):
        seed = options.seed + cases
        case = families[cases % len(families)]
        try:
            fails = case(seed, tables, threads)
        except Exception:  # noqa: BLE001 - a raise is a failure to report, with its seed
            fails = [f"{case.__name__} seed {seed} raised:\n{traceback.format_exc()}"]
        cases += 1
        failed += bool(fails)
        for line in fails:
            print("FAIL", line, flush=True)
    print(f"fuzz: {cases} cases from seed {options.seed}, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
