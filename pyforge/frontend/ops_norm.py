"""Row normalizations: LayerNormalization (with its Mean and InvStdDev outputs), RMSNormalization."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import norm_axis, register


def _norm_normalize(node: Node) -> None:
    x = node.inputs[0]
    node.attrs = {
        "axis": norm_axis(node, int(node.attr("axis", -1)), len(x.shape)),
        "epsilon": float(node.attr("epsilon", 1e-5)),
    }


def _stats(node: Node, x: np.ndarray):
    axes = tuple(range(node.attrs["axis"], x.ndim))
    xf = x.astype(np.float32)
    if node.op == "RMSNormalization":
        return None, 1 / np.sqrt(np.mean(xf * xf, axis=axes, keepdims=True) + node.attrs["epsilon"])
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    return mean, 1 / np.sqrt(var + node.attrs["epsilon"])


def _norm_eval(node: Node, xs):
    x, scale = xs[0], xs[1]
    mean, inv = _stats(node, x)
    y = (x if mean is None else x - mean) * inv * scale
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    outs = [y.astype(x.dtype)]
    if node.op == "LayerNormalization":
        outs += [mean.astype(np.float32), inv.astype(np.float32)]
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


def _norm_infer(node: Node):
    x = node.inputs[0]
    a = node.attrs["axis"]
    stat = (tuple(x.shape[:a]) + (1,) * (len(x.shape) - a), np.dtype(np.float32))
    outs = [(x.shape, x.dtype)] + ([stat, stat] if node.op == "LayerNormalization" else [])
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


register("LayerNormalization", _norm_eval, _norm_infer, _norm_normalize, split_outputs=True)
register("RMSNormalization", _norm_eval, _norm_infer, _norm_normalize)
