"""onnx/_qconv.py: ONNX QLinearConv and ConvInteger as an im2col over the int8 GEMM kernels, QLinearConv in the three numerics of QLinearMatMul (ONNX Runtime's bits by default).

For ``x [N, C, D1, ..., Dn]`` and ``w [M, C / group, k1, ..., kn]`` (n >= 1), each output position's
receptive field (x padded with ``x_zero_point``: a real 0) is one row of a matrix of codes, each
group's weight one matrix, so that

    acc[n, m, o] = sum_{c, k} (x_padded[n, c, o * stride + k * dilation] - x_zero_point)
                              * (w[m, c, k] - w_zero_point[m])            (int32, wrapping)

is an integer GEMM per group on the kernels of MatMulInteger (a constant w packed once), and
QLinearConv's output is ``acc[n, m, o] + B[m]`` (int32, wrapping) requantized with the scale
``x_scale * w_scale[m] / y_scale`` and ``y_zero_point``:

* ``"onnxruntime"``: ONNX Runtime's CPU kernel (its GEMM and depthwise paths; MLAS's requantization):
  the float32 multiplier ``f32(f32(x_scale * w_scale[m]) / y_scale)``, ``f32(acc + B) * multiplier``
  clamped to ``[qmin - zp, qmax - zp]``, rounded half to even, plus the zero point. Computed in the
  GEMM's own epilogue (QLinearMatMul's), B added to its int32 sums first; the other numerics and the
  depthwise loop requantize the int32 sums in a pass of their own (csrc/conv.cpp).
* ``"onnx-reference"``: onnx.reference's QLinearConv: that float32 multiplier applied in float64,
  plus the zero point, clipped, rounded half to even.
* ``"exact"``: ``(acc + B) * x_scale * w_scale[m] / y_scale`` rounded once, half to even.

Types as the spec's: x, w and y each int8 or uint8 (y's type is ``y_zero_point``'s), the scales
float32, ``x_zero_point`` / ``y_zero_point`` one value, ``w_scale`` / ``w_zero_point`` one value or one
per output channel (``[M]``), B int32 ``[M]``. The attributes as the spec has them (auto_pad,
dilations, group, kernel_shape, pads, strides). ConvInteger (opset 10) is the same sum, returned.

Memory layout: the sums are formed channels-last (each output position's M channels side by side), so
``memory_format="channels_last"`` returns them as they are, a view of shape ``[N, M, D1', ...]`` whose
memory is ``[N, D1', ..., M]`` (PyTorch's name for it); the default ``"contiguous"`` copies them into
C order. An x whose memory is channels-last already (such a view) is read as it is, without a copy:
the session passes activations from one convolution to the next that way.
"""

from __future__ import annotations

import math
from math import prod
from typing import NamedTuple

import numpy as np

from .. import _core
from ..qlinear import NUMERICS
from ._integer import _IntegerOperand

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
_F32 = np.dtype(np.float32)
_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_NUMERICS_ID = {name: i for i, name in enumerate(NUMERICS)}  # requantize_columns' numbers
_NO_BIAS = np.zeros((1, 0), np.int32)
MEMORY_FORMATS = ("contiguous", "channels_last")


def _memory_format(fn: str, memory_format) -> None:
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(
            f"{fn}: memory_format must be one of {', '.join(map(repr, MEMORY_FORMATS))}, got {memory_format!r}"
        )


class ConvWeight(NamedTuple):
    """w checked and laid out: per group ``[K, M/group]`` for the GEMM (rows in the columns' order: taps, then
    channels; K = prod(k) * C/group padded with zero rows to a multiple of 4), packed once, with its zero point ``[group, M/group]`` (int32); or for a
    depthwise convolution the differences ``w - w_zero_point`` ``[prod(k), M]`` (int16). The scale per
    output channel ``[M]`` (float32; None for ConvInteger)."""

    w: np.ndarray  # the weight as given [M, C/group, k...]
    operand: _IntegerOperand | None  # the GEMM's b, or None (depthwise)
    scale: np.ndarray | None
    group: int
    depthwise: np.ndarray | None  # one input and one output channel per group: w - w_zero_point [taps, M] (int16)
    index: np.ndarray | None = None  # the GEMM's batch map, group g -> matrix g (int64)


def conv_weight(w, w_scale, w_zero_point, group: int, fn: str) -> ConvWeight:
    """w with its scale (None for ConvInteger) and zero point checked, laid out and packed (ConvWeight)."""
    w = np.asarray(w)
    if w.dtype not in _INT8:
        raise TypeError(f"{fn}: w must be int8 or uint8, got {w.dtype}")
    if w.ndim < 3:
        raise ValueError(f"{fn}: w must be [M, C/group, k1, ...] with at least one spatial axis, got shape {w.shape}")
    if not isinstance(group, (int, np.integer)) or group < 1:
        raise ValueError(f"{fn}: group must be a positive integer, got {group!r}")
    group = int(group)
    M = w.shape[0]
    if M % group:
        raise ValueError(f"{fn}: w's {M} output channels do not divide into group = {group}")
    zp = _per_channel(w_zero_point, "w_zero_point", M, fn, dtype=w.dtype)
    scale = None
    if w_scale is not None:
        scale = _per_channel(w_scale, "w_scale", M, fn, dtype=_F32)
        if zp.size > 1 and scale.size == 1:
            raise ValueError(f"{fn}: w_zero_point has one value per channel ([{M}]) but w_scale only one")
        scale = np.ascontiguousarray(np.broadcast_to(scale, (M,)))
        if not np.all(np.isfinite(scale)) or np.any(scale == 0):
            raise ValueError(f"{fn}: w_scale must be finite and nonzero")
    Mg, Cg = M // group, w.shape[1]
    zp_m = np.broadcast_to(zp.astype(np.int32), (M,))
    if Cg == 1 and Mg == 1:  # depthwise: w minus its zero point, [taps, C] (int16)
        taps = prod(w.shape[2:])
        depthwise = np.ascontiguousarray((w.reshape(M, taps).astype(np.int16) - zp_m[:, None].astype(np.int16)).T)
        return ConvWeight(w, None, scale, group, depthwise)
    # [M, Cg, k...] -> [group, taps * Cg, Mg], the rows in the columns' order (taps, then channels):
    # column m of group g is output channel g * Mg + m
    matrices = np.moveaxis(w.reshape(group, Mg, Cg, -1), 2, 3).reshape(group, Mg, -1)
    # K padded to whole groups of 4 (the columns' padding is x's zero point: (x_zp - x_zp) * w = 0), so
    # that the GEMM reads uint8 columns in place rather than packing them (the VNNI layout's k-quads)
    kp = -(-matrices.shape[2] // 4) * 4
    padded = np.zeros((group, kp, Mg), w.dtype)
    padded[:, : matrices.shape[2]] = matrices.transpose(0, 2, 1)
    matrices = padded
    # One group of channels in whole quads: products may read x in place (through its receptive fields, or as
    # the rows of a 1x1 convolution), packed for the entry that does (on the amx table the avx512_vnni one,
    # whose products read x as it lies where the tiles pack it per call: _core.pack_b)
    receptive = group == 1 and Cg % 4 == 0
    packed = _core.pack_b(matrices, w.dtype == np.int8, receptive) if matrices.size else None
    operand = _IntegerOperand(matrices, np.ascontiguousarray(zp_m.reshape(group, Mg)), packed)
    return ConvWeight(w, operand, scale, group, None, np.arange(group, dtype=np.int64))


def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    B=None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    pads=None,
    strides=None,
    numerics: str = "onnxruntime",
    weight: ConvWeight | None = None,
    memory_format: str = "contiguous",
) -> np.ndarray:
    """ONNX QLinearConv (opset 10): the module's docstring. ``weight``: w from conv_weight (w, w_scale,
    w_zero_point and group then unused), for a constant weight packed once."""
    fn = "qlinear_conv"
    _memory_format(fn, memory_format)
    if numerics not in NUMERICS:
        raise ValueError(f"{fn}: numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")
    if weight is None:
        weight = conv_weight(w, w_scale, w_zero_point, group, fn)
    conv = QLinearConvCall(
        weight,
        x_scale,
        x_zero_point,
        y_scale,
        y_zero_point,
        B,
        (auto_pad, dilations, kernel_shape, pads, strides),
        numerics,
    )
    return conv(x, memory_format)


def conv_integer(
    x,
    w,
    x_zero_point=None,
    w_zero_point=None,
    *,
    auto_pad: str = "NOTSET",
    dilations=None,
    group: int = 1,
    kernel_shape=None,
    pads=None,
    strides=None,
    weight: ConvWeight | None = None,
    memory_format: str = "contiguous",
) -> np.ndarray:
    """ONNX ConvInteger (opset 10): the int32 sums of the module's docstring (zero points default to 0)."""
    fn = "conv_integer"
    _memory_format(fn, memory_format)
    if weight is None:
        weight = conv_weight(w, None, w_zero_point, group, fn)
    conv = _Conv(fn, weight, (auto_pad, dilations, kernel_shape, pads, strides))
    acc, shapes = conv.sums(x, x_zero_point)
    return _channels_first(acc, shapes.out_shape, memory_format)


# ---------------------------------------------------------------------------------------------------


class _Requantization(NamedTuple):
    """ONNX Runtime's requantization in the GEMM's epilogue: the float32 multiplier [group, 1, M/group], the
    bias [group, M/group] (int32) or None, the zero point [1, 1, 1] (int32) and the output type."""

    multiplier: np.ndarray
    bias: np.ndarray | None
    zero_point: np.ndarray
    dtype: np.dtype


class _Shapes(NamedTuple):
    """What a convolution's x shape gives (_Conv.shapes): the output [N, M, out...], the GEMM's rows
    N * prod(out), [N, C, group] and the geometry the C++ loops take, and whether the convolution is a 1x1
    one that reads x's channels-last rows as its columns."""

    out_shape: tuple
    rows: int
    shape: list
    geometry: list
    one_by_one: bool
    offsets: np.ndarray | None  # the receptive fields [rows, taps] (_core.conv_offsets), where x can be read in place


class _Conv:
    """One convolution's weight and attributes, checked once, with what each x shape seen gives (a session
    node calls it with the same shape run after run: the attribute checks and shape arithmetic once)."""

    def __init__(self, fn, weight: ConvWeight, attributes):
        self.fn, self.weight, self.attributes = fn, weight, attributes
        self._shapes = {}
        self._kept_rows = None

    def shapes(self, x: np.ndarray) -> _Shapes:
        """x's output shape and geometry (x an int8 / uint8 array of w's rank), checked on x's first shape."""
        found = self._shapes.get(x.shape)
        if found is None:
            if len(self._shapes) >= 16:  # (a node fed many shapes: keep the cache small)
                self._shapes.clear()
            found = self._shapes[x.shape] = self._checked_shapes(x)
        return found

    def _checked_shapes(self, x: np.ndarray) -> _Shapes:
        fn, weight = self.fn, self.weight
        auto_pad, dilations, kernel_shape, pads, strides = self.attributes
        w, group, (N, C), spatial = weight.w, weight.group, x.shape[:2], x.shape[2:]
        if C != w.shape[1] * group:
            raise ValueError(f"{fn}: x has {C} channels, w expects {w.shape[1]} per group x {group} groups")
        kernel = tuple(w.shape[2:])
        if kernel_shape is not None and tuple(int(k) for k in kernel_shape) != kernel:
            raise ValueError(f"{fn}: kernel_shape {list(kernel_shape)} differs from w's spatial shape {list(kernel)}")
        nd = len(spatial)
        strides = _ints(strides, nd, "strides", fn, 1)
        dilations = _ints(dilations, nd, "dilations", fn, 1)
        extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        begin, end = _padding(auto_pad, pads, spatial, extent, strides, fn)
        padded = [s + b + e for s, b, e in zip(spatial, begin, end)]
        out = [(p - e) // s + 1 if p >= e else 0 for p, e, s in zip(padded, extent, strides)]
        if any(o < 1 for o in out):
            raise ValueError(
                f"{fn}: the kernel (extent {extent} with dilations) does not fit x's padded spatial shape {padded}"
            )
        one_by_one = prod(kernel) == 1 and all(s == 1 for s in strides) and not any(begin) and not any(end)
        one_by_one = one_by_one and group == 1 and weight.operand is not None and weight.operand.x.shape[1] == C
        geometry = [list(spatial), out, list(kernel), strides, dilations, begin]
        rows, offsets = N * prod(out), None
        # One group, channels in whole quads (K = taps * C unpadded), byte offsets in int32, a weight packed
        # for a kernel over receptive fields: the GEMM may read x in place (qlinear_matmul_onnxruntime_taps).
        packed = weight.operand.packed if weight.operand is not None else None
        in_place = packed is not None and packed.reads_receptive_fields and group == 1 and not one_by_one
        if in_place and C % 4 == 0 and x.size < 2**31 and rows:
            offsets = np.empty((rows, prod(kernel)), np.int32)
            _core.conv_offsets([N, C, group], geometry, offsets)
            offsets.flags.writeable = False
        return _Shapes((N, w.shape[0], *out), rows, [N, C, group], geometry, one_by_one, offsets)

    def checked_x(self, x, x_zero_point) -> tuple[np.ndarray, int]:
        """x as an array and its zero point as an int, checked."""
        fn = self.fn
        x = np.asarray(x)
        if x.dtype not in _INT8:
            raise TypeError(f"{fn}: x must be int8 or uint8, got {x.dtype}")
        if x.ndim != self.weight.w.ndim:
            raise ValueError(
                f"{fn}: x {x.shape} and w {self.weight.w.shape} must have the same rank ([N, C, D1, ...], [M, C/group, k1, ...])"
            )
        x_zp = 0 if x_zero_point is None else int(_scalar(x_zero_point, "x_zero_point", fn, x.dtype))
        return x, x_zp

    def sums(self, x, x_zero_point, requantize: _Requantization | None = None):
        """The int32 sums [N * prod(out), M] (rows: positions, columns: output channels) and x's _Shapes, through
        an im2col (or x's own rows for a 1x1 convolution); with requantize (and a GEMM: not depthwise), the 8-bit
        outputs instead, ONNX Runtime's bits. (QLinearConvCall's planned calls read x in place where they can.)"""
        x, x_zp = self.checked_x(x, x_zero_point)
        shapes = self.shapes(x)
        weight, rows = self.weight, shapes.rows
        group, M = weight.group, weight.w.shape[0]
        if rows == 0 or M == 0:
            return np.zeros((rows, M), np.int32), shapes
        channels_last = _channels_last(x)
        if weight.depthwise is not None:  # one input and one output channel per group
            acc = np.empty((rows, M), np.int32)
            _core.conv_depthwise(
                channels_last, x.dtype == np.int8, shapes.shape, shapes.geometry, x_zp, weight.depthwise, acc
            )
            return acc, shapes
        w_matrices = weight.operand.x  # [group, taps * C/group, M/group]
        if shapes.one_by_one:  # (C a multiple of 4: K unpadded) each pixel's channels are its row
            columns = channels_last.reshape(1, rows, shapes.shape[1])
        else:
            columns = np.empty((group, rows, w_matrices.shape[1]), x.dtype)  # K padded as the weight
            _core.conv_columns(
                channels_last.view(np.uint8),
                shapes.shape,
                shapes.geometry,
                int(np.asarray(x_zp, x.dtype).view(np.uint8)),
                columns.view(np.uint8),
            )
        if w_matrices.shape[1] == 0:  # no input channels: empty sums
            return np.zeros((rows, M), np.int32), shapes
        a_zp, multiplier, zero_point = self._row_operands(shapes, x_zp, requantize)
        operands = (columns, x.dtype == np.int8, weight.index, a_zp, weight.operand.packed, w_matrices.dtype == np.int8)
        operands += (weight.index, weight.operand.zp)
        if requantize is None:  # [group, rows, M/group], the int8 GEMM kernels' exact sums (wrapping int32)
            acc = _core.matmul_integer(*operands)
        else:
            acc = np.empty((group, rows, M // group), requantize.dtype)
            tail = (multiplier, acc, acc.dtype == np.int8, zero_point)
            if requantize.bias is None:
                _core.qlinear_matmul_onnxruntime(*operands, *tail)
            else:
                _core.qlinear_matmul_onnxruntime_bias(*operands, requantize.bias, *tail)
        if group == 1:
            return acc.reshape(rows, M), shapes
        return np.ascontiguousarray(acc.transpose(1, 0, 2)).reshape(rows, M), shapes

    def _row_operands(self, shapes: _Shapes, x_zp: int, requantize: _Requantization | None):
        """The GEMM's per-row a zero points [group, rows] (int32), and with requantize its multiplier and zero
        point broadcast to [group, rows, M/group]: read-only arrays, kept for the last shape and x zero point."""
        kept = self._kept_rows
        if kept is None or kept[0] != (shapes.rows, x_zp) or kept[1] is not requantize:
            group, rows, Mg = self.weight.group, shapes.rows, self.weight.w.shape[0] // self.weight.group
            a_zp = np.full((group, rows), x_zp, np.int32)
            a_zp.flags.writeable = False
            tail = (None, None)
            if requantize is not None:
                view = (group, rows, Mg)
                tail = (np.broadcast_to(requantize.multiplier, view), np.broadcast_to(requantize.zero_point, view))
            kept = self._kept_rows = ((rows, x_zp), requantize, a_zp, *tail)
        return kept[2:]


class QLinearConvCall(_Conv):
    """One QLinearConv's parameters other than x, checked once (qlinear_conv's, whose checks these are): the
    weight, x's scale and zero point, y's, the bias and the attributes; calls take x. The session holds one per
    node whose parameters are all initializers."""

    def __init__(self, weight: ConvWeight, x_scale, x_zero_point, y_scale, y_zero_point, B, attributes, numerics):
        fn = "qlinear_conv"
        super().__init__(fn, weight, attributes)
        x_s = _scalar(x_scale, "x_scale", fn, _F32)
        y_s = _scalar(y_scale, "y_scale", fn, _F32)
        y_zp = np.asarray(y_zero_point)
        if y_zp.dtype not in _INT8:
            raise TypeError(f"{fn}: y_zero_point must be int8 or uint8 (it selects y's type), got {y_zp.dtype}")
        y_zp = _scalar(y_zp, "y_zero_point", fn, y_zp.dtype)
        for name, s in (("x_scale", x_s), ("y_scale", y_s)):  # (w_scale: checked with the weight)
            if not math.isfinite(s) or s == 0:
                raise ValueError(f"{fn}: {name} must be finite and nonzero")
        M = weight.w.shape[0]
        bias = None
        if B is not None:
            bias = np.asarray(B)
            if bias.dtype != np.int32:
                raise TypeError(f"{fn}: B must be int32, got {bias.dtype}")
            if bias.shape != (M,):
                raise ValueError(f"{fn}: B must have one value per output channel ([{M}]), got shape {bias.shape}")
            bias = np.ascontiguousarray(bias)
        multiplier = None  # float32 f32(f32(x_scale * w_scale[m]) / y_scale), as ORT forms it; exact: unused
        if numerics != "exact":
            with np.errstate(over="ignore", under="ignore"):
                multiplier = (x_s * weight.scale) / y_s
            if not np.all(np.isfinite(multiplier)):
                raise ValueError(
                    f"{fn}: x_scale * w_scale / y_scale overflows float32; use numerics='exact' for such scales"
                )
        self._fused = None
        if numerics == "onnxruntime" and weight.depthwise is None:  # the GEMM's epilogue requantizes, B added first
            Mg = M // weight.group
            self._fused = _Requantization(
                multiplier.reshape(weight.group, 1, Mg),
                None if bias is None else np.ascontiguousarray(bias.reshape(weight.group, Mg)),
                np.asarray(y_zp, np.int32).reshape(1, 1, 1),
                y_zp.dtype,
            )
        self._x_zero_point, self._x_s, self._y_s, self._y_zp = x_zero_point, x_s, y_s, y_zp
        self._bias, self._multiplier, self._numerics = bias, multiplier, _NUMERICS_ID[numerics]
        self._plans = {}  # _plan's per x shape and type (False: falls back), for calls and bound() alike

    def __call__(self, x, memory_format: str = "contiguous") -> np.ndarray:
        if type(x) is np.ndarray:  # its plan where it has one (checked and formed once per shape and type)
            done = self._planned(self._plans, (x.shape, x.dtype), x, None, None)
            if done is not None:
                return _channels_first(*done, memory_format)
        if self.weight.depthwise is not None:
            return self._depthwise(x, memory_format)
        acc, shapes = self.sums(x, self._x_zero_point, self._fused)
        if acc.dtype != np.int32:  # requantized already
            return _channels_first(acc, shapes.out_shape, memory_format)
        y = np.empty(acc.shape, self._y_zp.dtype)
        _core.requantize_columns(acc, *self._requantization(y))
        return _channels_first(y, shapes.out_shape, memory_format)

    def bound(self, add: tuple | None = None):
        """A function of x giving ``self(x, "channels_last")`` for the x it takes, else None (the call then runs
        x, with its checks and errors): per x shape and type, checked once and its arguments formed
        once: a depthwise convolution, and in numerics "onnxruntime" one of one group read in place through its
        receptive fields, a 1x1 one or an im2col's (grouped ones fall back). A session node's call: the
        checks and argument forming took 7-13 us of a MobileNetV2 convolution's 25-65. With add =
        (product_first, parameters: the add's, as onnx/_pairs.py forms them), a function of (x, other) giving
        the QLinearConv -> QLinearAdd pair's output, the add applied to each block of the product as the GEMM
        writes it (other: y's type and shape, its memory channels-last; its shape, type and strides in the
        key too)."""
        plans = self._plans if add is None else {}
        if add is None:

            def call(x):
                if type(x) is not np.ndarray:
                    return None
                done = self._planned(plans, (x.shape, x.dtype), x, None, None)  # (any layout: read per call)
                return None if done is None else _channels_first(*done, "channels_last")

            return call

        def call_with_add(x, other):
            if type(x) is not np.ndarray or type(other) is not np.ndarray:
                return None
            done = self._planned(plans, (x.shape, x.dtype, other.shape, other.dtype, other.strides), x, other, add)
            return None if done is None else _channels_first(*done, "channels_last")

        return call_with_add

    def _planned(self, plans: dict, key, x, other, add):
        """(the outputs [rows, M], the output shape) by x's plan in plans (made on its key's first call), or None
        where it has none or its call declines x."""
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= 16:  # (a node fed many shapes: keep the cache small)
                plans.clear()
            try:
                plan = plans[key] = self._plan(x, other, add) or False
            except (TypeError, ValueError):  # the call raises it
                plan = plans[key] = False
        if not plan:
            return None
        call, out_shape = plan
        y = call(x, other)
        return None if y is None else (y, out_shape)

    def _plan(self, x, other, add):
        """The plan for x's shape and type (and other's, with its strides; checked here): (a function of (x,
        other) giving the outputs [rows, M], or None where its C++ call declines x; the output shape), or None
        where the general call runs."""
        x, x_zp = self.checked_x(x, self._x_zero_point)
        shapes = self.shapes(x)
        weight, rows, M = self.weight, shapes.rows, shapes.out_shape[1]
        if rows == 0 or M == 0:
            return None
        if add is not None:  # the add's other operand: y's type and shape, its memory channels-last
            last = other.transpose(0, *range(2, other.ndim), 1)
            if other.dtype != self._y_zp.dtype or other.shape != shapes.out_shape or not last.flags.c_contiguous:
                return None
        if weight.depthwise is not None:
            if add is not None:
                return None
            head = (x.dtype == np.int8, shapes.shape, shapes.geometry, x_zp, weight.depthwise)
            bias, multiplier, *scales, y_zp, _, y_signed, numerics = self._requantization(np.empty(0, self._y_zp.dtype))

            def depthwise(x, _):
                y = np.empty((rows, M), self._y_zp.dtype)
                _core.conv_depthwise_requantized(
                    _channels_last(x), *head, bias, multiplier, *scales, y_zp, y, y_signed, numerics
                )
                return y

            return depthwise, shapes.out_shape
        requantize, w_matrices = self._fused, weight.operand.x
        if requantize is None or weight.group != 1 or not w_matrices.size:
            return None
        y_signed = requantize.dtype == np.int8

        def stage(other):  # the add's arguments after the product's: its codes as [rows, M]
            if add is None:
                return ()
            return (other.transpose(0, *range(2, other.ndim), 1).reshape(rows, M), *add)

        if shapes.offsets is not None:  # read in place (int8 x as uint8 x + 128, its zero point x_zp + 128)
            signed_x = x.dtype == np.int8
            pad = x_zp + 128 if signed_x else x_zp
            a_zp, multiplier, zero_point = self._row_operands(shapes, pad, requantize)
            bias = requantize.bias if requantize.bias is not None else _NO_BIAS
            b = (weight.operand.packed, weight.w.dtype == np.int8, weight.index, weight.operand.zp, bias, multiplier)

            def in_place(x, other):
                codes = _channels_last(x)
                if signed_x:
                    codes = np.bitwise_xor(codes.view(np.uint8), np.uint8(0x80))
                y = np.empty((1, rows, M), requantize.dtype)
                taps = (codes, shapes.offsets, pad, a_zp, *b, y, y_signed, zero_point, *stage(other))
                return y.reshape(rows, M) if _core.qlinear_matmul_onnxruntime_taps(*taps) else None

            return in_place, shapes.out_shape
        a_zp, multiplier, zero_point = self._row_operands(shapes, x_zp, requantize)
        operands = (x.dtype == np.int8, weight.index, a_zp, weight.operand.packed, w_matrices.dtype == np.int8)
        operands += (weight.index, weight.operand.zp)
        C, K = shapes.shape[1], w_matrices.shape[1]
        pad_byte = int(np.asarray(x_zp, x.dtype).view(np.uint8))

        def rows_of(x):  # the product's rows: x's pixels (1x1), else an im2col (K padded as the weight)
            if shapes.one_by_one:
                return _channels_last(x).reshape(1, rows, C)
            columns = np.empty((1, rows, K), x.dtype)
            cl = _channels_last(x).view(np.uint8)
            _core.conv_columns(cl, shapes.shape, shapes.geometry, pad_byte, columns.view(np.uint8))
            return columns

        if requantize.bias is None and add is None:
            product, tail = _core.qlinear_matmul_onnxruntime, (multiplier,)
        else:  # (a zero bias where there is none, to take the add's stage)
            bias = requantize.bias if requantize.bias is not None else np.zeros((1, M), np.int32)
            product, tail = _core.qlinear_matmul_onnxruntime_bias, (bias, multiplier)

        def gemm(x, other):
            y = np.empty((1, rows, M), requantize.dtype)
            product(rows_of(x), *operands, *tail, y, y_signed, zero_point, *stage(other))
            return y.reshape(rows, M)

        return gemm, shapes.out_shape

    def _requantization(self, y: np.ndarray) -> tuple:
        """requantize_columns' arguments after the sums (conv_depthwise_requantized's too), writing y."""
        scales = (float(self._x_s), self.weight.scale, float(self._y_s))
        return (self._bias, self._multiplier, *scales, int(self._y_zp), y, y.dtype == np.int8, self._numerics)

    def _depthwise(self, x, memory_format: str) -> np.ndarray:
        """A depthwise convolution: its sums requantized block by block in C++ as they are formed (the numerics'
        arithmetic of requantize_columns, without an int32 array of the whole output)."""
        x, x_zp = self.checked_x(x, self._x_zero_point)
        shapes = self.shapes(x)
        rows, M = shapes.rows, self.weight.w.shape[0]
        y = np.empty((rows, M), self._y_zp.dtype)
        if y.size:
            cl = _channels_last(x)
            args = (cl, x.dtype == np.int8, shapes.shape, shapes.geometry, x_zp, self.weight.depthwise)
            _core.conv_depthwise_requantized(*args, *self._requantization(y))
        return _channels_first(y, shapes.out_shape, memory_format)


def _channels_first(values: np.ndarray, out_shape, memory_format: str = "contiguous") -> np.ndarray:
    """[N * prod(out), M] -> [N, M, out...]: a copy in C order, or (channels_last) a view of values."""
    N, M, *out = out_shape
    if memory_format == "channels_last":
        return values.reshape(N, *out, M).transpose(0, len(out) + 1, *range(1, len(out) + 1))
    return _transposed(values.reshape(N, prod(out), M)).reshape(out_shape)


def _channels_last(x: np.ndarray) -> np.ndarray:
    """x [N, C, D...] as a C-contiguous [N, D..., C]: a view where x's memory is so already (a channels_last
    result), else a copy (a blocked transpose in C++ from C order)."""
    moved = x.transpose(0, *range(2, x.ndim), 1)
    if moved.flags.c_contiguous:
        return moved
    if not x.flags.c_contiguous:
        return np.ascontiguousarray(moved)
    N, C = x.shape[:2]
    return _transposed(x.reshape(N, C, -1)).reshape(moved.shape)


def _transposed(x: np.ndarray) -> np.ndarray:
    """[B, R, C] -> [B, C, R], contiguous (a blocked copy in C++ for 1- and 4-byte elements)."""
    y = np.empty((x.shape[0], x.shape[2], x.shape[1]), x.dtype)
    if y.size:
        _core.transpose_planes(np.ascontiguousarray(x), y)
    return y


def _padding(auto_pad, pads, spatial, extent, strides, fn):
    """(begin, end) padding per spatial axis: pads as given (NOTSET), none (VALID), or SAME_UPPER /
    SAME_LOWER's: the output ceil(D / stride), the padding it needs split with the odd one at the end
    (UPPER) or the beginning (LOWER)."""
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    nd = len(spatial)
    if auto_pad not in _AUTO_PAD:
        raise ValueError(f"{fn}: auto_pad must be one of {', '.join(_AUTO_PAD)}, got {auto_pad!r}")
    if auto_pad == "NOTSET":
        pads = [0] * (2 * nd) if pads is None else [int(p) for p in pads]
        if len(pads) != 2 * nd or any(p < 0 for p in pads):
            raise ValueError(f"{fn}: pads must be {2 * nd} non-negative integers (begins, then ends), got {pads}")
        return pads[:nd], pads[nd:]
    if pads is not None and any(int(p) for p in pads):
        raise ValueError(f"{fn}: pads cannot be given with auto_pad {auto_pad}")
    if auto_pad == "VALID":
        return [0] * nd, [0] * nd
    total = [max(0, (-(-d // s) - 1) * s + e - d) for d, e, s in zip(spatial, extent, strides)]
    small = [t // 2 for t in total]
    large = [t - t // 2 for t in total]
    return (small, large) if auto_pad == "SAME_UPPER" else (large, small)


def _ints(values, nd, name, fn, default):
    if values is None:
        return [default] * nd
    values = [int(v) for v in values]
    if len(values) != nd or any(v < 1 for v in values):
        raise ValueError(f"{fn}: {name} must be {nd} positive integers, got {values}")
    return values


def _scalar(value, name, fn, dtype) -> np.generic:
    v = np.asarray(value)
    if v.dtype != dtype:
        raise TypeError(f"{fn}: {name} must be {np.dtype(dtype).name}, got {v.dtype}")
    if v.size != 1 or v.ndim > 1:
        raise ValueError(f"{fn}: {name} must be one value (per tensor), got shape {v.shape}")
    return v.reshape(-1)[0]


def _per_channel(value, name, M, fn, *, dtype) -> np.ndarray:
    """One value or one per output channel ([M]), as a 0-d or 1-d array; None for a zero point is 0."""
    if value is None:
        return np.zeros((), dtype)
    v = np.asarray(value)
    if v.dtype != dtype:
        raise TypeError(f"{fn}: {name} must be {np.dtype(dtype).name} (w's type for a zero point), got {v.dtype}")
    if v.size == 1 and v.ndim <= 1:
        return v.reshape(())
    if v.shape != (M,):
        raise ValueError(f"{fn}: {name} must be one value or one per output channel ([{M}]), got shape {v.shape}")
    return v
