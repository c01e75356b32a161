"""test_onnx_qlinear_unary.py: com.microsoft QLinearSigmoid, QLinearLeakyRelu and QLinearConcat (onnx/_qlinear_unary.py) against ONNX Runtime's CPU kernels bit for bit: all 256 codes under hundreds of scales and zero points, cases built to tell MLAS's FMA logistic and its divide from near misses, constant (constructor-built) tables, concat's copy and requantize paths, bad input."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_bits import frozen, same_bits
from peer_deviations import pinned_only

from quantmatmul import peers
from quantmatmul.onnx._qlinear_unary import _logistic, qlinear_concat, qlinear_leaky_relu, qlinear_sigmoid

# The functions reproduce the pinned ONNX Runtime's kernels (constraints.txt), down to MLAS's logistic
# polynomial and its FMAs: against another release the bit-for-bit comparisons are skipped.
ORT_PINNED = pinned_only("onnxruntime", "reproduces the kernels of")

F32, U8, S8 = np.float32, np.uint8, np.int8
ELEM = {np.dtype(U8): TensorProto.UINT8, np.dtype(S8): TensorProto.INT8}
UNARY_INPUTS = ["X", "X_scale", "X_zero_point", "Y_scale", "Y_zero_point"]
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
FUNCTIONS = {"QLinearSigmoid": qlinear_sigmoid, "QLinearLeakyRelu": qlinear_leaky_relu}


def _model(node, inputs, elem, initializers=()):
    graph = helper.make_graph(
        [node], node.op_type, inputs, [helper.make_tensor_value_info("Y", elem, None)], initializer=list(initializers)
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


@functools.cache
def unary_session(op, dtype, alpha=None, x_zp=True, y_zp=True, constants=None):
    """One node; an absent zero point is the empty name "" (leaving Y_zero_point off the end makes ORT
    1.32's kernel constructor read past its input list: an assertion aborts the process). constants:
    the scales and zero points as initializers (the table is then built in the constructor)."""
    elem = ELEM[np.dtype(dtype)]
    names = [n if (n != "X_zero_point" or x_zp) and (n != "Y_zero_point" or y_zp) else "" for n in UNARY_INPUTS]
    node = helper.make_node(op, names, ["Y"], domain="com.microsoft", **({} if alpha is None else {"alpha": alpha}))
    initializers = []
    if constants is not None:
        for name, value in zip(UNARY_INPUTS[1:], constants):
            if name in names:
                initializers.append(numpy_helper.from_array(np.asarray(value, F32 if "scale" in name else dtype), name))
    fed = [n for n in names if n and n not in {i.name for i in initializers}]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if "scale" in n else elem, None) for n in fed]
    return peers.session(_model(node, inputs, elem, initializers)), fed


def check_unary(op, X, xs, xz, ys, yz, alpha=None, constants=False) -> np.ndarray:
    X, xz, yz = frozen(X, xz, yz)
    consts = (float(xs), 0 if xz is None else int(xz), float(ys), 0 if yz is None else int(yz)) if constants else None
    session, fed = unary_session(op, np.dtype(X.dtype).str, alpha, xz is not None, yz is not None, consts)
    values = dict(zip(UNARY_INPUTS, (X, xs, xz, ys, yz)))
    expected = session.run(None, {n: np.asarray(values[n]) for n in fed})[0]
    got = FUNCTIONS[op](X, xs, xz, ys, yz, **({} if alpha is None else {"alpha": alpha}))
    same_bits(got, expected, f"{op} {X.dtype} {X.shape} alpha {alpha} scales {xs!r} {ys!r} zero points {xz} {yz}")
    return got


def zero_point(rng, dtype):
    info = np.iinfo(dtype)
    return np.array(rng.integers(info.min, info.max + 1), dtype)


def every_code(dtype) -> np.ndarray:
    """All 256 values by byte code, then 7 of them again (263: a length off any vector width)."""
    v = np.arange(256, dtype=np.uint8).view(dtype)
    return np.concatenate([v, v[:7]])


def random_scales(rng, i, low=-12):
    """(X_scale, Y_scale): mostly log-uniform; at times one extreme (huge, subnormal, zero, negative)."""
    xs = F32(np.exp2(rng.uniform(low, 4))) if i % 25 else F32([3e38, 1e-45, 0.0, -0.02, -0.0][i // 25 % 5])
    ys = F32(np.exp2(rng.uniform(-14, 2))) if i % 23 else F32([0.0, -0.05, 1e-45, 1e30, -0.0][i // 23 % 5])
    return xs, ys


# --------------------------------------------------------------------------------------------------
# QLinearSigmoid and QLinearLeakyRelu


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_every_code_under_many_scales(op, dtype):
    """All 256 codes under 600 parameter sets: log-uniform scales (X_scale * 255 from well inside to far
    beyond the sigmoid's +-18 clamp; Y_scale saturating at times), extreme ones (inf products,
    subnormal, zero, negative, -0.0: 1 / -0.0 is -inf), random zero points, either left out at times
    (""), alpha from the default (attribute left out) through 0, negative and above 1; every tenth set
    with constant scales and zero points (the table built in ORT's constructor)."""
    rng = np.random.default_rng([20, np.dtype(dtype).num, len(op)])
    X = every_code(dtype)
    for i in range(600):
        xs, ys = random_scales(rng, i)
        xz = zero_point(rng, dtype) if i % 7 else None
        yz = zero_point(rng, dtype) if i % 9 else None
        alpha = None
        if op == "QLinearLeakyRelu" and i % 6:
            alpha = [0.01, 0.1, 0.2, 0.0, -0.5, 1.0, 3.0, 1e-30][i % 8] if i % 3 else float(rng.uniform(-2, 2))
        check_unary(op, X, xs, xz, ys, yz, alpha, constants=i % 10 == 4)


def logistic_without_fma(x):
    """The same polynomial with separate multiplies and adds (the SSE2 kernel's arithmetic)."""
    v = np.minimum(F32(18), np.maximum(F32(-18), x))
    x2 = v * v
    p, q = x2 * F32(4.37031012579801e-11) + F32(1.15627324459942e-07), x2 * F32(6.10247389755681e-13)
    for a in (6.08574864600143e-05, 8.51377133304701e-03, 2.48287947061529e-01):
        p = p * x2 + F32(a)
    q = q + F32(5.76102136993427e-09)
    for b in (6.29106785017040e-06, 1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01):
        q = q * x2 + F32(b)
    return np.maximum(F32(0), (v * p) / q + F32(0.5))


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_sigmoid_is_mlas_fma_polynomial(dtype):
    """Cases built to tell the kernel's arithmetic apart: for a code where the FMA polynomial and the
    unfused one differ, Y_scale puts their midpoint on m + 0.5. ORT agrees with the FMA kernel on all
    256 codes every time; the unfused polynomial, and float64 1 / (1 + exp(-x)), miss in many cases."""
    rng = np.random.default_rng([21, np.dtype(dtype).num])
    info = np.iinfo(dtype)
    X = every_code(dtype)[:256]
    codes = X.astype(np.int32)
    cases = missed_unfused = missed_exact = 0
    while cases < 60:
        xs, xz = F32(np.exp2(rng.uniform(-7, 0))), zero_point(rng, dtype)
        x = xs * (codes - int(xz)).astype(F32)
        fused, unfused = _logistic(x), logistic_without_fma(x)
        differ = np.nonzero(fused != unfused)[0]
        if len(differ) == 0:
            continue
        j = differ[rng.integers(len(differ))]
        ys = F32((np.float64(fused[j]) + np.float64(unfused[j])) / 2 / (rng.integers(20, 250) + 0.5))
        yz = np.array(info.min, dtype)
        got = check_unary("QLinearSigmoid", X, xs, xz, ys, yz)

        def quantized(y, ys=ys):
            return np.clip(np.rint(y / ys) + info.min, info.min, info.max)

        missed_unfused += not np.array_equal(quantized(unfused), got)
        exact = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(F32)
        missed_exact += not np.array_equal(quantized(exact), got)
        cases += 1
    assert missed_unfused >= 30 and missed_exact >= 20, (missed_unfused, missed_exact)


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_leaky_relu_divides_by_y_scale(dtype):
    """MLAS's QuantizeLinear divides by Y_scale (not multiplies by 1 / Y_scale): parameter sets where
    the two part on some code (Y_scale a small integer times a power of two, X_scale a multiple of
    Y_scale / 2), and ORT divides."""
    rng = np.random.default_rng([22, np.dtype(dtype).num])
    X = every_code(dtype)[:256]
    codes = X.astype(np.int32)
    info = np.iinfo(dtype)
    found = 0
    while found < 40:
        ys = F32(rng.integers(3, 200) * 2.0 ** rng.integers(-10, -2))
        xs = F32(ys * rng.integers(1, 9) / 2)  # products on the half-integer grid: ties, or nearly
        xz, yz = zero_point(rng, dtype), zero_point(rng, dtype)
        x = xs * (codes - int(xz)).astype(F32)
        y = np.where(x >= 0, x, F32(0.5) * x)
        by_reciprocal = np.clip(np.rint(y * (F32(1) / ys)) + int(yz), info.min, info.max)
        by_division = np.clip(np.rint(y / ys) + int(yz), info.min, info.max)
        if np.array_equal(by_reciprocal, by_division):
            continue
        got = check_unary("QLinearLeakyRelu", X, xs, xz, ys, yz, alpha=0.5)
        assert np.array_equal(got, by_division) and not np.array_equal(got, by_reciprocal)
        found += 1


@ORT_PINNED
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_shapes(op):
    """Any shape, 0-d and empty included: each element is looked up."""
    rng = np.random.default_rng(23)
    for shape in [(), (0,), (1,), (7,), (3, 37), (2, 3, 5, 17), (4, 0, 3)]:
        for dtype in (U8, S8):
            X = np.asarray(rng.integers(0, 256, shape).astype(np.uint8).view(dtype))
            check_unary(op, X, F32(0.05), zero_point(rng, dtype), F32(1 / 256), zero_point(rng, dtype))


# --------------------------------------------------------------------------------------------------
# QLinearConcat


@functools.cache
def concat_session(dtype, count, axis, constants=None):
    """count (tensor, scale, zero point) triples; constants: ((Y_scale, Y_zp), per input (scale, zp) or
    None) as initializers (ORT then builds those tables, or marks copies, in its constructor)."""
    elem = ELEM[np.dtype(dtype)]
    names = ["Y_scale", "Y_zero_point"] + [f"{n}{j}" for j in range(count) for n in ("X", "X_scale", "X_zero_point")]
    node = helper.make_node("QLinearConcat", names, ["Y"], domain="com.microsoft", axis=axis)
    initializers = []
    if constants is not None:
        (ys, yz), per_input = constants
        pairs = [("Y_scale", ys), ("Y_zero_point", yz)]
        for j, sz in enumerate(per_input):
            if sz is not None:
                pairs += [(f"X_scale{j}", sz[0]), (f"X_zero_point{j}", sz[1])]
        for name, value in pairs:
            initializers.append(numpy_helper.from_array(np.asarray(value, F32 if "scale" in name else dtype), name))
    fed = [n for n in names if n not in {i.name for i in initializers}]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if "scale" in n else elem, None) for n in fed]
    return peers.session(_model(node, inputs, elem, initializers)), names, fed


def check_concat(ys, yz, triples, axis, constant_inputs=None) -> np.ndarray:
    """constant_inputs: None (everything fed), or the indices of the inputs whose scale and zero point
    are initializers (Y's then are too)."""
    yz = frozen(yz)[0]
    triples = [(frozen(x)[0], s, frozen(z)[0]) for x, s, z in triples]
    flat = [v for t in triples for v in t]
    constants = None
    if constant_inputs is not None:
        per_input = tuple((float(s), int(z)) if j in constant_inputs else None for j, (_, s, z) in enumerate(triples))
        constants = ((float(ys), int(yz)), per_input)
    session, names, fed = concat_session(np.dtype(yz.dtype).str, len(triples), axis, constants)
    values = dict(zip(names, [ys, yz, *flat]))
    expected = session.run(None, {n: np.asarray(values[n]) for n in fed})[0]
    got = qlinear_concat(ys, yz, *flat, axis=axis)
    same_bits(got, expected, f"QLinearConcat axis {axis} {[(x.shape, s, z) for x, s, z in triples]} Y {ys!r} {yz}")
    return got


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_concat(dtype):
    """500 random concatenations: 1 to 4 inputs of rank 1 to 4, every axis (negative too), sizes 0 to 9
    on the axis (empty inputs), a third of the inputs with Y's scale and zero point (copied), the rest
    requantized (extreme scales at times); constants at times."""
    rng = np.random.default_rng([24, np.dtype(dtype).num])
    info = np.iinfo(dtype)
    for i in range(500):
        count, rank = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        axis = int(rng.integers(-rank, rank))
        base = [int(d) for d in rng.integers(1, 6, rank)]
        ys = F32(np.exp2(rng.uniform(-8, 0))) if i % 20 else F32([0.0, 1e-45, -0.1, -0.0][i // 20 % 4])
        yz = zero_point(rng, dtype)
        triples = []
        for j in range(count):
            shape = list(base)
            shape[axis] = int(rng.integers(0, 10))
            x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
            if rng.random() < 1 / 3:
                triples.append((x, ys, yz.copy()))
            else:
                xs = F32(np.exp2(rng.uniform(-9, 1))) if rng.random() < 0.9 else F32([0.0, 1e-45, -0.3, 3e38][j % 4])
                triples.append((x, xs, zero_point(rng, dtype)))
        constant_inputs = None if i % 4 else set(int(j) for j in np.nonzero(rng.random(count) < 0.6)[0])
        check_concat(ys, yz, triples, axis, constant_inputs)


@ORT_PINNED
@pytest.mark.parametrize("dtype", [U8, S8])
def test_concat_copies_equal_parameters(dtype):
    """An input with Y's scale (compared as floats: 0.0 equals -0.0) and zero point is copied: with
    scale 0 the table would map everything to qmin (0 / 0 is NaN); a different zero point alone
    requantizes."""
    info = np.iinfo(dtype)
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(2, 128)
    yz = np.array(3, dtype)
    for xs, ys in ((F32(0), F32(0)), (F32(-0.0), F32(0)), (F32(1e-45), F32(1e-45))):
        got = check_concat(ys, yz, [(x, xs, yz.copy()), (x[:1], ys, np.array(4, dtype))], axis=0)
        assert np.array_equal(got[:2], x)
        if ys == 0:
            assert (got[2] == info.min).all()
        for constant_inputs in ({0}, {0, 1}):
            check_concat(ys, yz, [(x, xs, yz.copy()), (x[:1], ys, np.array(4, dtype))], 0, constant_inputs)


# --------------------------------------------------------------------------------------------------
# bad input, inputs untouched


def test_bad_input():
    u, f, z, s = np.zeros(4, U8), F32(0.1), np.array(0, U8), np.array(0, S8)
    sig, lr, cat = qlinear_sigmoid, qlinear_leaky_relu, qlinear_concat
    S, L, C = "QLinearSigmoid: ", "QLinearLeakyRelu: ", "QLinearConcat: "
    cases = [
        (lambda: sig(u.astype(np.int16), f, z, f, z), TypeError, S + "X must be int8 or uint8, got int16"),
        (lambda: sig(u, np.float64(0.1), z, f, z), TypeError, S + "X_scale must be float32, got float64"),
        (lambda: sig(u, f, z, None, z), TypeError, S + "Y_scale is required"),
        (lambda: sig(u, f, z, F32(np.nan), z), ValueError, S + "Y_scale must be finite"),
        (lambda: sig(u, np.array([f, f]), z, f, z), ValueError, S + "X_scale must be a scalar or a 1-D tensor of one"),
        (lambda: sig(u, f, s, f, z), TypeError, S + "X_zero_point must be uint8 (the tensor's type), got int8"),
        (lambda: sig(u, f, z, f, np.zeros(2, U8)), ValueError, S + "Y_zero_point must be a scalar"),
        (lambda: lr(u, f, z, f, s), TypeError, L + "Y_zero_point must be uint8 (the tensor's type), got int8"),
        (lambda: lr(u, f, z, f, z, alpha="0.1"), TypeError, L + "alpha must be a float, got str"),
        (lambda: lr(u, f, z, f, z, alpha=True), TypeError, L + "alpha must be a float, got bool"),
        (lambda: cat(f, z, u, f, z, axis=1), ValueError, C + "axis 1 is out of range for rank 1"),
        (lambda: cat(f, z, u, f, z, axis=0.0), TypeError, C + "axis must be an int, got float"),
        (lambda: cat(f, z, axis=0), ValueError, C + "inputs must be one or more (tensor, scale, zero point) triples"),
        (lambda: cat(f, z, u, f, axis=0), ValueError, C + "inputs must be one or more (tensor, scale, zero point)"),
        (lambda: cat(f, None, u, f, z, axis=0), TypeError, C + "Y_zero_point is required"),
        (lambda: cat(f, z.astype(np.int32), u, f, z, axis=0), TypeError, C + "Y_zero_point must be int8 or uint8"),
        (lambda: cat(0.1, z, u, f, z, axis=0), TypeError, C + "Y_scale must be float32, got float64"),
        (lambda: cat(f, z, u.astype(S8), f, s, axis=0), TypeError, C + "input 0 must be uint8 (Y_zero_point's type)"),
        (lambda: cat(f, z, u, f, z, u, 0.5, z, axis=0), TypeError, C + "input 1's scale must be float32"),
        (lambda: cat(f, z, u, f, None, axis=0), TypeError, C + "input 0's zero point is required"),
        (lambda: cat(f, z, u, f, s, axis=0), TypeError, C + "input 0's zero point must be uint8"),
        (lambda: cat(f, z, u, f, z, u.reshape(2, 2), f, z, axis=0), ValueError, C + "the inputs must have one rank"),
        (lambda: cat(f, z, z, f, z, axis=0), ValueError, C + "the inputs must have one rank, at least 1"),
        (
            lambda: cat(f, z, u.reshape(2, 2), f, z, np.zeros((2, 3), U8), f, z, axis=0),
            ValueError,
            C + "the inputs' shapes must be equal but on axis 0",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as raised:
            call()
        assert str(raised.value).startswith(message), (str(raised.value), message)


def test_inputs_not_modified_and_outputs_fresh():
    """Read-only inputs work (nothing is written into them); outputs are new, writeable arrays, also
    where concat copies its only input."""
    rng = np.random.default_rng(25)
    for dtype in (U8, S8):
        X, xz, yz = frozen(
            rng.integers(0, 256, (3, 5)).astype(np.uint8).view(dtype), zero_point(rng, dtype), zero_point(rng, dtype)
        )
        outs = [
            qlinear_sigmoid(X, F32(0.1), xz, F32(1 / 256), yz),
            qlinear_leaky_relu(X, F32(0.1), xz, F32(0.05), yz, alpha=0.2),
            qlinear_concat(F32(0.1), xz, X, F32(0.1), xz, axis=1),
            qlinear_concat(F32(0.1), yz, X, F32(0.1), xz, X, F32(0.2), xz, axis=0),
        ]
        for out in outs:
            assert out.flags.writeable and not np.shares_memory(out, X)
