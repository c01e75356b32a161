"""QLinearConv and ConvInteger (onnx/_qconv.py): against ONNX Runtime's kernels bit for bit, onnx.reference's QLinearConv, and an exact oracle written from the spec (a direct loop over output positions, rounding with fractions)."""

from __future__ import annotations

import functools
import itertools
from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from conftest import kernel_entry, kernel_levels
from onnx import TensorProto, helper, numpy_helper
from peer_deviations import _ort_u8s8_kernel_saturates, deviation, peer_refuses

from quantmatmul.onnx import InferenceSession
from quantmatmul.onnx._qconv import conv_integer, conv_weight, qlinear_conv

_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
# ONNX Runtime's QLinearConv kernels: (x, w, y) types
ORT_TYPES = [(np.uint8, np.uint8, np.uint8), (np.uint8, np.int8, np.uint8), (np.int8, np.int8, np.int8)]


# --------------------------------------------------------------------------------------------------
# The oracle: the spec's sum at each output position, one loop, and one exact rounding


def oracle_sums(x, x_zp, w, w_zp, *, group=1, strides=None, pads=None, dilations=None):
    """int64 [N, M, out...]: sum over c, k of (x_padded - x_zp) * (w - w_zp[m]), x padded with x_zp."""
    x = x.astype(np.int64) - int(x_zp)
    N, C, *spatial = x.shape
    M, Cg, *kernel = w.shape
    nd = len(spatial)
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    pads = pads or [0] * (2 * nd)
    padded = np.zeros((N, C, *[s + pads[i] + pads[i + nd] for i, s in enumerate(spatial)]), np.int64)
    padded[(slice(None), slice(None), *(slice(pads[i], pads[i] + s) for i, s in enumerate(spatial)))] = x
    wd = w.astype(np.int64) - np.broadcast_to(np.asarray(w_zp, np.int64), (M,)).reshape(M, *[1] * (nd + 1))
    out = [(padded.shape[2 + i] - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1 for i in range(nd)]
    y = np.zeros((N, M, *out), np.int64)
    Mg = M // group
    for o in itertools.product(*(range(v) for v in out)):
        window = padded[
            (
                slice(None),
                slice(None),
                *(
                    slice(o[i] * strides[i], o[i] * strides[i] + (kernel[i] - 1) * dilations[i] + 1, dilations[i])
                    for i in range(nd)
                ),
            )
        ]  # [N, C, k...]
        for m in range(M):
            g = m // Mg
            y[(slice(None), m, *o)] = (window[:, g * Cg : (g + 1) * Cg] * wd[m]).reshape(N, -1).sum(axis=1)
    return y


def exact_output(sums, B, x_scale, w_scale, y_scale, y_zp):
    """round_half_even((sums + B) * x_scale * w_scale[m] / y_scale) + y_zp, saturated: Python fractions."""
    M = sums.shape[1]
    ws = np.broadcast_to(np.asarray(w_scale, np.float32), (M,))
    info = np.iinfo(np.asarray(y_zp).dtype)
    y = np.empty(sums.shape, np.asarray(y_zp).dtype)
    bias = np.zeros(M, np.int64) if B is None else B.astype(np.int64)
    for idx in np.ndindex(*sums.shape):
        m = idx[1]
        acc = int(np.int32(np.int64(sums[idx] + bias[m]).astype(np.int32)))  # the spec's int32 sum
        value = Fraction(acc) * Fraction(float(x_scale)) * Fraction(float(ws[m])) / Fraction(float(y_scale))
        y[idx] = min(max(round(value) + int(y_zp), info.min), info.max)
    return y


# --------------------------------------------------------------------------------------------------
# ONNX Runtime


def ort_node(op, inputs: dict, x, y_type, **attrs):
    """One `op` node, x fed, the other inputs initializers, run in ONNX Runtime (one thread)."""
    names = ["x", *inputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items() if v is not None]
    node = helper.make_node(op, [n if n == "x" or inputs[n] is not None else "" for n in names], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", _ONNX_TYPE[x.dtype], x.shape)],
        [helper.make_tensor_value_info("y", y_type, None)],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def ort_qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, B=None, **attrs):
    inputs = {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "ys": ys, "yz": yz, "B": B}
    return ort_node("QLinearConv", inputs, x, _ONNX_TYPE[np.asarray(yz).dtype], **attrs)


def random_case(rng, types, *, nd=None, depthwise=False, narrow_w=False):
    """A random QLinearConv: (args, attrs). narrow_w: 7-bit int8 weights (no int16 pair saturates)."""
    xt, wt, yt = (np.dtype(t) for t in types)
    nd = nd or int(rng.integers(1, 4))
    group = int(rng.choice([1, 1, 2, 3]))
    Cg, Mg = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    if depthwise:
        group, Cg, Mg = int(rng.integers(1, 20)), 1, 1
    C, M = Cg * group, Mg * group
    kernel = [int(rng.integers(1, 4)) for _ in range(nd)]
    dilations = [int(rng.integers(1, 3)) if rng.random() < 0.3 else 1 for _ in range(nd)]
    spatial = [
        int(rng.integers((k - 1) * d + 1, (k - 1) * d + 7 if nd < 3 else (k - 1) * d + 4))
        for k, d in zip(kernel, dilations)
    ]
    strides = [int(rng.integers(1, 3)) for _ in range(nd)]
    pads = [int(rng.integers(0, k)) for k in kernel] + [int(rng.integers(0, k)) for k in kernel]
    N = int(rng.integers(1, 3))
    xi, wi, yi = np.iinfo(xt), np.iinfo(wt), np.iinfo(yt)
    x = rng.integers(xi.min, xi.max + 1, (N, C, *spatial)).astype(xt)
    w_lo, w_hi = (-64, 64) if narrow_w and wt == np.int8 else (wi.min, wi.max + 1)
    w = rng.integers(w_lo, w_hi, (M, Cg, *kernel)).astype(wt)
    per_channel = rng.random() < 0.5
    ws = rng.uniform(0.001, 0.05, M if per_channel else ()).astype(np.float32)
    if wt == np.int8:  # ORT's quantizers: symmetric int8 weights
        wz = np.zeros(M if per_channel else (), wt)
    else:
        wz = rng.integers(wi.min, wi.max + 1, M if per_channel else ()).astype(wt)
    xz = np.asarray(rng.integers(xi.min, xi.max + 1), xt)
    yz = np.asarray(rng.integers(yi.min, yi.max + 1), yt)
    xs, ys = np.float32(rng.uniform(0.001, 0.05)), np.float32(rng.uniform(0.01, 2.0))
    B = rng.integers(-30000, 30000, M).astype(np.int32) if rng.random() < 0.6 else None
    attrs = {"group": group, "strides": strides, "pads": pads, "dilations": dilations, "kernel_shape": kernel}
    return (x, xs, xz, w, ws, wz, ys, yz, B), attrs


def _narrow() -> bool:
    """ONNX Runtime's u8·s8 kernels saturate int16 pair sums on this CPU: compare 7-bit weights."""
    return _ort_u8s8_kernel_saturates()


@pytest.mark.parametrize("types", ORT_TYPES, ids=lambda t: "".join(np.dtype(v).name[0] for v in t))
@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
def test_qlinear_conv_is_onnxruntime_bit_for_bit(types, depthwise):
    rng = np.random.default_rng(sum(map(ord, str(types))) + depthwise)
    for _ in range(40):
        args, attrs = random_case(rng, types, depthwise=depthwise, narrow_w=_narrow())
        theirs = ort_qlinear_conv(*args, **attrs)
        ours = qlinear_conv(*args, **attrs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)


def test_qlinear_conv_resnet_shapes_against_onnxruntime():
    """The shapes of a ResNet / MobileNet layer: 3x3, 1x1, strided, a 7x7 stem, depthwise; large biases and
    scales that saturate; per-channel int8 weights."""
    rng = np.random.default_rng(7)
    shapes = [
        (64, 64, 14, 3, 1, 1),
        (128, 32, 7, 1, 1, 1),
        (32, 64, 15, 3, 1, 2),
        (3, 16, 32, 7, 1, 2),
        (96, 96, 14, 3, 96, 1),
    ]
    for (C, M, H, k, group, s), types in itertools.product(shapes, ORT_TYPES):
        xt, wt, yt = types
        x = rng.integers(np.iinfo(xt).min, np.iinfo(xt).max + 1, (1, C, H, H + 1)).astype(xt)
        lo, hi = (-64, 64) if _narrow() and wt == np.int8 else (np.iinfo(wt).min, np.iinfo(wt).max + 1)
        w = rng.integers(lo, hi, (M, C // group, k, k)).astype(wt)
        ws = rng.uniform(0.0005, 0.005, M).astype(np.float32)
        wz = np.zeros(M, wt) if wt == np.int8 else rng.integers(100, 150, M).astype(wt)
        B = rng.integers(-(2**20), 2**20, M).astype(np.int32)
        args = (x, np.float32(0.02), np.asarray(3, xt), w, ws, wz, np.float32(0.05), np.asarray(5, yt), B)
        attrs = {"group": group, "strides": [s, s], "pads": [k // 2] * 4}
        np.testing.assert_array_equal(qlinear_conv(*args, **attrs), ort_qlinear_conv(*args, **attrs))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_against_onnxruntime(auto_pad):
    rng = np.random.default_rng(11)
    for _ in range(12):
        args, attrs = random_case(rng, ORT_TYPES[1], nd=2, narrow_w=_narrow())
        attrs = {k: v for k, v in attrs.items() if k != "pads"}
        attrs["auto_pad"] = auto_pad
        ours = qlinear_conv(*args, **attrs)
        if auto_pad != "VALID" and attrs["dilations"] != [1, 1]:
            refused, _ = peer_refuses(
                "ort-conv-same-dilations", functools.partial(ort_qlinear_conv, *args, **attrs), "Dilation not supported"
            )
            if refused:  # the spec's SAME padding of the dilated kernel, as explicit pads
                x, w = args[0], args[3]
                pads = _same_pads(auto_pad, x.shape[2:], w.shape[2:], attrs["strides"], attrs["dilations"])
                explicit = {**attrs, "auto_pad": "NOTSET", "pads": pads}
                np.testing.assert_array_equal(ours, ort_qlinear_conv(*args, **explicit))
                continue
        np.testing.assert_array_equal(ours, ort_qlinear_conv(*args, **attrs))


def _same_pads(auto_pad, spatial, kernel, strides, dilations):
    """The spec's SAME_UPPER / SAME_LOWER: output ceil(D / stride), the padding the dilated kernel needs,
    the odd one at the end (UPPER) or the beginning (LOWER)."""
    begins, ends = [], []
    for d, k, s, dil in zip(spatial, kernel, strides, dilations):
        total = max(0, (-(-d // s) - 1) * s + (k - 1) * dil + 1 - d)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


@pytest.mark.parametrize("numerics", ["onnxruntime", "exact", "onnx-reference"])
def test_qlinear_conv_against_the_spec_oracle(numerics):
    """Every type combination (the spec allows all eight; ONNX Runtime registers three): the exact numerics
    bit for bit with the oracle, the float32 ones within one step of it."""
    rng = np.random.default_rng(3)
    for types in itertools.product([np.uint8, np.int8], repeat=3):
        for _ in range(4):
            args, attrs = random_case(rng, types)
            x, xs, xz, w, ws, wz, ys, yz, B = args
            sums = oracle_sums(x, xz, w, wz, **{k: attrs[k] for k in ("group", "strides", "pads", "dilations")})
            exact = exact_output(sums, B, xs, ws, ys, yz)
            ours = qlinear_conv(*args, **attrs, numerics=numerics)
            assert ours.dtype == exact.dtype
            diff = np.abs(ours.astype(np.int64) - exact)
            assert diff.max(initial=0) <= (0 if numerics == "exact" else 1)


def test_onnx_reference_numerics_is_onnx_reference():
    """onnx.reference's own QLinearConv, bit for bit, where it computes the spec's output: 2-D convolutions,
    and per-tensor weights of any rank."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(5)
    for i in range(30):
        args, attrs = random_case(rng, ORT_TYPES[i % 3], nd=2 if i % 2 else None)
        x, xs, xz, w, ws, wz, ys, yz, B = args
        if x.ndim != 4 and ws.size > 1:
            continue
        names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] + (["B"] if B is not None else [])
        node = helper.make_node("QLinearConv", names, ["y"], **attrs)
        theirs = ReferenceEvaluator(node).run(None, dict(zip(names, [v for v in args if v is not None])))[0]
        np.testing.assert_array_equal(qlinear_conv(*args, **attrs, numerics="onnx-reference"), theirs)


def test_onnx_reference_per_channel_beyond_2d_deviation():
    """onnx.reference's QLinearConv shapes a per-channel w_scale as [1, M, 1, 1]: a 1-D convolution's fails to
    broadcast, a 3-D one's multiplies the wrong axis (peer_deviations: "onnx-qlinearconv-per-channel")."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(9)
    for nd in (1, 3):
        x = rng.integers(0, 256, (2, 3, *[5] * nd)).astype(np.uint8)
        w = rng.integers(0, 256, (4, 3, *[2] * nd)).astype(np.uint8)
        ws = rng.uniform(0.001, 0.05, 4).astype(np.float32)
        wz = rng.integers(0, 256, 4).astype(np.uint8)
        args = (x, np.float32(0.02), np.uint8(3), w, ws, wz, np.float32(0.5), np.uint8(7))
        names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
        node = helper.make_node("QLinearConv", names, ["y"])
        try:
            theirs = ReferenceEvaluator(node).run(None, dict(zip(names, args)))[0]
            wrong = theirs.shape != (2, 4, *[4] * nd) or not np.array_equal(
                theirs, qlinear_conv(*args, numerics="onnx-reference")
            )
        except ValueError:
            wrong = True
        deviation("onnx-qlinearconv-per-channel", wrong)
        exact = exact_output(oracle_sums(x, 3, w, wz), None, args[1], ws, args[6], args[7])
        assert np.abs(qlinear_conv(*args, numerics="onnx-reference").astype(int) - exact).max() <= 1


def test_onnxruntime_refuses_five_type_combinations():
    rng = np.random.default_rng(1)
    for types in itertools.product([np.uint8, np.int8], repeat=3):
        if types in ORT_TYPES:
            continue
        args, attrs = random_case(rng, types, nd=2)
        refused, theirs = peer_refuses(
            "ort-qlinearconv-types",
            functools.partial(ort_qlinear_conv, *args, **attrs),
            "Could not find an implementation",
        )
        ours = qlinear_conv(*args, **attrs)
        assert ours.dtype == np.dtype(types[2])
        if not refused:  # a release with these kernels must compute the same
            np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------------------------------
# ConvInteger


@pytest.mark.parametrize(
    "types",
    list(itertools.product([np.uint8, np.int8], repeat=2)),
    ids=lambda t: "".join(np.dtype(v).name[0] for v in t),
)
def test_conv_integer_against_onnxruntime_and_the_oracle(types):
    rng = np.random.default_rng(17)
    for i in range(16):
        args, attrs = random_case(rng, (*types, np.uint8), depthwise=i % 4 == 0, narrow_w=_narrow())
        x, _, xz, w, _, wz, *_ = args
        if i % 5 == 0:
            xz, wz = None, None
        ours = conv_integer(x, w, xz, wz, **attrs)
        zx = 0 if xz is None else xz
        zw = 0 if wz is None else wz
        oracle = oracle_sums(x, zx, w, zw, **{k: attrs[k] for k in ("group", "strides", "pads", "dilations")})
        assert ours.dtype == np.int32
        np.testing.assert_array_equal(ours, oracle)
        run = functools.partial(ort_node, "ConvInteger", {"w": w, "xz": xz, "wz": wz}, x, TensorProto.INT32, **attrs)
        if np.size(wz) > 1:  # the spec's per-channel w_zero_point
            refused, theirs = peer_refuses("ort-convinteger-per-channel", run, "Non per-tensor quantization")
            if refused:
                continue
        else:
            theirs = run()
        np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------------------------------
# The boundary


def _valid():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 4, 5, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, 2, 3, 3)).astype(np.int8)
    return [x, np.float32(0.1), np.uint8(3), w, np.float32(0.2), np.int8(0), np.float32(0.5), np.uint8(1)]


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({0: np.zeros((1, 4, 5, 5), np.float32)}, TypeError, "x must be int8 or uint8"),
        ({3: np.zeros((6, 2, 3, 3), np.int16)}, TypeError, "w must be int8 or uint8"),
        ({1: np.float64(0.1)}, TypeError, "x_scale must be float32"),
        ({2: np.int8(3)}, TypeError, "x_zero_point must be uint8"),
        ({5: np.uint8(0)}, TypeError, "w_zero_point must be int8"),
        ({7: np.float32(1)}, TypeError, "y_zero_point must be int8 or uint8"),
        ({1: np.float32([0.1, 0.2])}, ValueError, "x_scale must be one value"),
        ({4: np.ones(5, np.float32)}, ValueError, r"w_scale must be one value or one per output channel \(\[6\]\)"),
        ({6: np.float32(0)}, ValueError, "y_scale must be finite and nonzero"),
        ({4: np.float32(np.inf)}, ValueError, "w_scale must be finite and nonzero"),
        ({3: np.zeros((6, 3, 3, 3), np.int8)}, ValueError, "x has 4 channels, w expects 3 per group"),
        (
            {3: np.zeros((6, 2), np.int8)},
            ValueError,
            r"w must be \[M, C/group, k1, ...\] with at least one spatial axis",
        ),
        ({0: np.zeros((1, 4, 5), np.uint8)}, ValueError, r"x \(1, 4, 5\) and w \(6, 2, 3, 3\) must have the same rank"),
        (
            {0: np.zeros((1, 4, 2, 2), np.uint8)},
            ValueError,
            r"the kernel \(extent \[3, 3\] with dilations\) does not fit",
        ),
        (
            {1: np.float32(3e38), 6: np.float32(1e-30)},
            ValueError,
            "x_scale \\* w_scale / y_scale overflows float32; use numerics='exact'",
        ),
    ],
)
def test_bad_input_is_a_clear_error(change, error, message):
    args = _valid()
    for i, v in change.items():
        args[i] = v
    with pytest.raises(error, match="^qlinear_conv: " + message):
        qlinear_conv(*args, group=2)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"group": 4}, "w's 6 output channels do not divide into group = 4"),
        ({"group": 0}, "group must be a positive integer"),
        ({"group": 2, "kernel_shape": [2, 2]}, r"kernel_shape \[2, 2\] differs"),
        ({"group": 2, "strides": [0, 1]}, "strides must be 2 positive integers"),
        ({"group": 2, "dilations": [1]}, "dilations must be 2 positive integers"),
        ({"group": 2, "pads": [1, 1, 1]}, "pads must be 4 non-negative integers"),
        ({"group": 2, "pads": [-1, 0, 0, 0]}, "pads must be 4 non-negative integers"),
        ({"group": 2, "auto_pad": "SAME"}, "auto_pad must be one of"),
        ({"group": 2, "auto_pad": "VALID", "pads": [1, 1, 1, 1]}, "pads cannot be given with auto_pad VALID"),
        ({"group": 2, "numerics": "float"}, "numerics must be one of"),
    ],
)
def test_bad_attributes_are_clear_errors(attrs, message):
    with pytest.raises(ValueError, match="^qlinear_conv: " + message):
        qlinear_conv(*_valid(), **attrs)


def test_bias_is_checked():
    with pytest.raises(TypeError, match="^qlinear_conv: B must be int32"):
        qlinear_conv(*_valid(), np.zeros(6, np.int64), group=2)
    with pytest.raises(ValueError, match=r"^qlinear_conv: B must have one value per output channel \(\[6\]\)"):
        qlinear_conv(*_valid(), np.zeros(5, np.int32), group=2)
    with pytest.raises(TypeError, match="^conv_integer: x must be int8 or uint8"):
        conv_integer(np.zeros((1, 4, 5, 5), np.float32), _valid()[3], group=2)


def test_inputs_are_not_modified_and_a_packed_weight_gives_the_same_bits():
    args = _valid()
    B = np.arange(6, dtype=np.int32) * 1000
    copies = [np.array(a, copy=True) for a in args] + [B.copy()]
    first = qlinear_conv(*args, B, group=2, pads=[1, 1, 1, 1])
    held = conv_weight(args[3], args[4], args[5], 2, "qlinear_conv")
    args[3][...] = 0  # the held weight is its own copy
    again = qlinear_conv(*args, B, pads=[1, 1, 1, 1], weight=held)
    np.testing.assert_array_equal(first, again)
    args[3][...] = copies[3]
    for a, c in zip(args + [B], copies):
        np.testing.assert_array_equal(a, c)


def test_empty_batch_and_zero_channels():
    x = np.zeros((0, 2, 4, 4), np.uint8)
    w = np.ones((3, 2, 3, 3), np.uint8)
    y = qlinear_conv(x, np.float32(1), np.uint8(0), w, np.float32(1), np.uint8(0), np.float32(1), np.uint8(9))
    assert y.shape == (0, 3, 2, 2) and y.dtype == np.uint8
    assert conv_integer(x, w).shape == (0, 3, 2, 2)


# --------------------------------------------------------------------------------------------------
# In the session


def _qlinear_conv_model(args, attrs, *, constant_weight=True):
    x, xs, xz, w, ws, wz, ys, yz, B = args
    values = {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "ys": ys, "yz": yz, "B": B}
    names = ["x", *[k for k, v in values.items() if v is not None]]
    inputs = [helper.make_tensor_value_info("x", _ONNX_TYPE[x.dtype], list(x.shape))]
    init = []
    for k, v in values.items():
        if v is None:
            continue
        if k == "w" and not constant_weight:
            inputs.append(helper.make_tensor_value_info("w", _ONNX_TYPE[w.dtype], list(w.shape)))
        else:
            init.append(numpy_helper.from_array(np.asarray(v), k))
    node = helper.make_node("QLinearConv", names, ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", _ONNX_TYPE[yz.dtype], None)], init
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("constant_weight", [True, False], ids=["packed", "per-call"])
def test_session_runs_qlinear_conv(constant_weight):
    rng = np.random.default_rng(21)
    for types in ORT_TYPES:
        args, attrs = random_case(rng, types, nd=2, narrow_w=_narrow())
        model = _qlinear_conv_model(args, attrs, constant_weight=constant_weight)
        feed = {"x": args[0]} if constant_weight else {"x": args[0], "w": args[3]}
        ours = InferenceSession(model).run(None, feed)[0]
        np.testing.assert_array_equal(ours, ort_qlinear_conv(*args, **attrs))
        exact = InferenceSession(model, numerics="exact").run(None, feed)[0]
        assert np.abs(exact.astype(int) - ours).max(initial=0) <= 1


def test_session_reports_a_bad_node_by_name():
    args, attrs = random_case(np.random.default_rng(0), ORT_TYPES[0], nd=2)
    model = _qlinear_conv_model(args, {**attrs, "group": 7 * attrs["group"]})
    with pytest.raises(ValueError, match=r"^InferenceSession: node 'conv' \(QLinearConv\): qlinear_conv: "):
        InferenceSession(model)


def test_session_conv_with_constant_parameters_takes_each_x_shape():
    """A node whose parameters are all initializers is checked and prepared once (QLinearConvCall), with each
    x shape's geometry kept: inputs of other shapes, and back, give qlinear_conv's bits; a bad constant is
    reported when the session is made."""
    rng = np.random.default_rng(5)
    args, attrs = random_case(rng, (np.uint8, np.int8, np.uint8), nd=2)
    attrs = {k: v for k, v in attrs.items() if k != "auto_pad"}
    model = _qlinear_conv_model(args, attrs)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "W"
    session = InferenceSession(model)
    x0 = args[0]
    for extra in (0, 3, 0, 5, 3):
        x = rng.integers(0, 256, (x0.shape[0], x0.shape[1], x0.shape[2] + extra, x0.shape[3] + 2 * extra), np.uint8)
        ours = session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(ours, qlinear_conv(x, *args[1:], **attrs))
        assert ours.flags.c_contiguous
    bad = list(args)
    bad[6] = np.float32(0)
    with pytest.raises(ValueError, match=r"^InferenceSession: node 'conv' \(QLinearConv\): qlinear_conv: y_scale must"):
        InferenceSession(_qlinear_conv_model(bad, attrs))


def _in_place_cases(w_type, count, x_type=np.uint8):
    """QLinearConvs of 8-bit x (uint8 unless x_type) with whole quads of channels and one group (1- to 3-D,
    strides, dilations, padding, rows off the kernel's 8, with and without a bias): (args, attrs, the
    attributes as QLinearConvCall takes them)."""
    rng = np.random.default_rng({"int8": 1, "uint8 zero point 128": 2, "uint8": 3}[w_type] + 10 * (x_type == np.int8))
    xi = np.iinfo(x_type)
    for case in range(count):
        nd = 1 + case % 3
        C, M = int(rng.choice([4, 8, 12, 64])), int(rng.choice([1, 5, 16, 33, 70]))
        kernel = [int(rng.integers(1, 4)) for _ in range(nd)]
        dilations = [int(rng.integers(1, 3)) for _ in range(nd)]
        strides = [int(rng.integers(1, 3)) for _ in range(nd)]
        pads = [int(rng.integers(0, k)) for k in kernel] * 2
        spatial = [(k - 1) * d + int(rng.integers(1, 9 if nd < 3 else 4)) for k, d in zip(kernel, dilations)]
        x = rng.integers(xi.min, xi.max + 1, (int(rng.integers(1, 3)), C, *spatial)).astype(x_type)
        if w_type == "int8":
            lo, hi = (-64, 64) if _narrow() else (-128, 128)
            w, wz = rng.integers(lo, hi, (M, C, *kernel), np.int8), np.zeros(M, np.int8)
        else:
            w = rng.integers(0, 256, (M, C, *kernel), np.uint8)
            wz = np.full(M, 128, np.uint8) if w_type.endswith("128") else rng.integers(0, 256, M, np.uint8)
        ws = rng.uniform(0.001, 0.01, M).astype(np.float32)
        B = rng.integers(-30000, 30000, M).astype(np.int32) if case % 2 else None
        x_zp = np.asarray(rng.integers(xi.min, xi.max + 1), x_type)
        args = (x, np.float32(0.02), x_zp, w, ws, wz, np.float32(0.5), np.asarray(9, x_type), B)  # (ORT: y as x)
        attrs = {"strides": strides, "pads": pads, "dilations": dilations, "kernel_shape": kernel}
        yield args, attrs, ("NOTSET", dilations, kernel, pads, strides)


@pytest.mark.parametrize("x_type", [np.uint8, np.int8], ids=["u8x", "s8x"])
@pytest.mark.parametrize("w_type", ["int8", "uint8 zero point 128", "uint8"])
def test_a_convolution_read_in_place_is_the_im2cols_result(isa, w_type, x_type, monkeypatch):
    """Where a kernel over receptive fields serves the level (AVX-512 VNNI's kernel_taps) the GEMM reads such an x
    in place through the table of each position's taps (padding from a row of x's zero point; int8 x as
    uint8 x + 128), without an im2col; where the b zero points need row sums (uint8 w other than 128), for a
    1x1 convolution (its rows are x's pixels) or on an entry without such a kernel, the im2col. The two give
    the same bits."""
    import quantmatmul as qm
    from quantmatmul import _core
    from quantmatmul.onnx._qconv import QLinearConvCall

    # The entry a convolution's weight is packed for (csrc/dispatch.h's qgemm_taps_kernels): AVX-512 VNNI's at
    # that level, and at amx (its tiles have no such kernel) where the CPU runs AVX-512 VNNI natively.
    reads = _core.pack_b(np.zeros((1, 4, 1), np.int8), True, True).reads_receptive_fields
    native_vnni = "avx512_vnni" in qm.available_isas()
    assert reads == (isa.startswith("avx512_vnni") or (isa.startswith("amx") and native_vnni))
    read = []
    taps = _core.qlinear_matmul_onnxruntime_taps
    monkeypatch.setattr(_core, "qlinear_matmul_onnxruntime_taps", lambda *a: read.append(taps(*a)) or read[-1])
    for args, attrs, geometry in _in_place_cases(w_type, 12, x_type):
        x = args[0]
        conv = QLinearConvCall(
            conv_weight(*args[3:6], 1, "qlinear_conv"), *args[1:3], *args[6:9], geometry, "onnxruntime"
        )
        read.clear()
        ours = conv(x)
        shapes = conv.shapes(x)
        # a table (and the kernel asked) only on an entry with such a kernel, not for a 1x1 convolution (its
        # rows are x's own pixels); the kernel declines b zero points that need row sums
        one_by_one = shapes.one_by_one  # (the cases' channels are whole quads)
        packed_for_taps = conv.weight.operand.packed.reads_receptive_fields
        assert packed_for_taps == reads
        assert (shapes.offsets is not None) == (packed_for_taps and not one_by_one)
        assert read == ([w_type != "uint8"] if packed_for_taps and not one_by_one else [])
        conv._shapes[x.shape] = shapes._replace(offsets=None)  # the im2col (its plan made again)
        conv._plans.clear()
        np.testing.assert_array_equal(ours, conv(x))
        np.testing.assert_array_equal(qlinear_conv(*args, **attrs), ours)


@pytest.mark.parametrize(
    "w_type, x_type",
    [("int8", np.uint8), ("uint8 zero point 128", np.uint8), ("int8", np.int8)],  # (ORT's kernels' types)
    ids=["u8x-s8w", "u8x-u8w128", "s8x-s8w"],
)
def test_a_convolution_read_in_place_gives_onnxruntimes_bits(w_type, x_type):
    for args, attrs, _ in _in_place_cases(w_type, 9, x_type):
        np.testing.assert_array_equal(qlinear_conv(*args, **attrs), ort_qlinear_conv(*args, **attrs))


def _depthwise_path(level: str) -> str:
    """The depthwise loop a kernel level runs (csrc/conv.h's conv_depthwise_path) for 1- and 2-D convolutions."""
    if level in ("portable", "avx2"):
        return level
    return "avx512_vnni-emulated" if level.endswith("-emulated") else "avx512_vnni"


@pytest.mark.parametrize("level", kernel_levels())
def test_depthwise_loops_of_every_build_give_the_oracles_sums(level):
    """The depthwise loop is compiled for every CPU and again in the AVX2 build (csrc/conv_loops.inc), and the
    kernel of 1- and 2-D convolutions (kernels/conv_depthwise.inc) in the AVX2 build and the AVX-512 VNNI one
    (natively and over SIMDe): each level's gives the spec's sums (ConvInteger against the oracle) with channel
    counts off the vector widths, taps inside x and in its padding, 1- and 2-D kernels up to 7 x 7 (and 9 x 9,
    past the kernels' 64 taps: the loop), 3-D (the loop); QLinearConv's requantization of them block by block
    (conv_depthwise_requantized) gives the exact numerics' oracle, and ONNX Runtime's numerics (in the
    kernels' registers) the portable loop's bits."""
    from quantmatmul import _core

    rng = np.random.default_rng(31)
    with kernel_entry("qgemm", level):
        assert _core.conv_depthwise_path() == _depthwise_path(level)
        for i, channels in enumerate((1, 7, 8, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100)):
            types = ORT_TYPES[channels % 3]
            args, attrs = random_case(rng, types, nd=2, depthwise=True, narrow_w=_narrow())
            x, _, xz, w, _, wz, *_ = args
            kernel = [(3, 3), (1, 1), (5, 5), (2, 3), (7, 7), (9, 9), (1, 4)][i % 7]
            dilations = [int(rng.integers(1, 3)) for _ in kernel]
            spatial = [int(rng.integers((k - 1) * d + 1, (k - 1) * d + 12)) for k, d in zip(kernel, dilations)]
            x = rng.integers(np.iinfo(x.dtype).min, np.iinfo(x.dtype).max + 1, (2, channels, *spatial)).astype(x.dtype)
            w = rng.integers(np.iinfo(w.dtype).min, np.iinfo(w.dtype).max + 1, (channels, 1, *kernel)).astype(w.dtype)
            wz = np.zeros((), w.dtype) if w.dtype == np.int8 else np.asarray(rng.integers(0, 256), w.dtype)
            pads = [int(rng.integers(0, k)) for k in kernel * 2]  # begins, then ends
            strides = [int(rng.integers(1, 4)) for _ in kernel]
            attrs = {**attrs, "group": channels, "kernel_shape": list(kernel), "pads": pads}
            attrs |= {"dilations": dilations, "strides": strides}
            geometry = {k: attrs[k] for k in ("group", "strides", "pads", "dilations")}
            sums = oracle_sums(x, xz, w, wz, **geometry)
            np.testing.assert_array_equal(conv_integer(x, w, xz, wz, **attrs), sums)
            B = rng.integers(-3000, 3000, channels).astype(np.int32)
            ws = rng.uniform(0.001, 0.02, channels).astype(np.float32)
            q = (x, np.float32(0.03), xz, w, ws, wz, np.float32(0.4), np.asarray(rng.integers(0, 256), np.uint8), B)
            want = exact_output(sums, B, q[1], ws, q[6], q[7])
            np.testing.assert_array_equal(qlinear_conv(*q, **attrs, numerics="exact"), want)
            ours = qlinear_conv(*q, **attrs)
            with kernel_entry("qgemm", "portable"):
                np.testing.assert_array_equal(ours, qlinear_conv(*q, **attrs))
            x1 = x[:, :, 0]  # a 1-D convolution along x's last axis
            attrs1 = {**attrs, "strides": attrs["strides"][1:], "dilations": attrs["dilations"][1:]}
            attrs1 |= {"pads": attrs["pads"][1:2] + attrs["pads"][3:4], "kernel_shape": attrs["kernel_shape"][1:]}
            w1 = w[:, :, 0]
            geometry1 = {k: attrs1[k] for k in ("group", "strides", "pads", "dilations")}
            want1 = exact_output(oracle_sums(x1, xz, w1, wz, **geometry1), B, q[1], ws, q[6], q[7])
            got1 = qlinear_conv(x1, *q[1:3], w1, *q[4:], **attrs1, numerics="exact")
            np.testing.assert_array_equal(got1, want1)
        # 3-D: the avx2 or portable loop (taps through Field)
        x3 = rng.integers(0, 256, (1, 5, 4, 5, 6)).astype(np.uint8)
        w3 = rng.integers(-128, 128, (5, 1, 2, 3, 2)).astype(np.int8)
        attrs3 = {"group": 5, "strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 1], "dilations": [1, 1, 2]}
        sums3 = oracle_sums(x3, np.uint8(9), w3, np.int8(0), **attrs3)
        np.testing.assert_array_equal(conv_integer(x3, w3, np.uint8(9), np.int8(0), **attrs3), sums3)


def _is_channels_last(y: np.ndarray) -> bool:
    return np.moveaxis(y, 1, -1).flags.c_contiguous


@pytest.mark.parametrize("numerics", ["onnxruntime", "onnx-reference", "exact"])
def test_channels_last_memory_format_is_the_same_values(numerics):
    """memory_format="channels_last": the same values as the default, as a view of channels-last memory; such
    an x (or any strided one) as the next convolution's input gives what its C-order copy gives."""
    rng = np.random.default_rng(41)
    for i in range(24):
        args, attrs = random_case(rng, ORT_TYPES[i % 3], nd=1 + i % 3, depthwise=i % 5 == 0)
        expected = qlinear_conv(*args, numerics=numerics, **attrs)
        y = qlinear_conv(*args, numerics=numerics, memory_format="channels_last", **attrs)
        assert y.shape == expected.shape and y.dtype == expected.dtype
        np.testing.assert_array_equal(y, expected)
        assert _is_channels_last(y)
        sums = conv_integer(args[0], args[3], args[2], args[5], memory_format="channels_last", **attrs)
        np.testing.assert_array_equal(sums, conv_integer(args[0], args[3], args[2], args[5], **attrs))
        assert _is_channels_last(sums) and sums.dtype == np.int32
        # the output as the input of another convolution: channels-last, strided, or C order
        x = y
        C = x.shape[1]
        w = rng.integers(-128, 128, (3, C, *[1] * (x.ndim - 2))).astype(np.int8)
        follow = (np.float32(0.02), np.zeros((), x.dtype), w, np.float32(0.01), np.int8(0), np.float32(0.3))
        follow += (np.zeros((), x.dtype),)
        reference = qlinear_conv(np.ascontiguousarray(x), *follow, numerics=numerics)
        spaced = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
        spaced[..., ::2] = x
        for variant in (x, np.asfortranarray(x), spaced[..., ::2]):  # channels-last, Fortran order, strided
            np.testing.assert_array_equal(qlinear_conv(variant, *follow, numerics=numerics), reference)


def test_memory_format_bad_input_and_pooling():
    from quantmatmul.onnx._pool import max_pool

    args = _valid()
    with pytest.raises(ValueError, match="^qlinear_conv: memory_format must be one of 'contiguous', 'channels_last'"):
        qlinear_conv(*args, group=2, memory_format="nhwc")
    with pytest.raises(ValueError, match="^conv_integer: memory_format must be one of"):
        conv_integer(args[0], args[3], memory_format=None)
    with pytest.raises(ValueError, match="^MaxPool: memory_format must be one of"):
        max_pool(args[0], kernel_shape=[2, 2], memory_format="NHWC")
    x = np.random.default_rng(2).integers(0, 256, (2, 5, 9, 7)).astype(np.uint8)
    expected = max_pool(x, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])
    pooled = max_pool(x, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], memory_format="channels_last")
    np.testing.assert_array_equal(pooled, expected)
    assert _is_channels_last(pooled) and expected.flags.c_contiguous
    again = max_pool(pooled, kernel_shape=[2, 2])  # a channels-last x read as it is
    np.testing.assert_array_equal(again, max_pool(np.ascontiguousarray(pooled), kernel_shape=[2, 2]))


@pytest.mark.parametrize(
    ("C", "spatial", "kernel", "strides", "pads", "dilations"),
    [
        (3, (23, 21), (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),  # a stem: 21-byte runs
        (5, (6, 4), (3, 3), (1, 1), (4, 5, 3, 6), (1, 1)),  # pads past the kernel: whole kernel rows outside
        (8, (9, 1), (3, 3), (1, 2), (1, 1, 1, 1), (1, 1)),  # one input column
        (4, (11, 9), (3, 2), (2, 3), (0, 1, 2, 0), (2, 1)),  # dilated rows only: the 2-D path
        (4, (11, 9), (3, 2), (1, 1), (1, 1, 1, 1), (1, 2)),  # dilated columns: the general path
        (17, (5, 6), (1, 5), (1, 1), (0, 2, 0, 2), (1, 1)),  # runs of 17 to 85 bytes
    ],
)
def test_the_two_dimensional_im2col_edges(C, spatial, kernel, strides, pads, dilations):
    """The 2-D one-group im2col (csrc/conv.cpp: a run per kernel row, the edges padded) against the oracle."""
    rng = np.random.default_rng(C)
    x = rng.integers(0, 256, (2, C, *spatial)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, C, *kernel)).astype(np.int8)
    xz = np.uint8(77)
    geometry = {"strides": list(strides), "pads": list(pads), "dilations": list(dilations)}
    np.testing.assert_array_equal(conv_integer(x, w, xz, **geometry), oracle_sums(x, xz, w, 0, **geometry))


def test_planes_transpose_as_numpy():
    """The blocked C++ transpose between channels-first and channels-last ([B, R, C] -> [B, C, R]), 1- and
    4-byte elements: a few rows (an image's channels: per column) and many (16 x 16 byte blocks, edges)."""
    from quantmatmul.onnx._qconv import _transposed

    rng = np.random.default_rng(12)
    for dtype in (np.uint8, np.int8, np.int32, np.float32):
        for B, R, C in ((1, 1, 7), (2, 3, 50_000), (1, 4, 16_385), (3, 2, 1), (1, 5, 33), (2, 17, 70), (1, 64, 3)):
            x = rng.integers(-100, 100, (B, R, C)).astype(dtype)
            np.testing.assert_array_equal(_transposed(x), x.transpose(0, 2, 1))


def test_depthwise_with_more_weights_than_the_pair_buffer():
    """The AVX2 depthwise loop interleaves a task's weights once into a 32 KB stack buffer; a 3x3 kernel
    over more than 1,638 channels does not fit, and the weights are interleaved as the taps go: the same
    sums (ConvInteger against the oracle, on both builds)."""
    import quantmatmul as qm

    rng = np.random.default_rng(77)
    C = 1664 + 5  # 104 blocks of 16 (5 tap pairs: 16,640 > 16,384 int16s) and a tail of 5
    x = rng.integers(0, 256, (1, C, 4, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (C, 1, 3, 3)).astype(np.int8)
    xz, wz = np.uint8(77), np.int8(0)
    attrs = {"group": C, "pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1]}
    want = oracle_sums(x, xz, w, wz, **attrs)
    for isa in ("portable", "avx2"):
        if isa in qm.available_isas():
            with kernel_entry("qgemm", isa):
                np.testing.assert_array_equal(conv_integer(x, w, xz, wz, **attrs), want)
