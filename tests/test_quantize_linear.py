"""test_quantize_linear.py: QuantizeLinear / DequantizeLinear (opset 21) bit for bit against onnxruntime and onnx.reference."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from peer_deviations import deviation, documented, peer_refuses  # noqa: E402

from quantmatmul.quantize_linear import dequantize_linear, quantize_linear  # noqa: E402

ort.set_default_logger_severity(4)

F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
INT4, UINT4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)
E4M3FN, E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz)
E5M2, E5M2FNUZ = np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e5m2fnuz)
FLOAT8 = [E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ]
INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    UINT4: (0, 15),
    INT4: (-8, 7),
}
INTS = list(INT_RANGES)
QUANT_TYPES = INTS + FLOAT8
SCALE_TYPES = [F32, F16, BF16]

ONNX_TYPE = {
    F32: TensorProto.FLOAT,
    F16: TensorProto.FLOAT16,
    BF16: TensorProto.BFLOAT16,
    F64: TensorProto.DOUBLE,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.uint16): TensorProto.UINT16,
    INT4: TensorProto.INT4,
    UINT4: TensorProto.UINT4,
    E4M3FN: TensorProto.FLOAT8E4M3FN,
    E4M3FNUZ: TensorProto.FLOAT8E4M3FNUZ,
    E5M2: TensorProto.FLOAT8E5M2,
    E5M2FNUZ: TensorProto.FLOAT8E5M2FNUZ,
}

SETTINGS = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------- peers


def _model(op, arrays, out_dtype, attrs, *, as_initializers):
    names = ["x", "s", "z"][: len(arrays)]
    if as_initializers:
        inputs = []
        inits = [numpy_helper.from_array(a, n) for n, a in zip(names, arrays)]
    else:
        inputs = [helper.make_tensor_value_info(n, ONNX_TYPE[a.dtype], a.shape) for n, a in zip(names, arrays)]
        inits = []
    node = helper.make_node(op, names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", ONNX_TYPE[np.dtype(out_dtype)], None)
    graph = helper.make_graph([node], "g", inputs, [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _arrays(x, scale, zero_point):
    return [x, scale] if zero_point is None else [x, scale, zero_point]


def _out_dtype(op, x, scale, zero_point):
    if op == "QuantizeLinear":
        return np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    return scale.dtype


def run_reference(op, x, scale, zero_point=None, **attrs):
    arrays = _arrays(x, scale, zero_point)
    model = _model(op, arrays, _out_dtype(op, x, scale, zero_point), attrs, as_initializers=False)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, dict(zip("xsz", arrays)))[0]


def run_ort(op, x, scale, zero_point=None, **attrs):
    """Run one node on onnxruntime's CPU provider; every input is an initializer so any dtype can be fed."""
    arrays = _arrays(x, scale, zero_point)
    out_dtype = _out_dtype(op, x, scale, zero_point)
    model = _model(op, arrays, out_dtype, attrs, as_initializers=True)
    if out_dtype in (INT4, UINT4):  # int4 outputs cannot be fetched: widen them exactly with a Cast
        model.graph.node.append(helper.make_node("Cast", ["y"], ["y8"], to=TensorProto.INT8))
        model.graph.output[0].name = "y8"
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    if out_dtype in FLOAT8 or out_dtype == BF16:  # no numpy type in onnxruntime: bind a raw output buffer
        raw = np.zeros(x.shape, dtype=np.uint8 if out_dtype.itemsize == 1 else np.uint16)
        binding = session.io_binding()
        binding.bind_ortvalue_output(
            "y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, ONNX_TYPE[out_dtype])
        )
        session.run_with_iobinding(binding)
        return raw.view(out_dtype)
    y = session.run(None, {})[0]
    return y.astype(out_dtype) if out_dtype in (INT4, UINT4) else y


# The documented refusals of onnxruntime's Quantize/DequantizeLinear, and their messages in the pinned version
ORT_REFUSALS = {
    "ort-quantize-dtypes": "NOT_IMPLEMENTED|Type Error",
    "ort-quantize-blocked-scale-1": "block_size must be 0 for per-tensor",
}


def ort_refusal(op, x, scale, block_size):
    """The deviation under which onnxruntime refuses this node, or None: it implements float32 and float16 only
    (QuantizeLinear: x and scale of the same dtype), and takes a scale of shape (1,) for per-tensor even when it
    is a valid blocked scale of a 1-D x."""
    if scale.dtype not in (F32, F16) or (op == "QuantizeLinear" and x.dtype != scale.dtype):
        return "ort-quantize-dtypes"
    if block_size > 0 and scale.shape == (1,):
        return "ort-quantize-blocked-scale-1"
    return None


def run_ort_unless_refused(op, x, scale, zero_point=None, **attrs):
    """onnxruntime's output, or None where it refuses the node as documented."""
    key = ort_refusal(op, x, scale, attrs.get("block_size", 0))
    if key is None:
        return run_ort(op, x, scale, zero_point, **attrs)
    return peer_refuses(key, lambda: run_ort(op, x, scale, zero_point, **attrs), ORT_REFUSALS[key])[1]


def bits(a):
    a = np.asarray(a)
    if a.dtype in (INT4, UINT4):
        return a.astype(np.int8)
    return a.view(f"u{a.dtype.itemsize}")


def assert_same_bits(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    diff = np.argwhere(bits(actual) != bits(expected))
    assert diff.size == 0, f"{what}: {len(diff)} differ, first at {diff[:5].tolist()}: " + str(
        [(bits(actual)[tuple(i)], bits(expected)[tuple(i)]) for i in diff[:5]]
    )


# ------------------------------------------------------------------ test-side model


def full_scale(scale, x_shape, axis, block_size):
    """Scale broadcast to x's shape, computed independently of the library's helpers."""
    if scale.ndim == 0 or scale.shape == (1,):
        return np.broadcast_to(scale.reshape(()), x_shape)
    axis %= len(x_shape)
    if block_size == 0:
        return np.broadcast_to(np.moveaxis(scale.reshape((1,) * (len(x_shape) - 1) + (-1,)), -1, axis), x_shape)
    return np.take(scale, np.arange(x_shape[axis]) // block_size, axis=axis)


def quotient(x, scale, axis, block_size):
    compute = F64 if x.dtype == F64 else F32
    with np.errstate(all="ignore"):
        return x.astype(compute) / full_scale(scale, x.shape, axis, block_size).astype(compute)


def saturated_spec(v, out_dtype):
    """Where a peer may send the quotient through an out-of-range int32 conversion, and what the library gives there:
    NaN -> the type's minimum, huge or infinite quotients -> the bound of their sign."""
    low, high = INT_RANGES[out_dtype]
    with np.errstate(all="ignore"):
        unreliable = np.isnan(v) | (np.abs(v) >= 2.0**30)  # int32 conversion overflows from 2**31 on
    return unreliable, np.where(v > 0, high, low)


def resolve_documented_divergences(peer_out, v, out_dtype, saturate, *, peer):
    """A peer's output with each documented difference resolved the way the library does.

    Integer outputs: |x / scale| >= 2**31 and +Inf become the type maximum (spec), NaN the type minimum. The
    reference converts through int32 first, which gives the minimum for +Inf and, with a negative zero point,
    wraps NaN to the maximum; so did onnxruntime's kernels other than the per-tensor float32 one up to 1.31.
    float8, reference only: e5m2 NaN is 0x7F/0xFF and the two saturate=False quirks of onnxruntime.
    A divergence the installed peer does not have (peer_deviations.py) is not resolved: its bits must be ours.
    """
    out = np.array(peer_out, copy=True)
    if out_dtype in INT_RANGES:
        if not documented("onnx-quantize-int32" if peer == "reference" else "ort-quantize-int32"):
            return out
        huge, spec = saturated_spec(v, out_dtype)
        out[huge] = spec[huge].astype(np.int8 if out_dtype in (INT4, UINT4) else out_dtype).astype(out_dtype)
        return out
    if peer == "onnxruntime":
        return out
    u = out.view(np.uint8)
    sign = np.where(np.signbit(v), 0x80, 0).astype(np.uint8)
    magnitude = np.abs(v)
    if out_dtype == E5M2 and documented("onnx-e5m2-nan"):
        nan = np.isnan(v)
        u[nan] = 0x7F | sign[nan]
    if not saturate and out_dtype == E4M3FN:
        quirk = (magnitude >= 480) & (magnitude < 496)
        u[quirk] = 0x7E | sign[quirk]
    if not saturate and out_dtype == E5M2:
        quirk = (magnitude >= 61440) & (magnitude < 65536)
        u[quirk] = 0x7F | sign[quirk]
    return out


def reference_inputs(x, scale):
    """The reference divides two 16-bit floats in 16 bits; onnxruntime (and the library) widen to float32 first."""
    if x.dtype in (F16, BF16) and scale.dtype in (F16, BF16):
        return x.astype(F32), scale.astype(F32)
    return x, scale


def check_quantize(x, scale, zero_point=None, *, axis=1, block_size=0, saturate=True):
    attrs = {"axis": axis, "block_size": block_size, "saturate": int(saturate)}
    originals = [np.array(a, copy=True) for a in _arrays(x, scale, zero_point)]
    ours = quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, saturate=saturate)
    for before, after in zip(originals, _arrays(x, scale, zero_point)):
        assert_same_bits(after, before, "input modified")
    out_dtype = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    v = quotient(x, scale, axis, block_size)

    ort_out = run_ort_unless_refused("QuantizeLinear", x, scale, zero_point, **attrs)
    if ort_out is not None:
        ort_out = resolve_documented_divergences(ort_out, v, out_dtype, saturate, peer="onnxruntime")
        assert_same_bits(ours, ort_out, "onnxruntime")

    rx, rs = reference_inputs(x, scale)
    ref = run_reference("QuantizeLinear", rx, rs, zero_point, **attrs)
    ref = resolve_documented_divergences(ref, v, out_dtype, saturate, peer="reference")
    assert_same_bits(ours, ref, "reference")
    return ours


def check_dequantize(x, scale, zero_point=None, *, axis=1, block_size=0):
    attrs = {"axis": axis, "block_size": block_size}
    originals = [np.array(a, copy=True) for a in _arrays(x, scale, zero_point)]
    ours = dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size)
    for before, after in zip(originals, _arrays(x, scale, zero_point)):
        assert_same_bits(after, before, "input modified")
    ort_out = run_ort_unless_refused("DequantizeLinear", x, scale, zero_point, **attrs)
    if ort_out is not None:
        assert_same_bits(ours, ort_out, "onnxruntime")
    assert_same_bits(ours, run_reference("DequantizeLinear", x, scale, zero_point, **attrs), "reference")
    return ours


# ------------------------------------------------------------------------ strategies


@st.composite
def layouts(draw):
    """(x shape, scale shape, axis, block_size) for a per-tensor, per-axis or blocked scale."""
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    kind = draw(st.sampled_from(["tensor", "tensor1", "axis", "blocked"])) if rank else "tensor"
    if kind == "tensor":
        return shape, (), draw(st.integers(-3, 3)), 0
    if kind == "tensor1":
        return shape, (1,), 1, 0
    axis = draw(st.integers(-rank, rank - 1))
    if kind == "axis":
        return shape, (shape[axis],), axis, 0
    block_size = draw(st.integers(1, 4))
    scale_shape = list(shape)
    scale_shape[axis] = math.ceil(shape[axis] / block_size)
    return shape, tuple(scale_shape), axis, block_size


SPECIAL_QUOTIENTS = [
    math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 2.0**31, -(2.0**31), 1e10, -1e10, 3e38,
    255.5, 127.5, -128.5, 32767.5, 65535.5, 7.5, -8.5, 15.5,
    448.0, 464.0, 465.0, 480.0, 490.0, 496.0, 512.0, 240.0, 248.0, 57344.0, 61440.0, 65504.0, 65536.0,
    2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-17, 2.0**-18,
]
quotients = st.one_of(
    st.integers(-70000, 70000).map(lambda k: k + 0.5),
    st.floats(-300, 300),
    st.floats(-70000, 70000),
    st.floats(-1, 1),
    st.sampled_from(SPECIAL_QUOTIENTS),
)
scale_values = st.one_of(
    st.sampled_from([2.0**k for k in range(-8, 5)] + [-0.5]),
    st.floats(1e-3, 20.0),
)


@SETTINGS
@given(data=st.data())
def test_quantize_matches_peers(data):
    shape, scale_shape, axis, block_size = data.draw(layouts())
    out_dtype = data.draw(st.sampled_from(QUANT_TYPES))
    x_dtype = data.draw(st.sampled_from([F32, F32, F16, BF16, F64]))
    same = F32 if x_dtype == F64 else x_dtype
    scale_dtype = data.draw(st.sampled_from([same, same, same, F32, F16, BF16]))
    scale = data.draw(hnp.arrays(F64, scale_shape, elements=scale_values)).astype(scale_dtype)
    u = data.draw(hnp.arrays(F64, shape, elements=quotients))
    with np.errstate(all="ignore"):
        x = (u * full_scale(scale, shape, axis, block_size).astype(F64)).astype(x_dtype)
    zero_point = None
    if data.draw(st.booleans()):
        if out_dtype in FLOAT8:
            zero_point = np.zeros(scale_shape, out_dtype)
        else:
            low, high = INT_RANGES[out_dtype]
            zero_point = data.draw(hnp.arrays(np.int64, scale_shape, elements=st.integers(low, high)))
            zero_point = zero_point.astype(np.int8 if out_dtype in (INT4, UINT4) else out_dtype).astype(out_dtype)
    elif out_dtype != np.uint8:
        zero_point = np.zeros(scale_shape, out_dtype)
    saturate = data.draw(st.booleans())
    check_quantize(x, scale, zero_point, axis=axis, block_size=block_size, saturate=saturate)


@SETTINGS
@given(data=st.data())
def test_dequantize_matches_peers(data):
    shape, scale_shape, axis, block_size = data.draw(layouts())
    x_dtype = data.draw(st.sampled_from(QUANT_TYPES))
    scale_dtype = data.draw(st.sampled_from([F32, F32, F16, BF16]))
    extremes = st.sampled_from([1e-9, 6e-8, 3e4, 6e4, 1e30])  # overflow and subnormal products in 16-bit outputs
    with np.errstate(all="ignore"):
        scale = data.draw(hnp.arrays(F64, scale_shape, elements=st.one_of(scale_values, extremes))).astype(scale_dtype)
    scale[(scale == 0) | ~np.isfinite(scale)] = 1  # what a 16-bit scale cannot hold
    if x_dtype in FLOAT8:
        x = data.draw(hnp.arrays(np.uint8, shape)).view(x_dtype)
        zero_point = np.zeros(scale_shape, x_dtype) if data.draw(st.booleans()) else None
    else:
        low, high = INT_RANGES[x_dtype]
        wide = np.int8 if x_dtype in (INT4, UINT4) else x_dtype
        x = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(low, high))).astype(wide).astype(x_dtype)
        zero_point = None
        if data.draw(st.booleans()):
            zero_point = data.draw(hnp.arrays(np.int64, scale_shape, elements=st.integers(low, high)))
            zero_point = zero_point.astype(wide).astype(x_dtype)
    check_dequantize(x, scale, zero_point, axis=axis, block_size=block_size)


# --------------------------------------------------------------- float8 edge cases


def _float8_edge_values(dtype):
    """Every finite value of dtype, the exact midpoints between neighbours (ties), their float32 neighbours,
    and the special values."""
    finite = np.arange(256, dtype=np.uint8).view(dtype).astype(F32)
    finite = np.unique(finite[np.isfinite(finite)])
    mids = ((finite[:-1].astype(F64) + finite[1:]) / 2).astype(F32)
    top = float(ml_dtypes.finfo(dtype).max)
    beyond = np.array([top * f for f in (1.03125, 1.0625, 1.07, 1.09375, 1.1, 1.125, 1.14, 1.2, 2, 1e6)], F32)
    edges = np.concatenate([finite, mids, beyond, -beyond])
    edges = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))])
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-40, -1e-40, 3e38, -3e38], F32)
    return np.concatenate([edges, specials])


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: d.name)
@pytest.mark.parametrize("saturate", [True, False])
def test_float8_ties_overflow_and_specials(dtype, saturate):
    x = _float8_edge_values(dtype)
    check_quantize(x, np.float32(1.0), np.zeros((), dtype), saturate=saturate)
    # the same through a float16 input and a non-trivial power-of-two scale
    x16 = (x[~(np.abs(x) > 16000)] * 4).astype(F16)  # keeps NaN and the float16-sized values
    check_quantize(x16, np.float16(4.0), np.zeros((), dtype), saturate=saturate)


@pytest.mark.parametrize("out_dtype", QUANT_TYPES, ids=lambda d: d.name)
def test_every_float16_input(out_dtype):
    x = np.arange(1 << 16, dtype=np.uint16).view(F16).reshape(256, 256)
    zero_point = np.zeros((), out_dtype)
    for scale in (np.float16(1.0), np.float16(0.3), np.float16(2.0**-20)):
        for saturate in (True, False) if out_dtype in FLOAT8 else (True,):
            check_quantize(x, np.asarray(scale), zero_point, saturate=saturate)


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: d.name)
def test_float8_saturate_rules(dtype):
    top = float(ml_dtypes.finfo(dtype).max)
    x = np.array([np.inf, -np.inf, 1e30, -1e30, np.nan], F32)
    zp = np.zeros((), dtype)
    sat = quantize_linear(x, np.float32(1), zp).astype(F32)
    assert sat[:4].tolist() == [top, -top, top, -top]  # +-Inf -> +-max for all four types
    assert np.isnan(sat[4])
    raw = quantize_linear(x, np.float32(1), zp, saturate=False).astype(F32)
    if dtype == E5M2:
        assert raw[:4].tolist() == [np.inf, -np.inf, np.inf, -np.inf]
        assert np.isnan(raw[4])
    else:
        assert np.isnan(raw).all()


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: d.name)
@pytest.mark.parametrize("scale_dtype", SCALE_TYPES, ids=lambda d: d.name)
def test_dequantize_every_float8_value(dtype, scale_dtype):
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(16, 16)
    check_dequantize(x, np.array(0.375, scale_dtype))
    check_dequantize(x, (np.arange(16) + 1).astype(scale_dtype) / 8, np.zeros(16, dtype), axis=0)


# ---------------------------------------------------------------- integer edge cases


@pytest.mark.parametrize("out_dtype", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("x_dtype", [F32, F16, BF16, F64], ids=lambda d: d.name)
def test_integer_ties_saturation_and_specials(out_dtype, x_dtype):
    low, high = INT_RANGES[out_dtype]
    halves = np.arange(low - 3, high + 3, max(1, (high - low) // 300)) + 0.5
    specials = [np.nan, -np.nan, np.inf, -np.inf, 2.0**31, -(2.0**31), 2.0**32, 1e10, -1e10, 3e38, -0.0]
    with np.errstate(over="ignore"):
        x = np.concatenate([halves, -halves, specials]).astype(x_dtype)
    scale_dtype = F32 if x_dtype == F64 else x_dtype
    zero_point = np.array((low + high + 1) // 2, out_dtype)
    check_quantize(x, np.array(1.0, scale_dtype), zero_point)
    check_quantize(x, np.array(0.5, scale_dtype), np.array(low, out_dtype))


@pytest.mark.parametrize("out_dtype", INTS, ids=lambda d: d.name)
def test_nan_quantizes_to_the_type_minimum_whatever_the_zero_point(out_dtype):
    x = np.full(70, np.nan, F32)  # long enough for onnxruntime's vectorized path
    x[::3] = -np.nan
    low, high = INT_RANGES[out_dtype]
    for zp in {low, high, (low + high) // 2}:
        zero_point = np.array(zp, np.int8 if out_dtype in (INT4, UINT4) else out_dtype).astype(out_dtype)
        out = quantize_linear(x, np.float32(0.5), zero_point)
        assert (out.astype(np.int32) == low).all()
        # onnxruntime's per-tensor float32 kernel (MLAS) agrees; its int4 kernel too from 1.32
        if out_dtype not in (INT4, UINT4) or not documented("ort-quantize-int32"):
            assert_same_bits(out, run_ort("QuantizeLinear", x, np.float32(0.5), zero_point))


def test_integer_round_trip_is_within_half_a_step():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(4, 33)).astype(F32)
    scale = (np.abs(x).max(axis=1) / 127).astype(F32)
    q = quantize_linear(x, scale, np.zeros(4, np.int8), axis=0)
    back = dequantize_linear(q, scale, np.zeros(4, np.int8), axis=0)
    assert np.all(np.abs(back - x) <= scale[:, None] / 2 * (1 + 1e-6))


# -------------------------------------------------------------- layouts and dtypes


def test_blocked_with_a_partial_last_block_and_negative_axis():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7, 5)).astype(F32)
    scale = rng.uniform(0.01, 0.1, (3, 3, 5)).astype(F32)
    zp = rng.integers(-8, 8, (3, 3, 5)).astype(np.int8).astype(INT4)
    q = check_quantize(x, scale, zp, axis=-2, block_size=3)
    check_dequantize(q, scale, zp, axis=-2, block_size=3)
    q8 = check_quantize(x, scale, np.zeros((3, 3, 5), E4M3FN), axis=1, block_size=3)
    check_dequantize(q8, scale, axis=1, block_size=3)


LARGE_LAYOUTS = [  # (scale shape, axis, block_size) for x of shape (3, 64, 40): onnxruntime's vectorized paths
    ((), 1, 0),
    ((64,), 1, 0),
    ((40,), -1, 0),
    ((3, 4, 40), 1, 16),
    ((3, 64, 2), -1, 32),
    ((3, 64, 3), 2, 16),
]


@pytest.mark.parametrize("out_dtype", QUANT_TYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("x_dtype", [F32, F16], ids=lambda d: d.name)
def test_large_arrays_in_every_layout(out_dtype, x_dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 64, 40)) * 40).astype(x_dtype)
    x.flat[::97] = np.nan
    x.flat[1::89] = np.inf
    x.flat[2::83] = -np.inf
    for scale_shape, axis, block_size in LARGE_LAYOUTS:
        scale = rng.uniform(0.05, 2.0, scale_shape).astype(x_dtype)
        if out_dtype in FLOAT8:
            zero_point = np.zeros(scale_shape, out_dtype)
        else:
            low, high = INT_RANGES[out_dtype]
            zero_point = rng.integers(low, high + 1, scale_shape).astype(np.int32).astype(out_dtype)
        for saturate in (True, False) if out_dtype in FLOAT8 else (True,):
            q = check_quantize(x, scale, zero_point, axis=axis, block_size=block_size, saturate=saturate)
        check_dequantize(q, scale, zero_point, axis=axis, block_size=block_size)


def test_float16_quantize_divides_in_float32_like_onnxruntime():
    # some of these quotients round to different integers when rounded to float16 first, as the reference does
    x = (np.arange(-2000, 2000) * 0.3).astype(F16)
    scale = np.float16(0.3)
    ours = check_quantize(x, np.asarray(scale), np.zeros((), np.int16))
    ref16 = run_reference("QuantizeLinear", x, np.asarray(scale), np.zeros((), np.int16))
    deviation("onnx-quantize-16-bit-division", (ours != ref16).any())


def test_documented_integer_saturation_divergences_are_real():
    x = np.array([[np.inf, 3e9], [2e9, -np.inf]], F32)
    spec = np.array([[127, 127], [127, -128]], np.int8)
    wrapped = np.array([[-128, -128], [127, -128]], np.int8)
    blocked = {"axis": 0, "block_size": 2}
    one, zero = np.ones((1, 2), F32), np.zeros((1, 2), np.int8)
    with np.errstate(over="ignore"):
        x16 = x.astype(F16)
    nan = np.full((1, 2), np.nan, F32)
    minimum, maximum = np.full((1, 2), -128, np.int8), np.full((1, 2), 127, np.int8)
    # we saturate as the spec says, whatever the layout, and give NaN the type minimum; so does onnxruntime's
    # per-tensor float32 kernel (MLAS)
    saturated = [quantize_linear(x, np.float32(1), np.int8(0)), quantize_linear(x, one, zero, **blocked),
                 quantize_linear(x16, np.float16(1), np.int8(0)),
                 run_ort("QuantizeLinear", x, np.float32(1), np.int8(0))]
    for out in saturated:
        assert_same_bits(out, spec)
    assert_same_bits(quantize_linear(nan, np.float32(1), np.int8(-1)), minimum)
    assert_same_bits(run_ort("QuantizeLinear", nan, np.float32(1), np.int8(-1)), minimum)
    # the reference converts through int32 first (INT32_MIN for +Inf; NaN with a negative zero point wraps)
    ref = run_reference("QuantizeLinear", x, np.float32(1), np.int8(0))
    ref_nan = run_reference("QuantizeLinear", nan, np.float32(1), np.int8(-1))
    if deviation("onnx-quantize-int32", np.array_equal(ref, wrapped)):
        assert_same_bits(ref_nan, maximum)
    else:
        assert_same_bits(ref, spec)
        assert_same_bits(ref_nan, minimum)
    # so did onnxruntime's blocked and float16 kernels up to 1.31; 1.32 saturates in every kernel
    ort_blocked = run_ort("QuantizeLinear", x, one, zero, **blocked)
    ort_f16 = run_ort("QuantizeLinear", x16, np.float16(1), np.int8(0))
    ort_nan = run_ort("QuantizeLinear", nan, one, np.full((1, 2), -1, np.int8), **blocked)
    if deviation("ort-quantize-int32", not np.array_equal(ort_blocked, spec)):
        assert_same_bits(ort_blocked, wrapped)
        assert ort_f16[0, 0] == -128
        assert_same_bits(ort_nan, maximum)
    else:
        assert_same_bits(ort_blocked, spec)
        assert_same_bits(ort_f16, spec)
        assert_same_bits(ort_nan, minimum)


def test_documented_float8_divergences_are_real():
    # NaN to float8e5m2: 0x7F / 0xFF in onnxruntime and here, 0x7E / 0xFE in the reference (all NaN)
    x, zp = np.array([np.nan, -np.nan], F32), np.zeros((), E5M2)
    ort_out = run_ort("QuantizeLinear", x, np.float32(1), zp)
    assert_same_bits(quantize_linear(x, np.float32(1), zp), ort_out)
    ref = run_reference("QuantizeLinear", x, np.float32(1), zp)
    deviation("onnx-e5m2-nan", bits(ref).tolist() == [0x7E, 0xFE])
    # saturate=0, onnxruntime's converters (followed here): e4m3fn 480 -> 448 and e5m2 61440 -> NaN, where
    # rounding to nearest (the reference) gives NaN and Inf
    quirks = []
    for dtype, value, quirk in [(E4M3FN, 480.0, 448.0), (E5M2, 61440.0, np.nan)]:
        x, zp = np.array([value, -value], F32), np.zeros((), dtype)
        ort_out = run_ort("QuantizeLinear", x, np.float32(1), zp, saturate=0)
        ref = run_reference("QuantizeLinear", x, np.float32(1), zp, saturate=0)
        assert (bits(ort_out) != bits(ref)).all() or not documented("ort-float8-unsaturated-quirks"), (dtype, value)
        quirks.append(np.array_equal(ort_out.astype(F32), np.array([quirk, -quirk], F32), equal_nan=True))
        if quirks[-1]:
            assert_same_bits(quantize_linear(x, np.float32(1), zp, saturate=False), ort_out)
    deviation("ort-float8-unsaturated-quirks", all(quirks))


def test_peers_ignore_or_reject_nonzero_float8_zero_points_and_we_reject():
    x = np.array([1.0, 2.0], F32)
    zp, plain = np.array(1.0, E4M3FN), np.zeros((), E4M3FN)
    # both peers silently ignore it when quantizing ...
    same = [np.array_equal(bits(run(op, x, np.float32(1), zp)), bits(run(op, x, np.float32(1), plain)))
            for run, op in ((run_ort, "QuantizeLinear"), (run_reference, "QuantizeLinear"))]
    deviation("ort-float8-zero-point", same[0])
    deviation("onnx-float8-zero-point", same[1])
    with pytest.raises(ValueError, match=r"^quantize_linear: .*float8 zero point must be \+0"):
        quantize_linear(x, np.float32(1), zp)
    # ... and onnxruntime rejects it when dequantizing, -0 as well
    q = x.astype(E4M3FN)
    for bad in (zp, np.array(-0.0, E4M3FN)):
        peer_refuses("ort-float8-zero-point", lambda bad=bad: run_ort("DequantizeLinear", q, np.float32(1), bad),
                     "should have no zero point or all zero points should be 0")
        with pytest.raises(ValueError, match=r"^dequantize_linear: .*float8 zero point must be \+0"):
            dequantize_linear(q, np.float32(1), bad)


def test_scalar_inputs_and_python_scales():
    assert_same_bits(quantize_linear(np.float32(3.0), 0.5), np.array(6, np.uint8))
    assert_same_bits(quantize_linear(np.float16(3.0), 0.5, np.int8(1)), np.array(7, np.int8))
    assert_same_bits(dequantize_linear(np.int8(3), 0.5), np.array(1.5, F32))
    check_quantize(np.array(2.5, F32), np.array([0.5], F32), np.array([1], np.int8))


def test_empty_inputs():
    for x, scale, kwargs in [
        (np.zeros((0, 3), F32), np.float32(0.5), {}),
        (np.zeros((0, 3), F32), np.ones(3, F32), {"axis": 1}),
        (np.zeros((0, 3), F32), np.ones((0, 3), F32), {"axis": 0, "block_size": 2}),
    ]:
        q = quantize_linear(x, scale, **kwargs)
        assert q.shape == x.shape and q.dtype == np.uint8
        y = dequantize_linear(q, scale, **kwargs)
        assert y.shape == x.shape and y.dtype == F32


def test_read_only_and_non_contiguous_inputs():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((6, 10)).astype(F32)
    x = base[::2, ::-3].T  # non-contiguous, shape (4, 3)
    scale = np.linspace(0.01, 0.03, 8).astype(F32)[::2][:3]
    zp = np.array([1, -2, 3, 0, 0, 0], np.int8)[::2]
    for a in (base, scale, zp):
        a.flags.writeable = False
    q = quantize_linear(x, scale, zp, axis=1)
    assert_same_bits(q, quantize_linear(np.ascontiguousarray(x), scale.copy(), zp.copy(), axis=1))
    q.flags.writeable = False
    y = dequantize_linear(q[:, ::-1], scale[::-1], zp[::-1], axis=1)
    assert_same_bits(y, dequantize_linear(np.ascontiguousarray(q[:, ::-1]), scale[::-1].copy(), zp[::-1].copy(), axis=1))
    check_quantize(np.ascontiguousarray(x), scale.copy(), zp.copy(), axis=1)


def test_per_tensor_ignores_axis_like_the_peers():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    check_quantize(x, np.float32(0.5), np.int8(0), axis=7)
    check_dequantize(x.astype(np.int8), np.array([0.5], F32), axis=-9)


# ------------------------------------------------------------------------- errors

X = np.ones((2, 3, 4), F32)
Q = np.ones((2, 3, 4), np.int8)
S = np.float32(0.5)

BAD_QUANTIZE = [
    ((X.astype(np.int32), S), {}, TypeError, "x must have dtype"),
    ((X.astype(np.complex64), S), {}, TypeError, "x must have dtype"),
    ((X, np.float64(0.5)), {}, TypeError, "y_scale must have dtype"),
    ((X, np.int32(1)), {}, TypeError, "y_scale must have dtype"),
    ((X, S, np.int32(0)), {}, TypeError, "y_zero_point must have dtype"),
    ((X, S, 0), {}, TypeError, "y_zero_point must have dtype"),
    ((X, np.ones(3, F32), np.zeros(4, np.int8)), {}, ValueError, "zero point must have the scale's shape"),
    ((X, np.ones(3, F32), np.zeros((), np.int8)), {}, ValueError, "zero point must have the scale's shape"),
    ((X, np.ones(4, F32)), {}, ValueError, "per-axis scale must have length x.shape[1] = 3"),
    ((X, np.ones((2, 3), F32)), {}, ValueError, "scale must be a scalar, have shape (1,), or be 1-D"),
    ((X, np.ones(2, F32)), {"axis": 3}, ValueError, "axis must be in [-3, 2]"),
    ((X, np.ones(2, F32)), {"axis": -4}, ValueError, "axis must be in [-3, 2]"),
    ((X, np.ones((2, 3, 2), F32)), {"axis": 2, "block_size": -1}, ValueError, "block_size must be >= 0"),
    ((X, np.ones((2, 3, 3), F32)), {"axis": 2, "block_size": 2}, ValueError, "must have shape (2, 3, 2)"),
    ((X, np.ones((2, 1, 2), F32)), {"axis": 2, "block_size": 2}, ValueError, "must have shape (2, 3, 2)"),
    ((X, S), {"block_size": 2}, ValueError, "must have shape (2, 2, 4)"),
    ((np.float32(1), np.ones(2, F32)), {}, ValueError, "x is a scalar"),
    ((X, np.float32(0)), {}, ValueError, "scale must be nonzero"),
    ((X, np.array([1, 0, 1], F32)), {}, ValueError, "scale must be nonzero"),
    ((X, np.float32(np.inf)), {}, ValueError, "scale must be finite"),
    ((X, np.float16(np.nan)), {}, ValueError, "scale must be finite"),
    ((X, S, np.zeros((), E5M2)), {"axis": 1.5}, TypeError, "axis must be an integer"),
    ((X, S), {"block_size": "2"}, TypeError, "block_size must be an integer"),
    ((X, S), {"saturate": "yes"}, TypeError, "saturate must be a bool"),
]


BAD_DEQUANTIZE = [
    ((X, S), {}, TypeError, "x must have dtype"),
    ((Q.astype(np.int32), S), {}, TypeError, "x must have dtype"),
    ((Q, np.float64(0.5)), {}, TypeError, "x_scale must have dtype"),
    ((Q, S, np.uint8(0)), {}, TypeError, "x_zero_point must have x's dtype int8"),
    ((Q, np.ones(3, F32), np.zeros(1, np.int8)), {}, ValueError, "zero point must have the scale's shape"),
    ((Q, np.ones(5, F32)), {}, ValueError, "per-axis scale must have length x.shape[1] = 3"),
    ((Q, np.ones(3, F32)), {"axis": -5}, ValueError, "axis must be in [-3, 2]"),
    ((Q, np.ones((1, 3, 4), F32)), {"axis": 0, "block_size": 1}, ValueError, "must have shape (2, 3, 4)"),
    ((Q, np.ones((2, 3, 2), F32)), {"axis": 2, "block_size": -2}, ValueError, "block_size must be >= 0"),
    ((Q, np.float32(0)), {}, ValueError, "scale must be nonzero"),
    ((Q, np.float32(-np.inf)), {}, ValueError, "scale must be finite"),
    ((Q.astype(E4M3FN), S, np.array(0.5, E4M3FN)), {}, ValueError, "float8 zero point must be +0"),
]


@pytest.mark.parametrize("fn, args, kwargs, exc, fragment",
                         [(quantize_linear, *case) for case in BAD_QUANTIZE]
                         + [(dequantize_linear, *case) for case in BAD_DEQUANTIZE])
def test_bad_input_is_rejected_with_the_function_name(fn, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{fn.__name__}: ") and fragment in message, message


@pytest.mark.parametrize("out_dtype", [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)], ids=str)
def test_the_compiled_loops_of_both_builds_give_the_formulas_bits(out_dtype):
    """float32 <-> 8- and 16-bit integers per tensor and per axis run in C++ (csrc/quantize_linear.h),
    in a baseline build and an AVX2 one (8 values at a time, tails scalar): both give the formula's
    bits (float32 x / scale rounded half to even, + zero point, saturated, NaN -> minimum; float32
    (q - zero point) * scale), over ties, specials, tails and channel runs cut by the 64 K-element tasks."""
    import quantmatmul as qm
    from quantmatmul import _core

    rng = np.random.default_rng(1414)
    low, high = INT_RANGES[out_dtype]
    x = (rng.standard_normal((3, 5, 9001)) * 300).astype(F32)
    x.flat[::101] = np.round(x.flat[::101]) + 0.5  # ties once divided by a scale of 1
    x.flat[1::97], x.flat[2::89], x.flat[3::83] = np.nan, np.inf, -np.inf
    x.flat[4::79] = 3e38
    before = qm.cpu_info()["isa"]
    try:
        for isa in ("portable", "avx2"):
            if isa not in qm.available_isas():
                continue
            qm.set_isa(isa)
            assert _core.quantize_linear_path() == isa
            for axis in (None, 0, 1, 2):
                shape = () if axis is None else (x.shape[axis],)
                scale = rng.choice([1.0, 0.7, 3.0], shape).astype(F32)
                zero_point = rng.integers(low, high + 1, shape).astype(out_dtype)
                expand = [1] * 3
                if axis is not None:
                    expand[axis] = -1
                s, z = scale.reshape(expand), zero_point.reshape(expand)
                with np.errstate(all="ignore"):
                    v = np.rint(x / s) + z.astype(F32)
                expected = np.where(np.isnan(v), low, np.clip(v, low, high)).astype(np.int64).astype(out_dtype)
                y = quantize_linear(x, scale, zero_point, axis=axis if axis is not None else 1)
                assert np.array_equal(y, expected), (isa, axis)
                back = dequantize_linear(y, scale, zero_point, axis=axis if axis is not None else 1)
                assert np.array_equal(back, (y.astype(F32) - z.astype(F32)) * s), (isa, axis)
    finally:
        qm.set_isa(before)


def test_the_per_tensor_shortcut_gives_the_full_paths_bits_and_errors():
    """A float32 ndarray with a float32 scalar scale (the per-token call) skips most of the Python
    checks: the same results as the full path (taken here with an axis of another integer type),
    and anything it does not take (bad scales, odd attributes) still gets the full path's error."""
    rng = np.random.default_rng(77)
    x = (rng.standard_normal((3, 70)) * 50).astype(F32)
    x.flat[::13] = np.nan
    for zero_point in (None, np.int8(-3), np.uint8(200), np.array([7], np.int16), np.array(9, np.uint16)):
        for scale in (np.float32(0.7), np.array([0.7], F32), np.array(0.7, F32)):
            fast = quantize_linear(x, scale, zero_point)
            full = quantize_linear(x, scale, zero_point, axis=np.int64(1))
            assert fast.dtype == full.dtype and np.array_equal(fast, full), (zero_point, scale)
            back = dequantize_linear(fast, scale, None if zero_point is None else zero_point)
            assert np.array_equal(back, dequantize_linear(fast, scale, zero_point, axis=np.int64(1)))
    for scale in (np.float32(0), np.float32(np.nan), np.float32(np.inf)):
        with pytest.raises(ValueError, match="^quantize_linear: scale must be"):
            quantize_linear(x, scale, np.uint8(0))
        with pytest.raises(ValueError, match="^dequantize_linear: scale must be"):
            dequantize_linear(np.zeros(3, np.uint8), scale, np.uint8(0))
    with pytest.raises(TypeError, match="^quantize_linear: axis must be an integer"):
        quantize_linear(x, np.float32(1), np.uint8(0), axis="1")
    with pytest.raises(TypeError, match="^dequantize_linear: x_zero_point must have x's dtype"):
        dequantize_linear(np.zeros(3, np.uint8), np.float32(1), np.int8(0))
