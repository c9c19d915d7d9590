"""ConvInteger and QLinearConv as float32 Convs whose sums are exact integers.

A window sums K = C/group * prod(kernel) integer products of magnitude <= bx * bw (the largest
|x - x_zero|, |w - w_zero|). While K * bx * bw < 2**24 every partial sum, in any order, is an
integer float32 holds exactly. Past that, w (then x) is split into 16 * high + low (|parts| <= 16),
the part convolutions summed in int32: exact for K < 65536."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..expand import Builder, expands

_EXACT = 2**24
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _centered(b: Builder, t: str, zero: str | None, rank: int) -> tuple[str, int]:
    """t - zero in float32, and the largest magnitude it can take (exact for a constant)."""
    if np.dtype(b.value(t).dtype) not in (np.dtype(np.uint8), np.dtype(np.int8)):
        b.fail(f"operand {t!r} of type {b.value(t).dtype} (uint8 or int8)")
    f = b.op("Cast", [t], to=TensorProto.FLOAT)
    if zero is not None:
        if b.value(zero).size > 1:  # per output channel (w only): along axis 0
            zero = b.op("Reshape", [zero, b.const([-1] + [1] * (rank - 1), np.int64)])
        f = b.op("Sub", [f, b.op("Cast", [zero], to=TensorProto.FLOAT)])
    const = b.value(f).const
    return f, 255 if const is None else int(np.max(np.abs(const), initial=0))


def _split(b: Builder, f: str) -> list[tuple[str, int]]:
    """f = 16 * high + low, high = floor(f / 16): parts with their int32 multipliers."""
    high = b.op("Floor", [b.op("Div", [f, b.const(16, np.float32)])])
    low = b.op("Sub", [f, b.op("Mul", [high, b.const(16, np.float32)])])
    return [(high, 16), (low, 1)]


def int_conv(b: Builder, x: str, x_zero: str | None, w: str, w_zero: str | None) -> str:
    """The int32 convolution of (x - x_zero) with (w - w_zero) under the node's Conv attributes."""
    rank = len(b.value(w).shape)  # the Conv's own rule checks x and w against each other
    k = int(np.prod(b.value(w).shape[1:]))
    (xf, bx), (wf, bw) = _centered(b, x, x_zero, rank), _centered(b, w, w_zero, rank)
    xs, ws = [(xf, 1)], [(wf, 1)]
    if k * bx * bw >= _EXACT:
        ws, bw = _split(b, wf), 16
    if k * bx * bw >= _EXACT:
        xs, bx = _split(b, xf), 16
    if k * bx * bw >= _EXACT:
        b.fail(f"windows of {k} terms (int32 sums computed exactly up to 65535 terms)")
    attrs = {a: b.attrs[a] for a in _CONV_ATTRS if b.attrs.get(a) not in (None, [], "")}
    acc = None
    for xp, sx in xs:
        for wp, sw in ws:
            part = b.op("Cast", [b.op("Conv", [xp, wp], **attrs)], to=TensorProto.INT32)
            if sx * sw > 1:
                part = b.op("Mul", [part, b.const(sx * sw, np.int32)])
            acc = part if acc is None else b.op("Add", [acc, part])
    return acc


@expands("ConvInteger")
def _conv_integer(b: Builder) -> None:
    b.op("Identity", [int_conv(b, *(b.input(k) for k in (0, 2, 1, 3)))], outputs=[b.output(0)])


@expands("QLinearConv")
def _qlinear_conv(b: Builder) -> None:
    """ORT's requantisation: the int32 sum (plus the int32 bias) times x_scale * w_scale / y_scale
    in float32, rounded half to even, plus y's zero point, saturated (a QuantizeLinear by 1)."""
    x, xs, xz, w, ws, wz, ys, yz = (b.input(k) for k in range(8))
    acc = int_conv(b, x, xz, w, wz)
    rank = len(b.value(w).shape)
    per_channel = b.const([1, -1] + [1] * (rank - 2), np.int64)
    if b.input(8) is not None:
        acc = b.op("Add", [acc, b.op("Reshape", [b.input(8), per_channel])])
    scale = b.op("Div", [b.op("Mul", [xs, ws]), ys])
    if b.value(ws).size > 1:
        scale = b.op("Reshape", [scale, per_channel])
    v = b.op("Mul", [b.op("Cast", [acc], to=TensorProto.FLOAT), scale])
    b.op("QuantizeLinear", [v, b.const(1, np.float32), yz], outputs=[b.output(0)])
