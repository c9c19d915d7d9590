"""A 3-d Conv as a sum of 2-d ones: one per tap of the kernel's depth, over the depth slices
that tap reads folded into the batch (pyforge's conv kernels are 1-d and 2-d)."""

from __future__ import annotations

import numpy as np

from ..expand import Builder, expands


@expands("Conv")
def _conv3d(b: Builder) -> None:
    x, w = b.value(b.input(0)), b.value(b.input(1))
    if len(x.shape) != 5 or w.const is None or b.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        b.fail("a 3-d convolution needs constant weights and explicit pads")
    n, c, depth, h, wd = x.shape
    m, _, kd, kh, kw = w.shape
    pads = list(b.attrs.get("pads") or [0] * 6)
    sd, sh, sw = b.attrs.get("strides") or [1, 1, 1]
    dd, dh, dw = b.attrs.get("dilations") or [1, 1, 1]
    padded = depth + pads[0] + pads[3]
    out_d = (padded - dd * (kd - 1) - 1) // sd + 1
    if out_d < 1:
        b.bad(f"kernel depth {kd} (dilation {dd}) exceeds the padded depth {padded}")
    xp = b.input(0)
    if pads[0] or pads[3]:
        xp = b.op("Pad", [xp, b.const([0, 0, pads[0], 0, 0, 0, 0, pads[3], 0, 0], np.int64)])
    xt = b.op("Transpose", [xp], perm=[0, 2, 1, 3, 4])  # N, D, C, H, W
    axis, flat = b.const([1], np.int64), b.const([-1, c, h, wd], np.int64)
    acc = None
    for t in range(kd):
        lo, hi = t * dd, t * dd + (out_d - 1) * sd + 1
        part = b.op("Slice", [xt, b.const([lo], np.int64), b.const([hi], np.int64), axis,
                              b.const([sd], np.int64)])  # fmt: skip
        wt = b.const(np.ascontiguousarray(w.const[:, :, t]))
        bias = b.input(2) if t == 0 else None
        y = b.op("Conv", [b.op("Reshape", [part, flat]), wt, bias], group=b.attrs.get("group", 1),
                 pads=[pads[1], pads[2], pads[4], pads[5]], strides=[sh, sw],
                 dilations=[dh, dw], kernel_shape=[kh, kw])  # fmt: skip
        acc = y if acc is None else b.op("Add", [acc, y])
    _, _, oh, ow = b.value(acc).shape
    y5 = b.op("Reshape", [acc, b.const([n, out_d, m, oh, ow], np.int64)])
    b.op("Transpose", [y5], outputs=[b.output(0)], perm=[0, 2, 1, 3, 4])
