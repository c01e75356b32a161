"""onnx/_pool.py: MaxPool's values, window tap by window tap, in numpy (8-bit codes: channels last, in C++; onnx.reference's are Python loops over every output: a ResNet-18's one MaxPool was 98 % of its time in the session).

``max_pool(x, *, auto_pad, dilations, kernel_shape, pads, strides, memory_format)``: for x ``[N, C, D1, ...]``, the
maximum of each window's elements inside x (padding never counts: it is the type's lowest value,
-inf for floats), the output ``floor((D + pads - ((k - 1) * dilation + 1)) / stride) + 1`` per axis
(ceil_mode 0; auto_pad as Conv's). NaN propagates as np.maximum does (onnx.reference's loops take
the first NaN too: ``max`` over windows with ``>``, not the same where a NaN is not first; the
session keeps its MaxPool for floats with NaN). The session runs it for one output (no Indices) and
ceil_mode 0; anything else goes to onnx.reference. 8-bit codes are pooled channels-last; with
``memory_format="channels_last"`` the result stays so (a view, as qlinear_conv's), and an x whose memory
is channels-last is read without a copy.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import _core
from ._qconv import _channels_first, _channels_last, _ints, _memory_format, _padding


def max_pool(
    x, *, auto_pad="NOTSET", dilations=None, kernel_shape=None, pads=None, strides=None, memory_format="contiguous"
) -> np.ndarray:
    fn = "MaxPool"
    _memory_format(fn, memory_format)
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"{fn}: x must be [N, C, D1, ...], got shape {x.shape}")
    spatial = x.shape[2:]
    nd = len(spatial)
    if kernel_shape is None:
        raise ValueError(f"{fn}: kernel_shape is required")
    kernel = _ints(kernel_shape, nd, "kernel_shape", fn, None)
    strides = _ints(strides, nd, "strides", fn, 1)
    dilations = _ints(dilations, nd, "dilations", fn, 1)
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    begin, end = _padding(auto_pad, pads, spatial, extent, strides, fn)
    padded = [s + b + e for s, b, e in zip(spatial, begin, end)]
    out = [(p - e) // s + 1 for p, e, s in zip(padded, extent, strides)]
    if any(o < 1 for o in out):
        raise ValueError(f"{fn}: the kernel (extent {extent}) does not fit x's padded spatial shape {padded}")
    if x.dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and x.size:  # 8-bit codes: channels last, in C++
        N, C = x.shape[:2]
        y = np.empty((N, *out, C), x.dtype)
        geometry = [list(spatial), out, kernel, strides, dilations, begin]
        _core.max_pool_bytes(
            _channels_last(x).view(np.uint8), x.dtype == np.int8, [N, C, 1], geometry, y.view(np.uint8)
        )
        return _channels_first(y.reshape(-1, C), (N, C, *out), memory_format)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    if any(begin) or any(end):
        x = np.pad(x, [(0, 0), (0, 0), *zip(begin, end)], constant_values=np.asarray(lowest, x.dtype))
    y = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        window = x[
            (
                slice(None),
                slice(None),
                *(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, out, strides)),
            )
        ]
        y = window.copy() if y is None else np.maximum(y, window, out=y)
    return y
