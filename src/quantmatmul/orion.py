"""orion.py: Orion's fixed-point qlinear_matmul (gizatechxyz/orion, Cairo), reproduced bit for bit with exact integers."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = ["qlinear_matmul", "OrionError"]

_PREFIX = "orion.qlinear_matmul: "


class OrionError(ArithmeticError):
    """A computation that Orion's Cairo code would abort with a panic.

    Raised for fixed-point overflow of any intermediate value, division by a
    zero ``y_scale``, an input element equal to -128, and a result that would
    be -128 (or lower, before the clamp).
    """


# --------------------------------------------------------------------------
# Fixed-point formats
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Format:
    """An Orion sign-magnitude fixed-point type: value = (-1)**sign * mag / 2**frac."""

    name: str
    frac: int  # fractional bits
    width: int  # bits of the unsigned magnitude (u32 / u64 / u128)

    @property
    def one(self) -> int:
        return 1 << self.frac

    @property
    def max_mag(self) -> int:
        return (1 << self.width) - 1

    def describe_limit(self) -> str:
        return (
            f"{self.name} holds magnitudes up to 2**{self.width} - 1 raw, "
            f"i.e. |value| < 2**{self.width - self.frac}"
        )


_FORMATS = {
    f.name: f
    for f in (
        _Format("FP8x23", 23, 32),
        _Format("FP16x16", 16, 32),
        _Format("FP32x32", 32, 64),
        _Format("FP64x64", 64, 128),
    )
}


# --------------------------------------------------------------------------
# Orion's truncating sign-magnitude arithmetic, on arrays
# --------------------------------------------------------------------------


class _Arith:
    """Orion's fixed-point operations on arrays of signed raw integers.

    A fixed-point value v is held as the signed integer ``v * 2**frac``; its
    sign is Orion's sign bit and its absolute value Orion's magnitude.
    Orion's "negative zero" (a product or quotient that truncates to 0 with
    the sign bit set) becomes plain 0: Orion's add treats it as zero, it is
    neither below -128 nor above 127 in the clamp, and it converts to 0.

    Types with 32-bit magnitudes run on int64 / uint64 numpy arrays, which is
    exact: every magnitude is below 2**32, so a sum of two fits int64, a
    product of two fits uint64 and ``mag << frac`` (frac <= 23) fits int64.
    Wider types run on object arrays of Python integers.
    """

    def __init__(self, fmt: _Format):
        self.fmt = fmt
        self.dtype = np.int64 if fmt.width == 32 else object

    def array(self, values) -> np.ndarray:
        return np.asarray(values).astype(self.dtype)

    def _check(self, magnitude: np.ndarray, what: str) -> None:
        if magnitude.size and np.abs(magnitude).max() > self.fmt.max_mag:
            raise OrionError(
                f"{_PREFIX}{what} overflows: {self.fmt.describe_limit()}; Orion panics here"
            )

    def _signed(self, magnitude: np.ndarray, negative: np.ndarray) -> np.ndarray:
        magnitude = magnitude.astype(self.dtype)
        return np.where(negative, -magnitude, magnitude)

    def add(self, x, y, what: str) -> np.ndarray:
        """Exact sum; the magnitude must still fit."""
        total = x + y
        self._check(total, what)
        return total

    def mul(self, x, y, what: str) -> np.ndarray:
        """(|x| * |y|) >> frac, sign x XOR sign y: truncation toward zero."""
        if self.dtype is object:
            magnitude = np.abs(x) * np.abs(y)
        else:
            magnitude = np.abs(x).astype(np.uint64) * np.abs(y).astype(np.uint64)
        magnitude = magnitude >> self.fmt.frac
        self._check(magnitude, what)
        return self._signed(magnitude, (x < 0) != (y < 0))

    def div(self, x, y, what: str) -> np.ndarray:
        """(|x| << frac) // |y|, sign x XOR sign y: truncation toward zero."""
        if np.size(x) and np.any(np.asarray(y) == 0):
            raise OrionError(f"{_PREFIX}{what}: division by zero (y_scale == 0); Orion panics here")
        magnitude = (np.abs(x) << self.fmt.frac) // np.abs(y)
        self._check(magnitude, what)
        return self._signed(magnitude, (x < 0) != (y < 0))


# --------------------------------------------------------------------------
# Argument checking and conversion
# --------------------------------------------------------------------------


def _as_int8(x, name: str) -> np.ndarray:
    try:
        array = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{_PREFIX}{name} must be an int8 array, got {type(x).__name__}") from exc
    if array.dtype != np.int8:
        raise TypeError(
            f"{_PREFIX}{name} must be an int8 array (Orion's Tensor<i8>), got dtype {array.dtype}; "
            f"convert it with numpy.asarray({name}, dtype=numpy.int8)"
        )
    if array.ndim == 0:
        raise ValueError(f"{_PREFIX}{name} must have at least one dimension, got a 0-d array")
    return array


def _real_to_fraction(x, name: str) -> Fraction:
    """The exact value of a real number (int, float, Fraction, numpy scalar)."""
    if isinstance(x, (bool, np.bool_, np.complexfloating)) or not isinstance(x, (numbers.Real, np.number)):
        raise TypeError(f"{_PREFIX}{name} must hold real numbers, got {type(x).__name__}")
    try:
        if isinstance(x, (numbers.Integral, np.integer)):
            return Fraction(int(x))
        if isinstance(x, numbers.Rational):
            return Fraction(x.numerator, x.denominator)
        return Fraction(*x.as_integer_ratio())
    except (ValueError, OverflowError) as exc:
        shown = x.item() if isinstance(x, np.generic) else x
        raise ValueError(f"{_PREFIX}{name} must be finite, got {shown!r}") from exc


def _to_raw(value, name: str, fmt: _Format, raw: bool) -> np.ndarray:
    """A scale or zero point as an object array of signed raw integers (same shape)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{_PREFIX}{name} must be a real number or an array of them") from exc
    if array.size == 0:
        raise ValueError(f"{_PREFIX}{name} must have at least one element, got shape {array.shape}")
    if array.dtype.kind not in "iufO":
        raise TypeError(
            f"{_PREFIX}{name} must be a real number or an array of reals "
            f"(integers with raw=True), got dtype {array.dtype}"
        )
    result = np.empty(array.shape, dtype=object)
    for index, x in np.ndenumerate(array):
        if raw:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Integral, np.integer)):
                raise TypeError(
                    f"{_PREFIX}{name} must hold integers with raw=True "
                    f"(signed raw {fmt.name} values, value = raw / 2**{fmt.frac}), got {x!r}"
                )
            r = int(x)
            if abs(r) > fmt.max_mag:
                raise ValueError(
                    f"{_PREFIX}{name} raw value {r} does not fit {fmt.name}: "
                    f"its magnitude must be at most 2**{fmt.width} - 1"
                )
        else:
            # Nearest raw value, ties to even (Fraction.__round__).
            r = round(_real_to_fraction(x, name) * fmt.one)
            if abs(r) > fmt.max_mag:
                shown = x.item() if isinstance(x, np.generic) else x
                raise ValueError(
                    f"{_PREFIX}{name}={shown!r} is out of range for {fmt.name}: "
                    f"{fmt.describe_limit()}"
                )
        result[index] = r
    return result


def _place(param: np.ndarray, name: str, per_tensor: bool, target: str, shape: tuple):
    """A parameter ready to broadcast against a tensor of ``shape``.

    Per-tensor parameters become a single integer. Otherwise only the broadcasts
    that Orion gets right and that keep the tensor's shape are accepted.
    """
    if per_tensor:
        return int(param.flat[0])
    if param.ndim != len(shape) or any(p not in (1, s) for p, s in zip(param.shape, shape)):
        raise ValueError(
            f"{_PREFIX}{name} has shape {param.shape}, which is not supported against {target} "
            f"of shape {shape}: a scale / zero point pair must be per-tensor (both single-element), "
            f"or each must have the same rank as {target} with every dimension 1 or equal to "
            f"{target}'s (e.g. (M, 1) per row of a, (1, N) per column of b), a single-element "
            f"partner included (write 0 as [[0]] for a 2-D tensor); Orion broadcasts right-aligned "
            f"(a 1-D parameter is not per-row) and its broadcasting across ranks is unreliable"
        )
    return param


def _layout(a_shape: tuple, b_shape: tuple):
    """Orion's matmul shapes: (batch, M, K, N) and the output shape."""
    a_rank, b_rank = len(a_shape), len(b_shape)
    if a_rank <= 2 and b_rank <= 2:
        m, k = (1, a_shape[0]) if a_rank == 1 else a_shape
        k_b, n = (b_shape[0], 1) if b_rank == 1 else b_shape
        if k != k_b:
            raise ValueError(
                f"{_PREFIX}inner dimensions differ: a has shape {a_shape}, b has shape {b_shape} "
                f"(for 2-D inputs Orion does not check this and silently reads the wrong rows of b)"
            )
        if a_rank == 1 and b_rank == 1:
            out = (1,)  # Orion returns a 1-element tensor, not a scalar
        elif a_rank == 1:
            out = (n,)
        elif b_rank == 1:
            out = (m,)
        else:
            out = (m, n)
        return (1, m, k, n), out

    if a_rank != b_rank:
        raise ValueError(
            f"{_PREFIX}a has rank {a_rank} and b rank {b_rank}: above rank 2 Orion needs equal ranks "
            f"(it does not broadcast)"
        )
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"{_PREFIX}inner dimensions differ: a has shape {a_shape}, b has shape {b_shape}"
        )
    if a_shape[:-2] != b_shape[:-2]:
        raise ValueError(
            f"{_PREFIX}batch dimensions differ: a has shape {a_shape}, b has shape {b_shape}; "
            f"Orion pairs matrices by flat batch index without checking or broadcasting, so they "
            f"must be equal"
        )
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    if m * k == 0:
        raise ValueError(
            f"{_PREFIX}a has shape {a_shape}: above rank 2 Orion divides by M*K to count the "
            f"matrices, so M and K must be non-zero"
        )
    batch = int(np.prod(a_shape[:-2]))
    return (batch, m, k, n), a_shape[:-2] + (m, n)


# --------------------------------------------------------------------------
# The operator
# --------------------------------------------------------------------------


def _dequantize(q: np.ndarray, scale, zero_point, ar: _Arith, name: str) -> np.ndarray:
    """(fx(q) - zero_point) * scale per element: exact subtract, truncating multiply."""
    if np.any(q == -128):
        raise OrionError(
            f"{_PREFIX}{name} contains -128, which Orion cannot convert to fixed point (it panics)"
        )
    held = ar.array(q) * ar.fmt.one  # i8 -> T is exact and always fits
    shifted = ar.add(held, -zero_point, f"dequantizing {name}: {name} - {name}_zero_point")
    return ar.mul(shifted, scale, f"dequantizing {name}: ({name} - {name}_zero_point) * {name}_scale")


def _matmul(da: np.ndarray, db: np.ndarray, ar: _Arith) -> np.ndarray:
    """Batched matmul in fixed point: each product truncates, partial sums in order k = 0..K-1."""
    batch, m, k = da.shape
    n = db.shape[2]
    total = np.zeros((batch, m, n), dtype=ar.dtype)
    for i in range(k):
        product = ar.mul(da[:, :, i : i + 1], db[:, i : i + 1, :], f"matmul product at k={i}")
        total = ar.add(total, product, f"matmul partial sum at k={i}")
    return total


def _requantize(x: np.ndarray, y_scale, y_zero_point, ar: _Arith) -> np.ndarray:
    """trunc0(trunc0(x / y_scale) + y_zero_point), clamped, then integer part toward zero."""
    v = ar.div(x, y_scale, "requantizing: x / y_scale")
    v = ar.add(v, y_zero_point, "requantizing: x / y_scale + y_zero_point")
    one = ar.fmt.one
    if np.any(v <= -128 * one):
        raise OrionError(
            f"{_PREFIX}a result is <= -128 before conversion; Orion clamps it to -128 and then "
            f"panics converting -128 to i8 (its reachable outputs are -127..127)"
        )
    v = np.minimum(v, 127 * one)
    magnitude = np.abs(v) >> ar.fmt.frac
    return np.where(v < 0, -magnitude, magnitude).astype(np.int8)


def qlinear_matmul(
    a,
    a_scale,
    a_zero_point,
    b,
    b_scale,
    b_zero_point,
    y_scale,
    y_zero_point,
    *,
    fixed_point: str = "FP16x16",
    raw: bool = False,
) -> np.ndarray:
    """Orion's ``tensor.qlinear_matmul``, bit-identical to its Cairo implementation.

    Reproduces ``gizatechxyz/orion`` (commit ``bac0b424``, the head of the
    archived repository) for the fixed-point types FP8x23, FP16x16,
    FP32x32 and FP64x64. Every step uses Orion's sign-magnitude fixed-point
    arithmetic, which truncates toward zero, so results differ from ONNX
    ``QLinearMatMul`` (which rounds once, half to even)::

        da[i, k] = (a[i, k] - a_zero_point) * a_scale     # one truncating multiply
        db[k, j] = (b[k, j] - b_zero_point) * b_scale
        x[i, j]  = sum over k = 0, 1, ... of da[i, k] * db[k, j]   # each product truncates
        v        = x / y_scale + y_zero_point              # truncating divide, exact add
        y[i, j]  = trunc_toward_zero(min(v, 127))          # v <= -128 raises OrionError

    Parameters
    ----------
    a, b : array_like of int8
        Quantized inputs (Orion's ``Tensor<i8>``). Other dtypes raise
        ``TypeError``; an element equal to -128 raises ``OrionError``
        (Orion panics converting it). Never modified.
    a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point : real or array_like
        Scales and zero points, all of the fixed-point type. Zero points may be
        fractional or negative, as in Orion. Real values are rounded to the
        nearest value of the type (raw = round(x * 2**frac), ties to even);
        with ``raw=True`` they are signed raw integers, value = raw / 2**frac
        (raw -5 is Orion's magnitude 5 with the sign bit set). A magnitude
        that does not fit the type (2**32 - 1 raw for FP8x23 and FP16x16,
        2**64 - 1 for FP32x32, 2**128 - 1 for FP64x64), before or after
        rounding, raises ``ValueError``.

        Per-tensor (a scale and its zero point both single-element, of any
        shape) is the main case. Otherwise Orion applies the same formula
        elementwise with right-aligned broadcasting, which it only gets right
        for equal ranks; so a non-scalar parameter must have the rank of the
        tensor it applies to (a, b or the output) with each dimension 1 or
        equal to that tensor's: ``(M, 1)`` per row of a 2-D ``a``, ``(1, N)``
        per column of a 2-D ``b``, the output shape for ``y_scale``; a
        single-element partner of a non-scalar parameter needs that rank too
        (``[[0]]``, not ``0``). Anything else, including a parameter that
        would enlarge the tensor by broadcasting, raises ``ValueError`` (note
        that a 1-D parameter is NOT per-row: it lies along the last axis).
    fixed_point : {"FP16x16", "FP8x23", "FP32x32", "FP64x64"}, keyword-only
        Orion's number type ``T``: fractional bits 16, 23, 32, 64 and
        magnitude widths 32, 32, 64, 128 bits.
    raw : bool, keyword-only
        Read the six scales and zero points as raw fixed-point integers.

    Returns
    -------
    numpy.ndarray of int8
        Values in -127..127, with Orion's output shape: 1-D x 1-D gives
        shape ``(1,)``; a 1-D ``a`` gives ``(N,)``; a 1-D ``b`` gives
        ``(M,)``; 2-D x 2-D gives ``(M, N)``; above rank 2 both ranks must be
        equal and the result is ``a.shape[:-2] + (M, N)``, matrices paired by
        batch index.

    Raises
    ------
    TypeError
        ``a`` or ``b`` is not int8; a parameter is not real (or not an
        integer with ``raw=True``).
    ValueError
        A shape Orion would mishandle or panic on: inner dimensions or 1-D
        lengths differ (Orion does not check 2-D inputs), ranks differ above rank 2, batch
        dimensions differ (Orion pairs matrices by flat index without
        checking), M or K is 0 above rank 2, a 0-d input; an unsupported
        parameter shape; a parameter out of range; an unknown
        ``fixed_point``.
    OrionError
        Wherever Orion panics: any intermediate magnitude that leaves the
        type (each ``a - zero_point``, dequantized element, product, running
        partial sum in order k = 0..K-1, ``x / y_scale`` before the clamp, and
        ``+ y_zero_point``), ``y_scale == 0``, an input element of -128, or a
        result of -128 or below (Orion clamps to -128, then cannot convert it).

    Notes
    -----
    All arithmetic is on exact integers (int64 where provably safe, Python
    integers otherwise), so FP64x64 is exact too. Orion's ``i8`` and ``i32``
    number types, and its wide FP types (which panic ``not supported!``), are
    not reproduced.

    Examples
    --------
    Orion's documentation example:

    >>> import numpy as np
    >>> a = np.array([[3, 4, 5], [2, 4, 3]], dtype=np.int8)
    >>> b = np.array([[4], [8], [4]], dtype=np.int8)
    >>> qlinear_matmul(a, 2.0, 1.0, b, 0.25, 0.0, 6.0, 10.0)
    array([[14],
           [13]], dtype=int8)

    The same call with raw FP16x16 parameters, as Orion writes them:

    >>> qlinear_matmul(a, 131072, 65536, b, 16384, 0, 393216, 655360, raw=True)
    array([[14],
           [13]], dtype=int8)
    """
    if not isinstance(fixed_point, str):
        raise TypeError(f"{_PREFIX}fixed_point must be a str, got {type(fixed_point).__name__}")
    fmt = _FORMATS.get(fixed_point)
    if fmt is None:
        raise ValueError(
            f"{_PREFIX}fixed_point must be one of {', '.join(_FORMATS)}, got {fixed_point!r}"
        )
    if not isinstance(raw, (bool, np.bool_)):
        raise TypeError(f"{_PREFIX}raw must be a bool, got {type(raw).__name__}")

    a = _as_int8(a, "a")
    b = _as_int8(b, "b")
    (batch, m, k, n), out_shape = _layout(a.shape, b.shape)

    params = {
        name: _to_raw(value, name, fmt, bool(raw))
        for name, value in (
            ("a_scale", a_scale),
            ("a_zero_point", a_zero_point),
            ("b_scale", b_scale),
            ("b_zero_point", b_zero_point),
            ("y_scale", y_scale),
            ("y_zero_point", y_zero_point),
        )
    }
    ar = _Arith(fmt)
    placed = {}
    targets = (("a", "a", a.shape), ("b", "b", b.shape), ("y", "the output", out_shape))
    for prefix, target, shape in targets:
        scale, zero_point = params[f"{prefix}_scale"], params[f"{prefix}_zero_point"]
        per_tensor = scale.size == 1 and zero_point.size == 1
        for name in (f"{prefix}_scale", f"{prefix}_zero_point"):
            placed[name] = ar.array(_place(params[name], name, per_tensor, target, shape))

    da = _dequantize(a, placed["a_scale"], placed["a_zero_point"], ar, "a")
    db = _dequantize(b, placed["b_scale"], placed["b_zero_point"], ar, "b")
    x = _matmul(da.reshape(batch, m, k), db.reshape(batch, k, n), ar).reshape(out_shape)
    return _requantize(x, placed["y_scale"], placed["y_zero_point"], ar)
