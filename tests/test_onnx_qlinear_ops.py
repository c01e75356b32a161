"""test_onnx_qlinear_ops.py: com.microsoft QLinearAdd, QLinearMul and QLinearSoftmax (onnx/_qlinear_ops.py) against ONNX Runtime's CPU kernels bit for bit: every 8-bit value pair under many scales and zero points, each broadcasting functor, general broadcasting and vector tails, saturation, rounding ties, softmax axes and opsets, bad input."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_bits import same_bits
from ort_quantizer import float_model, quantize_static_model
from peer_deviations import pinned_only

from quantmatmul import peers
from quantmatmul.onnx import _qlinear_ops
from quantmatmul.onnx._qlinear_ops import _span_mode, qlinear_add, qlinear_mul, qlinear_softmax

# The functions reproduce the kernels of the pinned ONNX Runtime (constraints.txt), down to the wheel's
# compiler contractions and a softmax quotient that changed during 2026: against another release (the
# device host's 1.30, make test-latest) the bit-for-bit comparisons are not the claim, and are skipped.
ORT_PINNED = pinned_only("onnxruntime", "reproduces the kernels of")

F32, U8, S8 = np.float32, np.uint8, np.int8
ELEM = {np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8}
BINARY = {"QLinearAdd": qlinear_add, "QLinearMul": qlinear_mul}
BINARY_INPUTS = ["A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point", "C_scale", "C_zero_point"]
SOFTMAX_INPUTS = ["X", "X_scale", "x_zero_point", "y_scale", "y_zero_point"]
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(node, inputs, output_type, initializers=()):
    graph = helper.make_graph(
        [node], node.op_type, inputs, [helper.make_tensor_value_info(node.output[0], output_type, None)], initializers
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


@functools.cache
def binary_session(op: str, dtype, c_zero_point: bool = True):
    """One node with every input fed and no fixed shapes: one session serves every shape. ORT's type
    inference wants A's and B's zero points; only C's may be left out."""
    names = BINARY_INPUTS if c_zero_point else BINARY_INPUTS[:-1]
    elem = ELEM[np.dtype(dtype)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if n.endswith("scale") else elem, None) for n in names]
    return peers.session(_model(helper.make_node(op, names, ["C"], domain="com.microsoft"), inputs, elem))


def check_binary(op, A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp) -> np.ndarray:
    args = (A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp)
    feed = {n: np.asarray(v) for n, v in zip(BINARY_INPUTS, args) if v is not None}
    expected = binary_session(op, A.dtype, C_zp is not None).run(None, feed)[0]
    got = BINARY[op](*args)
    same_bits(
        got,
        expected,
        f"{op} {A.dtype} A{A.shape} B{B.shape} scales {A_scale!r} {B_scale!r} {C_scale!r} zero points "
        f"{A_zp} {B_zp} {C_zp}",
    )
    return got


@functools.cache
def softmax_session(dtype, axis, opset: int, x_scale=None, shape=None):
    """One QLinearSoftmax node (axis None: attribute left out). x_scale given: a constant initializer with
    a fixed input shape, the case where ORT builds its table once, in the kernel's constructor."""
    elem = ELEM[np.dtype(dtype)]
    attributes = {"opset": opset} | ({} if axis is None else {"axis": axis})
    node = helper.make_node("QLinearSoftmax", SOFTMAX_INPUTS, ["Y"], domain="com.microsoft", **attributes)
    fed = [n for n in SOFTMAX_INPUTS if not (x_scale is not None and n == "X_scale")]
    inputs = [
        helper.make_tensor_value_info(
            n, TensorProto.FLOAT if n.endswith("scale") else elem, shape if n == "X" else None
        )
        for n in fed
    ]
    initializers = [] if x_scale is None else [numpy_helper.from_array(np.asarray(x_scale, F32), "X_scale")]
    return peers.session(_model(node, inputs, elem, initializers)), fed


def check_softmax(X, x_scale, x_zp, y_scale, y_zp, *, axis, opset, constant_scale=False) -> np.ndarray:
    session, fed = softmax_session(
        X.dtype, axis, opset, float(x_scale) if constant_scale else None, X.shape if constant_scale else None
    )
    values = dict(zip(SOFTMAX_INPUTS, (X, x_scale, x_zp, y_scale, y_zp)))
    expected = session.run(None, {n: np.asarray(values[n]) for n in fed})[0]
    got = qlinear_softmax(X, x_scale, x_zp, y_scale, y_zp, opset=opset, **({} if axis is None else {"axis": axis}))
    same_bits(
        got,
        expected,
        f"QLinearSoftmax {X.dtype} {X.shape} axis {axis} opset {opset} scales {x_scale!r} {y_scale!r} y_zp {y_zp}",
    )
    return got


def zero_point(rng, dtype):
    info = np.iinfo(dtype)
    return np.array(rng.integers(info.min, info.max + 1), dtype)


def binary_scales(rng, kind: str, op: str):
    """(A_scale, B_scale, C_scale) of one kind. MLAS's fixed-point QLinearAdd (NEON only) takes scale
    ratios in [2^-14, 256) with a shift in [13, 31]: "fixed_point" draws there, "float_only" outside;
    x86 has only the float kernel, which must agree either way."""
    u = lambda lo, hi: F32(np.exp2(rng.uniform(lo, hi)))
    if kind == "typical":
        return u(-9, -1), u(-9, -1), u(-9, -1)
    if kind == "fixed_point":  # a ratio at the range's ends at times, the other inside
        c = u(-10, -2)
        ends = [F32(2.0**-14), F32(np.nextafter(F32(256), F32(0))), F32(1), F32(2.0**-13)]
        ra = ends[rng.integers(4)] if rng.random() < 0.5 else u(-14, 8)
        return F32(ra * c), F32(u(-14, 8) * c), c
    if kind == "float_only":  # a ratio below 2^-14 or from 256 up
        c = u(-10, 0)
        return F32(u(-30, -14) * c), F32(u(8, 20) * c), c
    if kind == "powers_of_two":  # exact arithmetic: every real result a multiple of a power of two, ties among them
        if op == "QLinearMul":
            return F32(2.0 ** rng.integers(-8, 0)), F32(2.0 ** rng.integers(-8, 0)), F32(2.0 ** rng.integers(-16, -6))
        return F32(2.0 ** rng.integers(-4, 1)), F32(2.0 ** rng.integers(-4, 1)), F32(2.0 ** rng.integers(-2, 3))
    # extreme: overflowing ratios (inf, inf * 0 = NaN: the conversion's INT32_MIN), subnormals, zero, negative
    pool = [1e-45, 1e-40, 1e-30, 1e-12, 1e12, 1e30, 3.4e38, 0.0, -0.25, -3e-5, 0.02, 1.0]
    return tuple(F32(rng.choice(pool)) if rng.random() < 0.7 else u(-20, 5) for _ in range(3))


def all_pairs(dtype, mode: int):
    """Every (a, b) pair of 8-bit values, shaped so that ORT runs the given functor for them."""
    info = np.iinfo(dtype)
    v = np.arange(info.min, info.max + 1).astype(dtype)
    if mode == 0:  # A scalar per span (A [256, 1] against B [256, 256])
        A, B = v.reshape(256, 1), np.tile(v, (256, 1))
    elif mode == 1:  # B scalar per span
        A, B = np.tile(v, (256, 1)), v.reshape(256, 1)
    else:  # both spans
        A, B = np.repeat(v, 256).reshape(256, 256), np.tile(v, (256, 1))
    assert _span_mode(A.shape, B.shape) == mode
    return A, B


KINDS = ["typical", "fixed_point", "float_only", "powers_of_two", "extreme"]


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_every_value_pair_under_many_scales(op, dtype, monkeypatch):
    """All 65536 (a, b) pairs through each broadcasting functor, under 150 parameter sets: 30 of each scale
    kind, random zero points (C's left out at times); every other set twice over, so that the C++ loops
    run it (the others with their threshold raised past them: numpy's element-wise arithmetic). A wrong float32 order or a missing (or extra) FMA shows here: the rounding
    differs in about one element in 400 000."""
    monkeypatch.setattr(_qlinear_ops, "_NATIVE_FROM", 65536)
    rng = np.random.default_rng([0 if op == "QLinearAdd" else 1, np.dtype(dtype).num])
    pairs = [all_pairs(dtype, mode) for mode in range(3)]
    doubled = [(np.concatenate([A, A]), np.concatenate([B, B])) for A, B in pairs]  # past the C++ loops' threshold
    checked = 0
    for i in range(150):
        scales = binary_scales(rng, KINDS[i % len(KINDS)], op)
        zps = [zero_point(rng, dtype) for _ in range(3)]
        if i % 7 == 3:
            zps[2] = None
        A, B = (doubled if i % 2 else pairs)[i % 3]
        A0, B0 = A.copy(), B.copy()
        check_binary(op, A, scales[0], zps[0], B, scales[1], zps[1], scales[2], zps[2])
        assert A.tobytes() == A0.tobytes() and B.tobytes() == B0.tobytes()  # inputs untouched
        checked += np.broadcast(A, B).size
    assert checked == 225 * 65536


BROADCASTS = [
    ((), (37,)),  # scalar A: ORT's input-0-scalar functor (operands swapped in the kernel)
    ((37,), ()),  # scalar B
    ((1,), (1000,)),
    ((4099,), (1,)),
    ((), ()),
    ((1,), ()),
    ((5, 1), ()),  # a tensor whose innermost dimension is 1 against a scalar: input 0 is the scalar
    ((3, 1), (1, 33)),  # general broadcasting, both ways at once
    ((2, 1, 7), (3, 1)),
    ((1, 65), (4, 1, 65)),
    ((31,), (31,)),  # below one 32-byte vector
    ((33,), (33,)),
    ((1, 1, 1), (1,)),
    ((2, 3, 0), (3, 1)),  # empty output
    ((1,), (4, 1)),
]


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_broadcasting_and_lengths(op, dtype):
    """Scalar against tensor both ways, general broadcasting, lengths off the vector widths (MLAS's tails
    are 32 / 8 / 16 wide), long and short, and random broadcastable shape pairs."""
    rng = np.random.default_rng([2, np.dtype(dtype).num, len(op)])
    info = np.iinfo(dtype)
    shapes = list(BROADCASTS)
    for _ in range(40):
        out = tuple(int(d) for d in rng.choice([1, 2, 3, 5, 8, 15, 17, 31, 33, 63], rng.integers(0, 5)))
        a = tuple(d if rng.random() < 0.6 else 1 for d in out)[rng.integers(0, len(out) + 1) :]
        b = tuple(d if rng.random() < 0.6 else 1 for d in out)[rng.integers(0, len(out) + 1) :]
        shapes.append((a, b) if rng.random() < 0.5 else (b, a))
    for sa, sb in shapes:
        A = rng.integers(info.min, info.max + 1, sa).astype(dtype)
        B = rng.integers(info.min, info.max + 1, sb).astype(dtype)
        scales = binary_scales(rng, "typical", op)
        check_binary(
            op,
            A,
            scales[0],
            zero_point(rng, dtype),
            B,
            scales[1],
            zero_point(rng, dtype),
            scales[2],
            zero_point(rng, dtype),
        )
    assert _span_mode((), (3,)) == 0 and _span_mode((3,), ()) == 1 and _span_mode((5, 1), ()) == 0
    assert _span_mode((3, 1), (1, 4)) == 0 and _span_mode((1, 4), (3, 1)) == 1 and _span_mode((2, 4), (4,)) == 2


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_saturation_at_both_ends(op, dtype):
    """Results far past the type's range clamp to its ends; a float past int32 (or NaN) converts to
    INT32_MIN, which ORT then saturates to the type's minimum even for a huge positive value."""
    info = np.iinfo(dtype)
    v = np.arange(info.min, info.max + 1).astype(dtype)
    A, B = np.repeat(v, 256), np.tile(v, 256)
    mid = np.array((info.min + info.max + 1) // 2, dtype)
    got = check_binary(op, A, F32(0.5), mid, B, F32(0.5), mid, F32(0.01), mid)
    assert got.min() == info.min and got.max() == info.max
    assert (got == info.min).sum() > 1000 and (got == info.max).sum() > 1000
    got = check_binary(op, A, F32(1e30), mid, B, F32(1e30), mid, F32(1e-30), mid)  # ratios overflow to inf
    assert (got == info.min).all() if op == "QLinearMul" else (got == info.min).any()


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_rounding_ties_go_to_even(op, dtype):
    """Power-of-two scales make the arithmetic exact and put thousands of results exactly on k + 0.5: ORT
    rounds them half to even (cvtps2dq), which the expected values here check besides ORT."""
    info = np.iinfo(dtype)
    v = np.arange(info.min, info.max + 1).astype(dtype)
    A, B = np.repeat(v, 256), np.tile(v, 256)
    zp = np.array(128 if dtype == U8 else 0, dtype)
    c_zp = np.array(3 if dtype == U8 else -5, dtype)
    a, b = A.astype(np.float64) - int(zp), B.astype(np.float64) - int(zp)
    if op == "QLinearAdd":  # C = a / 2 + b / 4
        got = check_binary(op, A, F32(0.5), zp, B, F32(0.25), zp, F32(1), c_zp)
        exact = a / 2 + b / 4
    else:  # C = a * b / 128
        got = check_binary(op, A, F32(2.0**-4), zp, B, F32(2.0**-4), zp, F32(0.5), c_zp)
        exact = a * b / 128
    assert (exact % 1 == 0.5).sum() >= 1000
    assert np.array_equal(got.astype(np.float64), np.clip(np.rint(exact + int(c_zp)), info.min, info.max))


@ORT_PINNED
def test_add_fmas_round_once():
    """A case built so that the kernel's fma chain must round once: a * rx lands a hair (2^-48) short of
    half an ulp above fma(b, ry, k) = 101.5 - 2^-17, so the float32 result is 101.5 - 2^-17 (101);
    rounding the sum to float64 first would tie to 101.5 and then to 102."""
    rx, ry = F32(13944699 * 2.0**-48), F32(1.5 - 2.0**-17)  # 77 * 13944699 = 2^30 - 1
    for dtype in (U8, S8):
        zp = np.array(0, dtype)
        got = check_binary(
            "QLinearAdd",
            np.array([77, 77, 0], dtype),
            rx,
            zp,
            np.array([1, 1, 0], dtype),
            ry,
            zp,
            F32(1),
            np.array(100, dtype),
        )
        assert got.tolist() == [101, 101, 100]


@ORT_PINNED
def test_mul_multiplies_then_adds():
    """f32(-3 * r) is exactly -2.5 though -3 * r is a little below it, so the kernel's separate multiply
    and add make -2.5 + 4 = 1.5, a tie, 2; a fused multiply-add would keep 1.5 - 2^-23 and give 1."""
    r = np.nextafter(F32(2.5 / 3), F32(1))
    assert 3.0 * float(r) > 2.5 and F32(3) * r == F32(2.5)
    for dtype in (U8, S8):
        A, B = np.array([0, 6], dtype), np.ones(2, dtype)  # (A - 3) * (B - 0) = -3, 3
        got = check_binary(
            "QLinearMul", A, r, np.array(3, dtype), B, F32(1), np.array(0, dtype), F32(1), np.array(4, dtype)
        )
        assert got.tolist() == [2, 6]


SOFTMAX_SHAPES = [(1,), (7,), (2, 3), (4, 129), (3, 5, 17), (2, 1, 8, 3), (1, 300), (6, 40)]


@ORT_PINNED
@pytest.mark.parametrize("native", [False, True], ids=["numpy", "cpp"])
@pytest.mark.parametrize("dtype", [U8, S8])
def test_softmax(dtype, native, monkeypatch):
    """Random shapes, every axis, opsets below 13 (flattened at axis) and from 13 (one axis), y_scale
    1/256 (quantize_static's) and others: 0.1 and 1/3, where floor(1.0f / y_scale) in float32 (10, 3)
    differs from floor in double (9, 2); saturating ones; subnormal, zero and negative ones. X ranges
    that tie the row maximum; zero points random. Through numpy's arithmetic and through the C++ rows
    (csrc/onnx_ops.h; outputs of more than 4,096 elements take it), each against ORT."""
    monkeypatch.setattr(_qlinear_ops, "_NATIVE_FROM", 0 if native else 1 << 40)
    rng = np.random.default_rng([3, np.dtype(dtype).num])
    info = np.iinfo(dtype)
    y_scales = [
        F32(1 / 256),
        F32(1 / 255),
        F32(0.1),
        F32(1 / 3),
        F32(0.02),
        F32(1e-3),
        F32(7e-5),
        F32(1.5),
        F32(1e-40),
        F32(0),
        F32(-0.01),
    ]
    for i in range(120):
        shape = SOFTMAX_SHAPES[i % len(SOFTMAX_SHAPES)]
        opset = [11, 12, 13, 21][i % 4]
        axis = int(rng.integers(-len(shape), len(shape)))
        lo, hi = (info.min, info.max + 1) if i % 3 else (info.max - 20, info.max + 1)  # narrow: many equal values
        X = rng.integers(lo, hi, shape).astype(dtype)
        x_scale = F32(np.exp2(rng.uniform(-12, 3))) if i % 10 else F32([1e-45, 30.0][i % 20 // 10])
        y_scale = y_scales[i % len(y_scales)] if i % 2 else F32(np.exp2(rng.uniform(-11, 0)))
        y_zp = zero_point(rng, dtype) if i % 4 else np.array(info.min, dtype)
        X0 = X.copy()
        check_softmax(X, x_scale, zero_point(rng, dtype), y_scale, y_zp, axis=axis, opset=opset)
        assert X.tobytes() == X0.tobytes()


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_softmax_sums_in_float32_one_by_one(dtype):
    """Rows of D equal values with floor(1 / y_scale) = D / 2: each exact quotient is 0.5, and what the
    output gets (0 or 1, a tie or not) hangs on the rounding of the float32 running sum of D copies of
    the table's largest entry, so on that entry's every bit (logf, exp, the 5-bit reserve) and on the
    summation order. Lengths where numpy's float32 log differs from glibc's logf among them."""
    rng = np.random.default_rng([5, np.dtype(dtype).num])
    info = np.iinfo(dtype)
    y_zp = np.array(0 if dtype == U8 else -128, dtype)
    outcomes = set()
    for D in (88, 130, 166, 238, 254, 512):
        y_scale = F32(2.0 / D)
        while np.floor(F32(1) / y_scale) != D // 2:  # f32(2 / D) can land just above
            y_scale = np.nextafter(y_scale, F32(0))
        for _ in range(8):
            X = np.full((3, D), rng.integers(info.min, info.max + 1), dtype)
            got = check_softmax(X, F32(np.exp2(rng.uniform(-10, 2))), y_zp, y_scale, y_zp, axis=-1, opset=13)
            outcomes.add(int(got[0, 0]) - int(y_zp))
    assert outcomes == {0, 1}  # both sides of the tie occur


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_softmax_attribute_default_constant_scale_and_saturation(dtype):
    """axis left out is -1 in every opset (ORT fills in the schema's default); a constant X_scale (table
    built in the constructor) gives the same bits; a tiny y_scale; a row whose maximum dominates
    saturates at the type's maximum (int8: 127, not wrapped)."""
    rng = np.random.default_rng([4, np.dtype(dtype).num])
    info = np.iinfo(dtype)
    X = rng.integers(info.min, info.max + 1, (3, 4, 9)).astype(dtype)
    zp = np.array(0, dtype)
    for opset in (12, 13):
        got = check_softmax(X, F32(0.05), zp, F32(1 / 256), zp, axis=None, opset=opset)
        assert np.array_equal(got, qlinear_softmax(X, F32(0.05), zp, F32(1 / 256), zp, axis=-1, opset=opset))
        check_softmax(X, F32(0.05), zp, F32(1 / 256), zp, axis=1, opset=opset, constant_scale=True)
    # y_scale 1e-40: 1.0f / y_scale is inf in float32, so ORT takes floor(1.0 / y_scale) in double;
    # entries that underflow to 0 then give y_zp (0 * inf would be NaN, stored as 0)
    wide = np.array([[info.min, info.max, info.max - 1, info.min + 100]], dtype)
    y_zp = np.array(7 if dtype == U8 else -100, dtype)
    got = check_softmax(wide, F32(30), zp, F32(1e-40), y_zp, axis=-1, opset=13)
    assert got.tolist() == [[int(y_zp), info.max, info.max, int(y_zp)]]
    peak = np.full((2, 16), info.min, dtype)
    peak[:, 3] = info.max
    y_zp = np.array(0 if dtype == U8 else -128, dtype)
    got = check_softmax(peak, F32(1.0), zp, F32(1 / 256), y_zp, axis=-1, opset=13)
    assert (got[:, 3] == info.max).all() and (got[:, :3] == y_zp).all()


def test_bad_input():
    u, s, f = np.zeros(4, U8), np.zeros(4, S8), F32(0.1)
    z = np.array(0, U8)
    cases = [
        (
            lambda: qlinear_add(u.astype(F32), f, None, u, f, None, f, None),
            TypeError,
            "QLinearAdd: A must be int8 or uint8, got float32",
        ),
        (
            lambda: qlinear_mul(u, f, None, np.zeros(4, np.int16), f, None, f, None),
            TypeError,
            "QLinearMul: B must be int8 or uint8, got int16",
        ),
        (
            lambda: qlinear_add(u, f, None, s, f, None, f, None),
            TypeError,
            "QLinearAdd: A and B must have one type, got uint8 and int8",
        ),
        (
            lambda: qlinear_mul(u, f, None, np.zeros(3, U8), f, None, f, None),
            ValueError,
            r"QLinearMul: A \(4,\) and B \(3,\) do not broadcast",
        ),
        (
            lambda: qlinear_add(u, np.float64(0.1), None, u, f, None, f, None),
            TypeError,
            "QLinearAdd: A_scale must be float32, got float64",
        ),
        (
            lambda: qlinear_add(u, f, None, u, np.ones(2, F32), None, f, None),
            ValueError,
            r"QLinearAdd: B_scale must be a scalar or a 1-D tensor of one element, got shape \(2,\)",
        ),
        (
            lambda: qlinear_mul(u, f, None, u, f, None, F32(np.inf), None),
            ValueError,
            "QLinearMul: C_scale must be finite",
        ),
        (lambda: qlinear_mul(u, f, None, u, f, None, None, None), TypeError, "QLinearMul: C_scale is required"),
        (
            lambda: qlinear_add(u, f, np.array(0, S8), u, f, None, f, None),
            TypeError,
            r"QLinearAdd: A_zero_point must be uint8 \(the tensor's type\), got int8",
        ),
        (
            lambda: qlinear_add(u, f, z, u, f, np.zeros((1, 1), U8), f, None),
            ValueError,
            r"QLinearAdd: B_zero_point must be a scalar or a 1-D tensor of one element, got shape \(1, 1\)",
        ),
        (
            lambda: qlinear_softmax(u.astype(np.int32), f, None, f, None, opset=13),
            TypeError,
            "QLinearSoftmax: X must be int8 or uint8, got int32",
        ),
        (
            lambda: qlinear_softmax(np.array(3, U8), f, None, f, None, opset=13),
            ValueError,
            "QLinearSoftmax: X must have at least 1 dimension",
        ),
        (
            lambda: qlinear_softmax(u, F32(0), None, f, None, opset=13),
            ValueError,
            "QLinearSoftmax: X_scale must be positive",
        ),
        (
            lambda: qlinear_softmax(u, f, None, F32(np.nan), None, opset=13),
            ValueError,
            "QLinearSoftmax: Y_scale must be finite",
        ),
        (
            lambda: qlinear_softmax(u, f, None, f, np.array(0, S8), opset=13),
            TypeError,
            r"QLinearSoftmax: y_zero_point must be uint8 \(the tensor's type\), got int8",
        ),
        (
            lambda: qlinear_softmax(u, f, None, f, None, axis=1, opset=13),
            ValueError,
            "QLinearSoftmax: axis 1 is out of range for 1-D X",
        ),
        (
            lambda: qlinear_softmax(u, f, None, f, None, axis=0.5, opset=13),
            TypeError,
            "QLinearSoftmax: axis must be an int, got float",
        ),
        (
            lambda: qlinear_softmax(u, f, None, f, None, opset=True),
            TypeError,
            "QLinearSoftmax: opset must be an int, got bool",
        ),
        (
            lambda: qlinear_softmax(u, f, None, f, None, opset=0),
            ValueError,
            "QLinearSoftmax: opset must be at least 1, got 0",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match="^" + message):
            call()
    with pytest.raises(TypeError, match="opset"):
        qlinear_softmax(u, f, None, f, None)  # opset is required


@ORT_PINNED
@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_quantize_static_default_ops_model_runs_as_onnxruntime(activation, tmp_path):
    """quantize_static's QOperator format with every op type it quantizes: MatMul -> Add -> Mul -> Softmax
    -> MatMul becomes QLinearMatMul, QLinearAdd, QLinearMul, QLinearSoftmax, QLinearMatMul between one
    QuantizeLinear and one DequantizeLinear: the session's output is ORT's bit for bit, and compare()
    checks each node."""
    from onnxruntime.quantization import QuantFormat, QuantType

    import quantmatmul.onnx as qo

    rng = np.random.default_rng(11)
    weights = {
        "W1": rng.normal(size=(48, 40)).astype(np.float32),
        "b1": rng.normal(size=(40,)).astype(np.float32),
        "s": np.array(0.3, np.float32),
        "W2": (rng.normal(size=(40, 24)) / 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Mul", ["hb", "s"], ["hs"]),
        helper.make_node("Softmax", ["hs"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "W2"], ["y"]),
    ]
    model = quantize_static_model(
        float_model(nodes, 48, 24, weights),
        tmp_path,
        seed=11,
        quant_format=QuantFormat.QOperator,
        activation_type=getattr(QuantType, activation),
        weight_type=QuantType.QInt8,
        reduce_range=peers.onnxruntime_u8s8_saturates(),
    )
    ops = [n.op_type for n in model.graph.node]
    assert {"QLinearAdd", "QLinearMul", "QLinearSoftmax", "QLinearMatMul"} <= set(ops)
    feed = {"x": rng.normal(size=(13, 48)).astype(np.float32)}
    (ours,) = qo.InferenceSession(model).run(None, feed)
    (theirs,) = peers.session(model).run(None, feed)
    assert ours.tobytes() == theirs.tobytes()
    report = qo.compare(model, feed)
    assert report.ok, str(report)
    assert {"QLinearAdd", "QLinearMul", "QLinearSoftmax"} <= {r["op_type"] for r in report.rows}
    assert all(r["differing"] == 0 for r in report.rows)


@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("function", [qlinear_add, qlinear_mul], ids=["add", "mul"])
def test_large_outputs_run_the_same_arithmetic_in_cpp(function, dtype, monkeypatch):
    """Outputs run the C++ loops (csrc/qlinear_binary_loops.inc: an operand broadcast over the output's
    leading dimensions only, a bias or a scalar, repeated in place, x or y, of fewer or more than 4,096
    elements; other broadcasts copied to the output's shape first), in both builds of them (portable,
    and avx2 where the CPU has it); every element equals numpy's arithmetic (the threshold raised) on
    pieces of at most 4,096 elements. Lengths around the AVX2 loop's 32 elements and a task's 65,536,
    broadcast operands, and every (a, b) pair under 24 parameter sets (an unfused multiply-add shows
    in about one element in 400,000)."""
    from conftest import kernel_entry

    import quantmatmul as qm
    from quantmatmul import _core

    paths = [isa for isa in ("portable", "avx2") if isa in qm.available_isas()]
    rng = np.random.default_rng(np.dtype(dtype).num)
    info = np.iinfo(dtype)
    codes = np.arange(256, dtype=np.uint8).view(dtype)
    every_pair = (np.repeat(codes, 256), np.tile(codes, 256))
    shapes = [((3, 50, 41), (3, 50, 41)), ((3, 50, 41), (50, 1)), ((2, 3000), (2, 3000)), ((4097,), (4097,))]
    shapes += [((3, 50, 41), (41,)), ((1, 41), (3, 50, 41)), ((3, 5000), (1, 5000)), ((40, 3), ()), ((2, 3), (3,))]
    shapes += [((65536 + 33,), (65536 + 33,)), ((2, 4127), (1,))] + [None] * 24  # None: every pair, new scales
    for shapes_ab in shapes:
        if shapes_ab is None:
            A, B = every_pair
        else:
            A = rng.integers(info.min, info.max + 1, shapes_ab[0]).astype(dtype)
            B = rng.integers(info.min, info.max + 1, shapes_ab[1]).astype(dtype)
        zps = [np.asarray(rng.integers(info.min, info.max + 1), dtype) for _ in range(3)]
        scales = [np.float32(rng.uniform(0.005, 0.1)) for _ in range(3)]
        args = (scales[0], zps[0], scales[1], zps[1], scales[2], zps[2])
        A_full, B_full = (v.reshape(-1) for v in np.broadcast_arrays(A, B))
        monkeypatch.setattr(_qlinear_ops, "_NATIVE_FROM", 1 << 40)
        pieces = [  # of at most 4,096 elements each: numpy's arithmetic
            function(A_full[i : i + 4096], args[0], args[1], B_full[i : i + 4096], *args[2:])
            for i in range(0, A_full.size, 4096)
        ]
        monkeypatch.undo()
        expected = np.concatenate(pieces).reshape(np.broadcast_shapes(A.shape, B.shape))
        for path in paths:
            with kernel_entry("qgemm", path):
                assert _core.qlinear_binary_path() == path
                big = function(A, args[0], args[1], B, args[2], args[3], args[4], args[5])
            np.testing.assert_array_equal(big, expected, err_msg=f"{path} {shapes_ab}")


@pytest.mark.parametrize("function", [qlinear_add, qlinear_mul], ids=["add", "mul"])
def test_operands_laid_out_alike_keep_their_layout(function):
    """Two operands of the output's shape with the same memory layout (channels-last views, as the session's
    convolutions pass on; Fortran order) are read as they are and the result takes that layout; mixed
    layouts are copied into C order. The values are always those of the C-order operands."""
    rng = np.random.default_rng(5)
    A = rng.integers(0, 256, (2, 9, 17, 31)).astype(U8)
    B = rng.integers(0, 256, A.shape).astype(U8)
    args = (np.float32(0.03), np.uint8(7), np.float32(0.05), np.uint8(200), np.float32(0.07), np.uint8(9))
    expected = function(A, args[0], args[1], B, args[2], args[3], args[4], args[5])
    last = [np.moveaxis(np.ascontiguousarray(np.moveaxis(v, 1, -1)), -1, 1) for v in (A, B)]
    for a, b, layout in (
        (*last, "channels_last"),
        (np.asfortranarray(A), np.asfortranarray(B), "fortran"),
        (last[0], B, "c"),
    ):
        y = function(a, args[0], args[1], b, args[2], args[3], args[4], args[5])
        np.testing.assert_array_equal(y, expected)
        if layout == "channels_last":
            assert np.moveaxis(y, 1, -1).flags.c_contiguous
        elif layout == "fortran":
            assert y.flags.f_contiguous
        else:
            assert y.flags.c_contiguous


@pytest.mark.parametrize("dtype", [U8, S8])
def test_softmax_rows_in_cpp_are_numpys(dtype, monkeypatch):
    """The C++ rows (every output; both builds: portable, and avx2's 4 doubles at a time where the CPU
    has it) equal numpy's arithmetic on the same input: long rows and short (the AVX2 loop's tails),
    every axis, both opset readings, saturating and tiny y_scale."""
    from conftest import kernel_entry

    import quantmatmul as qm

    paths = [isa for isa in ("portable", "avx2") if isa in qm.available_isas()]
    rng = np.random.default_rng(np.dtype(dtype).num)
    info = np.iinfo(dtype)
    for i, shape in enumerate([(8, 12, 16, 16), (3, 5000), (5000, 3), (2, 70, 3, 11), (1, 4097), (7, 6)] * 3):
        X = rng.integers(info.min if i % 3 else info.max - 10, info.max + 1, shape).astype(dtype)
        args = (X, F32(np.exp2(rng.uniform(-10, 2))), np.array(0, dtype), [F32(1 / 256), F32(1e-40), F32(3.0)][i % 3])
        args += (np.array(rng.integers(info.min, info.max + 1), dtype),)
        axis, opset = int(rng.integers(-len(shape), len(shape))), [12, 13][i % 2]
        monkeypatch.setattr(_qlinear_ops, "_NATIVE_FROM", 1 << 40)
        expected = qlinear_softmax(*args, axis=axis, opset=opset)
        monkeypatch.undo()
        for path in paths:
            with kernel_entry("qgemm", path):
                native = qlinear_softmax(*args, axis=axis, opset=opset)
            np.testing.assert_array_equal(native, expected, err_msg=f"{path} {shape}")


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_session_nodes_with_constant_scalars_check_them_once(op):
    """A node whose scales and zero points are initializers (the quantizers' models) has them checked once
    per type of A and B (BinaryScalars): the session gives the function's bits for both types and every
    broadcast, and a bad constant is the function's error, raised when a run reaches it."""
    import quantmatmul.onnx as qo

    function = {"QLinearAdd": qlinear_add, "QLinearMul": qlinear_mul}[op]
    rng = np.random.default_rng(8)
    for dtype in (U8, S8):
        info = np.iinfo(dtype)
        scalars = {"as": F32(0.03), "az": dtype(3), "bs": F32(0.07), "bz": dtype(-5 if dtype == S8 else 250)}
        scalars |= {"cs": F32(0.11), "cz": dtype(9)}
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in scalars.items()]
        node = helper.make_node(op, ["A", "as", "az", "B", "bs", "bz", "cs", "cz"], ["C"], domain="com.microsoft")
        elem = {U8: TensorProto.UINT8, S8: TensorProto.INT8}[dtype]
        inputs = [helper.make_tensor_value_info(n, elem, None) for n in ("A", "B")]
        session = qo.InferenceSession(_model(node, inputs, elem, inits))
        for a_shape, b_shape in (((3, 70, 80), (80,)), ((1,), (5, 9)), ((2, 3, 40, 40), (2, 3, 40, 40))):
            A = rng.integers(info.min, info.max + 1, a_shape).astype(dtype)
            B = rng.integers(info.min, info.max + 1, b_shape).astype(dtype)
            (ours,) = session.run(None, {"A": A, "B": B})
            want = function(
                A, scalars["as"], scalars["az"], B, scalars["bs"], scalars["bz"], scalars["cs"], scalars["cz"]
            )
            np.testing.assert_array_equal(ours, want)
    bad = [numpy_helper.from_array(np.asarray(v), k) for k, v in scalars.items() if k != "bs"]
    bad.append(numpy_helper.from_array(np.asarray(np.inf, F32), "bs"))
    session = qo.InferenceSession(_model(node, inputs, elem, bad))
    A = np.zeros((4, 4), S8)
    with pytest.raises(ValueError, match=rf"^InferenceSession.run: .*{op}: B_scale must be finite"):
        session.run(None, {"A": A, "B": A})
