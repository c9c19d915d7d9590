"""Resize and Upsample, as separable per-axis tap tables computed at import.

Every resized axis becomes a table of source indices and weights per output position (one tap for
nearest, two for linear, four for cubic, more for antialiased downsampling), so one kernel and
one numpy reference serve every mode; the tables ride along as constant inputs of the node. The
frontend computes them from ONNX's attributes (``pyforge/frontend/normalize/resize.py``).
"""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register


def _resize_eval(node: Node, xs):
    x = xs[0]
    y = x.astype(np.float64) if x.dtype.kind == "f" else x
    outside = np.zeros((1,) * x.ndim, bool)
    for k, (a, _) in enumerate(node.attrs["resized"]):
        idx, w, mask = xs[1 + 3 * k : 4 + 3 * k]
        gathered = np.take(y, idx, axis=a)  # the taps become axis a + 1
        wshape = (1,) * a + w.shape + (1,) * (y.ndim - a - 1)
        if node.attrs["nearest"]:
            y = gathered.take(0, axis=a + 1)
        else:
            y = (gathered * w.reshape(wshape)).sum(axis=a + 1)
        outside = outside | (mask != 0).reshape((1,) * a + (-1,) + (1,) * (y.ndim - a - 1))
    if node.attrs["extrapolate"]:
        y = np.where(outside, node.attrs["extrapolation"], y)
    return [np.asarray(y).astype(x.dtype)]


def _resize_infer(node: Node):
    x = node.inputs[0]
    return [(tuple(node.attrs["out_shape"]), x.dtype)]


register(
    "Resize",
    _resize_eval,
    _resize_infer,
    min_opset=10,
    const_inputs=(1, 2, 3),
    kind="injective",
    epilogue=True,
)
register(
    "Upsample",
    _resize_eval,
    _resize_infer,
    const_inputs=(1,),
    kind="injective",
    epilogue=True,
)
