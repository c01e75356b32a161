"""test_onnx_qlinear_pool.py: com.microsoft QLinearGlobalAveragePool and QLinearAveragePool (onnx/_qlinear_pool.py) against ONNX Runtime's CPU kernels bit for bit: both layouts, 1-D to 3-D, every auto_pad / ceil_mode / count_include_pad path and output-size rule, the global fallback, int32 wrap-around, saturation, float-order-sensitive cases, refusals, bad input."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_bits import frozen, same_bits
from peer_deviations import pinned_only

from quantmatmul import peers
from quantmatmul.onnx._qlinear_ops import _cvt_saturate
from quantmatmul.onnx._qlinear_pool import (
    _global_mean,
    _pool_geometry,
    _window_means,
    qlinear_average_pool,
    qlinear_global_average_pool,
)

# The functions reproduce the pinned ONNX Runtime's kernels (constraints.txt), down to its output-size
# rules and float order: against another release the bit-for-bit comparisons are skipped.
ORT_PINNED = pinned_only("onnxruntime", "reproduces the kernels of")

F32, U8, S8 = np.float32, np.uint8, np.int8
ELEM = {np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8}
INPUTS = ["X", "x_scale", "x_zero_point", "y_scale", "y_zero_point"]
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


@functools.cache
def session(op: str, dtype: str, attributes: tuple = (), y_zero_point: bool = True, constants: tuple | None = None):
    """One node, no fixed shapes. attributes: sorted (name, value) pairs, lists as tuples. y_zero_point
    False: left off the end of the inputs (ORT's type inference refuses an empty name "" for either
    zero point). constants: (x_scale, x_zero_point, y_scale, y_zero_point) as initializers."""
    elem = ELEM[np.dtype(dtype)]
    names = INPUTS if y_zero_point else INPUTS[:4]
    attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attributes}
    node = helper.make_node(op, names, ["Y"], domain="com.microsoft", **attrs)
    initializers = []
    if constants is not None:
        for name, value in zip(names[1:], constants):
            initializers.append(numpy_helper.from_array(np.asarray(value, F32 if "scale" in name else dtype), name))
    fed = [n for n in names if n not in {i.name for i in initializers}]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if "scale" in n else elem, None) for n in fed]
    graph = helper.make_graph(
        [node], op, inputs, [helper.make_tensor_value_info("Y", elem, None)], initializer=initializers
    )
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=8)
    return peers.session(model), fed


def ort(op, X, xs, xz, ys, yz, constants=False, **attributes) -> np.ndarray:
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attributes.items()))
    consts = (float(xs), int(xz), float(ys), *([] if yz is None else [int(yz)])) if constants else None
    sess, fed = session(op, np.dtype(X.dtype).str, key, yz is not None, consts)
    values = dict(zip(INPUTS, (X, xs, xz, ys, yz)))
    return sess.run(None, {n: np.asarray(values[n]) for n in fed})[0]


def check_global(X, xs, xz, ys, yz, channels_last=0) -> np.ndarray:
    X, xz, yz = frozen(X, xz, yz)
    expected = ort("QLinearGlobalAveragePool", X, xs, xz, ys, yz, channels_last=channels_last)
    got = qlinear_global_average_pool(X, xs, xz, ys, yz, channels_last=channels_last)
    same_bits(got, expected, f"QLinearGlobalAveragePool {X.dtype} {X.shape} cl {channels_last} {xs!r} {ys!r} {xz} {yz}")
    return got


def check_pool(X, xs, xz, ys, yz, constants=False, **attributes) -> np.ndarray:
    X, xz = frozen(X, xz)
    yz = None if yz is None else frozen(yz)[0]
    expected = ort("QLinearAveragePool", X, xs, xz, ys, yz, constants, **attributes)
    got = qlinear_average_pool(X, xs, xz, ys, yz, **attributes)
    same_bits(got, expected, f"QLinearAveragePool {X.dtype} {X.shape} {attributes} {xs!r} {ys!r} {xz} {yz}")
    return got


def zero_point(rng, dtype):
    info = np.iinfo(dtype)
    return np.array(rng.integers(info.min, info.max + 1), dtype)


def values(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


# --------------------------------------------------------------------------------------------------
# QLinearGlobalAveragePool


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_global_average_pool(dtype):
    """300 random parameter sets: both layouts, 1 to 3 spatial axes, channel counts and image sizes off
    the kernels' 8- and 32-wide steps, N up to 3; scale ratios from 2^-20 up to just under 256 (the
    top saturating most outputs), half of them with y_scale a simple multiple of x_scale (near-ties)."""
    rng = np.random.default_rng([10, np.dtype(dtype).num])
    for i in range(300):
        channels_last = i % 2
        spatial = [int(d) for d in rng.choice([1, 2, 3, 5, 7, 8, 9, 13, 31, 33], rng.integers(1, 4))]
        C = int(rng.choice([1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 64]))
        N = int(rng.integers(1, 4))
        X = values(rng, dtype, [N, *spatial, C] if channels_last else [N, C, *spatial])
        size = np.prod(spatial)
        xs = F32(np.exp2(rng.uniform(-10, 0)))
        if i % 3 == 0:
            ratio = np.exp2(rng.uniform(-20, 7.99)) * size  # scale = ratio / size in [2^-20, 256)
        elif i % 3 == 1:
            ratio = rng.integers(1, 9) / 4
        else:
            ratio = np.exp2(rng.uniform(-4, 4))
        ys = F32(xs / ratio)
        check_global(X, xs, zero_point(rng, dtype), ys, zero_point(rng, dtype), channels_last)


@ORT_PINNED
def test_global_average_pool_int32_wraps():
    """An image of 9 million elements far from x_zero_point: the true sum (about +-2.3e9) overflows the
    kernels' int32 accumulators, and ORT returns the wrapped value's average, as qlinear does; the
    NCHW kernel (C = 1) and the NHWC one (C = 2) alike."""
    n = 9_000_000
    for dtype, channels_last, C, x, x_zp in [(U8, 0, 1, 255, 0), (U8, 1, 2, 0, 255), (S8, 0, 1, 127, -128)]:
        X = np.full((1, n, C) if channels_last else (1, C, n), x, dtype)
        got = check_global(X, F32(1), np.array(x_zp, dtype), F32(1), np.array(0, dtype), channels_last)
        true_mean = x - x_zp
        assert int(got.ravel()[0]) != np.clip(true_mean, np.iinfo(dtype).min, np.iinfo(dtype).max)


@pytest.mark.parametrize("dtype", [U8, S8])
def test_global_average_pool_in_cpp_is_the_numpy_formula(dtype):
    """The C++ loop (the codes as they lie: [N, S, C] or [N, C, S]) against the numpy formula it replaces
    (_global_mean): C-order and channels-last views, the channels_last attribute with contiguous and strided
    X, 1 to 3 spatial axes, scales whose product overflows (inf and NaN values: the lower bound)."""
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    for case in range(24):
        nd, channels_last = 1 + case % 3, case % 4 == 3
        spatial = [int(rng.integers(1, 9)) for _ in range(nd)]
        N, C = int(rng.integers(1, 3)), int(rng.integers(1, 70))
        X = rng.integers(info.min, info.max + 1, (N, *spatial, C) if channels_last else (N, C, *spatial)).astype(dtype)
        if not channels_last and case % 2:  # a channels-last view, as the session's convolutions pass
            X = np.moveaxis(np.ascontiguousarray(np.moveaxis(X, 1, -1)), -1, 1)
        if channels_last and case % 8 == 7:
            X = X[..., ::2] if C > 1 else X[:, ::-1]
        x_s, y_s = (F32(3e38), F32(1e-30)) if case % 5 == 4 else (F32(rng.uniform(0.01, 1)), F32(rng.uniform(0.01, 1)))
        zps = (
            np.array(rng.integers(info.min, info.max + 1), dtype),
            np.array(rng.integers(info.min, info.max + 1), dtype),
        )
        got = qlinear_global_average_pool(X, x_s, zps[0], y_s, zps[1], channels_last=int(channels_last))
        axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
        want = _global_mean(X, x_s, int(zps[0]), y_s, int(zps[1]), axes)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@ORT_PINNED
def test_global_average_pool_refusals_are_computed():
    """ORT refuses a scale x_scale / (y_scale * S) outside [2^-32, 256) (y_scale zero or negative too);
    qlinear_global_average_pool computes the formula: f32(acc) * scale, clamped, rounded."""
    X = np.array([[[10, 20]], [[0, 255]]], U8)  # [2, 1, 2]
    zp = np.array(100, U8)
    cases = [  # (x_scale, y_scale, outputs): acc = 30 - 200 = -170 and 255 - 200 = 55 over S = 2
        (F32(1), F32(1 / 1024), [0, 255]),  # scale 512
        (F32(1), F32(2.0**-40), [0, 255]),
        (F32(1), F32(-1), [85, 0]),  # scale -0.5: -170 -> 85, 55 -> -27.5, clamped to 0
        (F32(1), F32(0), [0, 255]),  # scale inf
        (F32(2.0**-40), F32(1), [0, 0]),  # scale 2^-41
    ]
    for xs, ys, expected in cases:
        with pytest.raises(Exception, match="out of computation range"):
            ort("QLinearGlobalAveragePool", X, xs, zp, ys, np.array(0, U8))
        got = qlinear_global_average_pool(X, xs, zp, ys, np.array(0, U8))
        assert got.ravel().tolist() == expected, (xs, ys)


# --------------------------------------------------------------------------------------------------
# QLinearAveragePool


@ORT_PINNED
def test_average_pool_output_sizes_and_windows():
    """Every 1-D geometry with D 1..7, kernel 1..4, stride 1..3, pads below the kernel, each auto_pad,
    floor and ceil mode: the output sizes (C's truncating division, ceil mode's last-window rule, SAME's
    negative pads where kernel < stride), the clipped windows and their counts. A negative size is
    refused by both; an empty output is computed by both (NCHW)."""
    rng = np.random.default_rng(11)
    refused = computed = 0
    for D, k, s in itertools.product(range(1, 8), range(1, 5), range(1, 4)):
        X = values(rng, U8, (1, 2, D))
        for auto_pad in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            pad_sets = itertools.product(range(k), range(k)) if auto_pad == "NOTSET" else [None]
            for pads, ceil_mode in itertools.product(pad_sets, (0, 1)):
                attributes = dict(
                    kernel_shape=[k], strides=[s], auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=(D + k) % 2
                )
                if pads is not None:
                    attributes["pads"] = list(pads)
                try:
                    _pool_geometry("", [D], [k], [s], list(pads or (0, 0)), auto_pad, ceil_mode)
                except ValueError:
                    with pytest.raises(Exception, match="negative"):
                        ort(
                            "QLinearAveragePool",
                            X,
                            F32(0.1),
                            np.array(7, U8),
                            F32(0.07),
                            np.array(100, U8),
                            **attributes,
                        )
                    refused += 1
                    continue
                check_pool(X, F32(0.1), np.array(7, U8), F32(0.07), np.array(100, U8), **attributes)
                computed += 1
    assert refused > 10 and computed > 1500


def random_pool_case(rng, dtype, i):
    nd = 1 + i % 3
    channels_last = i // 3 % 2
    spatial = [int(rng.integers(1, 10)) for _ in range(nd)]
    kernel = list(spatial) if i % 13 == 0 else [int(rng.integers(1, 5)) for _ in range(nd)]
    attributes = dict(
        kernel_shape=kernel,
        strides=[int(rng.integers(1, 4)) for _ in range(nd)],
        auto_pad=["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"][i % 5],
        ceil_mode=int(rng.integers(0, 2)),
        count_include_pad=int(rng.integers(0, 2)),
        channels_last=channels_last,
    )
    if attributes["auto_pad"] == "NOTSET" and i % 4:
        attributes["pads"] = [int(rng.integers(0, k)) for k in kernel + kernel]
    N, C = (0 if i % 29 == 0 else int(rng.integers(1, 3))), int(rng.choice([1, 2, 3, 7, 8, 9, 17]))
    X = values(rng, dtype, [N, *spatial, C] if channels_last else [N, C, *spatial])
    return X, attributes


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_average_pool(dtype):
    """600 random cases: 1-D to 3-D, both layouts, every auto_pad, pads, strides, ceil_mode,
    count_include_pad, kernels equal to the input (the global fallback), N = 0 at times; scale ratios
    2^-3..2^3 and extreme y_scales (tiny: quotients past int32, which ORT turns into qmin; huge: all
    y_zero_point). y_zero_point left out at times (0); constant scales and zero points at times. Cases ORT refuses
    (a negative output size, the fallback's scale range) are skipped, as are the channels_last ones
    with an empty output (ORT divides by zero there: SIGFPE)."""
    rng = np.random.default_rng([12, np.dtype(dtype).num])
    checked = 0
    for i in range(600):
        X, attributes = random_pool_case(rng, dtype, i)
        xs = F32(np.exp2(rng.uniform(-8, 0)))
        ys = F32(xs * np.exp2(rng.uniform(-3, 3))) if i % 7 else F32([1e-30, 1e-6, 1e30, 1e-42][i // 7 % 4])
        xz, yz = zero_point(rng, dtype), zero_point(rng, dtype) if i % 6 else None
        try:
            got = qlinear_average_pool(X, xs, xz, ys, yz, **attributes)
        except ValueError as error:
            assert "negative" in str(error)
            continue
        if attributes["channels_last"] and 0 in got.shape[1:-1]:
            continue
        kernel, spatial = attributes["kernel_shape"], X.shape[1:-1] if attributes["channels_last"] else X.shape[2:]
        pads = attributes.get("pads", [0] * 2 * len(kernel))
        begins, ends, _ = _pool_geometry(
            "", spatial, kernel, attributes["strides"], pads, attributes["auto_pad"], attributes["ceil_mode"]
        )
        if list(spatial) == kernel and not any(begins + ends):  # the global fallback, and its range check
            with np.errstate(all="ignore"):
                scale = xs / F32(ys * F32(np.prod(kernel)))
            if not F32(2.0**-32) <= scale < F32(256):
                continue
        check_pool(X, xs, xz, ys, yz, constants=i % 5 == 1, **attributes)
        checked += 1
    assert checked > 450


def naive_means(x, xs, xz, kernel, strides, pads, reverse=False):
    """Each window's mean, window by window in Python: float32 x_scale * (x - x_zp) of its in-bounds
    elements added one at a time in row-major order (or the reverse), divided by their count (floor
    mode, pads below the kernel)."""
    nd = len(kernel)
    spatial = x.shape[2:]
    out = [(d + pads[i] + pads[i + nd] - k) // s + 1 for i, (d, k, s) in enumerate(zip(spatial, kernel, strides))]
    xf = F32(xs) * (x.astype(np.int32) - int(xz)).astype(F32)
    means = np.empty((*x.shape[:2], *out), F32)
    for n, c, *pos in itertools.product(*(range(d) for d in (*x.shape[:2], *out))):
        ranges = []
        for p, k, s, b, d in zip(pos, kernel, strides, pads, spatial):
            start = p * s - b
            ranges.append(range(max(start, 0), min(start + k, d)))
        elements = [xf[(n, c, *i)] for i in itertools.product(*ranges)]
        total = F32(0)
        for e in reversed(elements) if reverse else elements:
            total = F32(total + e)
        means[(n, c, *pos)] = F32(total / F32(len(elements)))
    return means


@ORT_PINNED
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dtype", [U8, S8])
def test_average_pool_float_order(dtype, channels_last):
    """Cases built so that the float order shows: y_scale puts one window's mean, as summed in the
    kernel's row-major order and as summed in reverse (a per-window Python reference), on either side
    of a rounding boundary m + 0.5; ORT and qlinear_average_pool agree with the row-major sum
    everywhere, and the reverse sum, or y_zero_point added after rounding, would differ in many."""
    rng = np.random.default_rng([13, np.dtype(dtype).num, channels_last])
    info = np.iinfo(dtype)
    pads = [1, 0, 0, 1]
    cases = caught_order = caught_zp = 0
    while cases < 30:
        kernel, strides = [int(rng.integers(3, 6)), int(rng.integers(3, 6))], [1, int(rng.integers(1, 3))]
        x = values(rng, dtype, (1, 2, 6, 7))
        xs, xz = F32(np.exp2(rng.uniform(-8, 0))), zero_point(rng, dtype)
        yz = zero_point(rng, dtype) if cases % 2 else np.array(0, dtype)  # a float32 q + y_zp can round q's ulps away
        a = naive_means(x, xs, xz, kernel, strides, pads)
        b = naive_means(x, xs, xz, kernel, strides, pads, reverse=True)
        differ = np.argwhere((np.abs(a - b) >= 2 * np.spacing(a)) & (np.abs(a) > 1e-3))  # 2 ulps: the quotients part
        if len(differ) == 0:
            continue
        j = tuple(differ[rng.integers(len(differ))])
        ys = F32(abs(np.float64(a[j]) + np.float64(b[j])) / 2 / (rng.integers(2, 40) + 0.5))
        X = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if channels_last else x
        got = check_pool(
            X, xs, xz, ys, yz, kernel_shape=kernel, strides=strides, pads=pads, channels_last=channels_last
        )
        got = np.moveaxis(got, -1, 1) if channels_last else got

        def rounded(means, zp_in_float=True, ys=ys, yz=int(yz)):
            q = means / ys
            r = np.rint(q + F32(yz)) if zp_in_float else np.rint(q) + yz
            return np.clip(r, info.min, info.max)

        assert np.array_equal(rounded(a), got)  # every quotient well inside int32 here
        caught_order += not np.array_equal(rounded(b), got)
        caught_zp += not np.array_equal(rounded(a, False), got)
        cases += 1
    assert caught_order >= 6 and caught_zp >= 4, (caught_order, caught_zp)


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_average_pool_quirks(dtype):
    """A quotient past int32 truncates to INT32_MIN: qmin for a huge positive mean. The global fallback
    sums in integers (here it differs from the float path's result), for 4 spatial axes too, which the
    float path refuses (ORT: "unsupported pooling size")."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng([14, np.dtype(dtype).num])
    zp = np.array(0, dtype)
    X = np.full((1, 2, 3, 3), info.max, dtype)
    got = check_pool(X, F32(1), zp, F32(1e-30), zp, kernel_shape=[2, 2])
    assert (got == info.min).all()
    with pytest.raises(Exception, match="out of computation range"):  # the fallback's scale check
        ort("QLinearAveragePool", X, F32(1), zp, F32(1e-30), zp, kernel_shape=[3, 3])
    assert (qlinear_average_pool(X, F32(1), zp, F32(1e-30), zp, kernel_shape=[3, 3]) == info.max).all()
    # the fallback's integer sum against the float path's formula: y_scale puts one channel's exact
    # mean on m + 0.5, where the two roundings part in about half the cases
    parted = 0
    for _ in range(12):
        X = values(rng, dtype, (1, 4, 4, 6))
        xs, xz = F32(np.exp2(rng.uniform(-8, 0))), zero_point(rng, dtype)
        acc = int(X[0, 0].astype(np.int64).sum()) - int(xz) * 24
        ys = F32(abs(acc * np.float64(xs) / (24 * (rng.integers(1, 60) + 0.5)))) or F32(0.01)
        yz = np.array(info.min if acc >= 0 else info.max, dtype)
        fallback = check_pool(X, xs, xz, ys, yz, kernel_shape=[4, 6], strides=[2, 3], ceil_mode=1)
        assert np.array_equal(fallback, qlinear_global_average_pool(X, xs, xz, ys, yz))
        means = _window_means(X, xs, int(xz), [4, 6], [1, 1], [0, 0], [1, 1], 0)
        with np.errstate(all="ignore"):
            parted += not np.array_equal(fallback, _cvt_saturate(means / ys + F32(int(yz)), X.dtype))
    assert parted >= 3, parted
    xs, ys, xz, yz = F32(0.1), F32(0.0123), zero_point(rng, dtype), zero_point(rng, dtype)
    X4 = values(rng, dtype, (1, 3, 2, 3, 2, 2))
    check_pool(X4, xs, xz, ys, yz, kernel_shape=[2, 3, 2, 2])
    for kernel, pads in (([2, 2, 2, 2], None), ([2, 3, 2, 2], [1, 0, 0, 0, 0, 0, 0, 0])):
        with pytest.raises(Exception, match="unsupported pooling size"):
            ort("QLinearAveragePool", X4, xs, xz, ys, yz, kernel_shape=kernel, **({"pads": pads} if pads else {}))
        with pytest.raises(ValueError, match="^QLinearAveragePool: ONNX Runtime pools over 1 to 3 spatial axes"):
            qlinear_average_pool(X4, xs, xz, ys, yz, kernel_shape=kernel, pads=pads)


# --------------------------------------------------------------------------------------------------
# bad input


def test_bad_input():
    u, f, z, s = np.zeros((1, 2, 3, 3), U8), F32(0.1), np.array(0, U8), np.array(0, S8)
    gap, avg = qlinear_global_average_pool, qlinear_average_pool
    G, A = "QLinearGlobalAveragePool: ", "QLinearAveragePool: "
    cases = [
        (lambda: gap(u.astype(np.int32), f, z, f, z), TypeError, G + "X must be int8 or uint8, got int32"),
        (lambda: gap(u, 0.1, z, f, z), TypeError, G + "x_scale must be float32, got float64"),
        (lambda: gap(u, f, z, np.array([f, f]), z), ValueError, G + "y_scale must be a scalar or a 1-D tensor of one"),
        (lambda: gap(u, F32(np.inf), z, f, z), ValueError, G + "x_scale must be finite"),
        (lambda: gap(u, f, s, f, z), TypeError, G + "x_zero_point must be uint8 (the tensor's type), got int8"),
        (lambda: gap(u, f, None, f, z), TypeError, G + "x_zero_point is required"),
        (lambda: gap(u, f, z, f, np.zeros((1, 1), U8)), ValueError, G + "y_zero_point must be a scalar"),
        (lambda: gap(u[0, 0], f, z, f, z), ValueError, G + "X must have at least 3 dimensions"),
        (lambda: gap(u, f, z, f, z, channels_last=2), ValueError, G + "channels_last must be 0 or 1, got 2"),
        (lambda: gap(u, f, z, f, z, channels_last=True), TypeError, G + "channels_last must be 0 or 1 (an int)"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2]), ValueError, A + "kernel_shape must have 2 values, got 1"),
        (lambda: avg(u, f, z, f, z, kernel_shape=None), TypeError, A + "kernel_shape is required"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2, 2.0]), TypeError, A + "kernel_shape must be a sequence of ints"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[0, 2]), ValueError, A + "kernel_shape and strides must be positive"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], strides=[1, 0]), ValueError, A + "kernel_shape and strides"),
        (
            lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], pads=[2, 0, 0, 0]),
            ValueError,
            A + "pads must be non-negative and smaller",
        ),
        (
            lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], pads=[-1, 0, 0, 0]),
            ValueError,
            A + "pads must be non-negative",
        ),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], pads=[0, 0]), ValueError, A + "pads must have 4 values"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], auto_pad="SAME"), ValueError, A + "auto_pad must be one of"),
        (lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], ceil_mode=2), ValueError, A + "ceil_mode must be 0 or 1"),
        (
            lambda: avg(u, f, z, f, z, kernel_shape=[2, 2], count_include_pad=-1),
            ValueError,
            A + "count_include_pad must",
        ),
        (lambda: avg(u, f, s, f, z, kernel_shape=[2, 2]), TypeError, A + "x_zero_point must be uint8"),
        (lambda: avg(u[:, :0], f, z, f, z, kernel_shape=[2, 2]), ValueError, A + "only N can be zero"),
        (
            lambda: avg(u, f, z, f, z, kernel_shape=[5, 2]),
            ValueError,
            A + "output size -1 on spatial axis 0 is negative",
        ),
        (lambda: avg(u[0, 0], f, z, f, z, kernel_shape=[2]), ValueError, A + "X must have at least 3 dimensions"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as raised:
            call()
        assert str(raised.value).startswith(message), (str(raised.value), message)


def test_inputs_not_modified_and_outputs_fresh():
    """Read-only inputs work (nothing is written into them) and the outputs own their memory."""
    rng = np.random.default_rng(15)
    for dtype in (U8, S8):
        X, xz, yz = frozen(values(rng, dtype, (2, 5, 6, 3)), zero_point(rng, dtype), zero_point(rng, dtype))
        for channels_last in (0, 1):
            outs = [
                qlinear_global_average_pool(X, F32(0.1), xz, F32(0.05), yz, channels_last=channels_last),
                qlinear_average_pool(X, F32(0.1), xz, F32(0.05), yz, kernel_shape=[3, 2], channels_last=channels_last),
                qlinear_average_pool(
                    X,
                    F32(0.1),
                    xz,
                    F32(0.05),
                    yz,
                    kernel_shape=list(X.shape[2:]) if not channels_last else list(X.shape[1:-1]),
                    channels_last=channels_last,
                ),
            ]
            for out in outs:
                assert out.flags.writeable and out.flags.c_contiguous and not np.shares_memory(out, X)
