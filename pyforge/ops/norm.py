"""Normalizations: LayerNormalization (with its Mean and InvStdDev outputs), RMSNormalization,
GroupNormalization, InstanceNormalization and LRN."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register, same_as_input


def _stats(node: Node, x: np.ndarray):
    # float64 statistics: a constant row's float32 mean is off by a rounding that 1/sqrt(eps)
    # magnifies, where ORT gives exactly 0
    axes = tuple(range(node.attrs["axis"], x.ndim))
    xf = x.astype(np.float64)
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


register(
    "LayerNormalization",
    _norm_eval,
    _norm_infer,
    split_outputs=True,
    kind="rows",
    epilogue=True,
)
register("RMSNormalization", _norm_eval, _norm_infer, kind="rows", epilogue=True, reads_half=(0,))


def _residual_eval(node: Node, xs):
    """h = r + RMSNorm(x) * w1 and y = RMSNorm(h) * w2, over the last axis (opt/norms.py)."""
    x, w1, r, w2 = xs

    def rms(v: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        vf = v.astype(np.float64)  # as _stats
        return vf / np.sqrt(np.mean(vf * vf, axis=-1, keepdims=True) + eps) * w

    h = (r + rms(x, w1, node.attrs["epsilon"]).astype(r.dtype)).astype(r.dtype)
    return [h, rms(h, w2, node.attrs["epsilon2"]).astype(node.attrs["to"])]


def _residual_infer(node: Node):
    r = node.inputs[2]
    return [(r.shape, r.dtype), (r.shape, np.dtype(node.attrs["to"]))]


# a residual junction: RMSNorm, + the residual stream, RMSNorm again: one kernel of two outputs
register("ResidualRMSNorm", _residual_eval, _residual_infer, kind="rows", internal=True)


def _mvn_eval(node: Node, xs):
    x, axes = xs[0], tuple(node.attrs["axes"])
    xf = x.astype(np.float64)  # as _stats
    mean = xf.mean(axis=axes, keepdims=True)
    std = np.sqrt(((xf - mean) ** 2).mean(axis=axes, keepdims=True))
    # ONNX's function body adds 1e-9 to the standard deviation, not to the variance
    return [((xf - mean) / (std + 1e-9)).astype(x.dtype)]


register("MeanVarianceNormalization", _mvn_eval, same_as_input(), kind="rows", epilogue=True)


# -- channel normalizations: GroupNormalization, InstanceNormalization (groups = channels), LRN --


def _group_eval(node: Node, xs):
    x, scale, bias = xs
    n, c, g = x.shape[0], x.shape[1], node.attrs["groups"]
    xg = x.astype(np.float64).reshape(n, g, -1)  # as _stats
    mean = xg.mean(axis=2, keepdims=True)
    var = ((xg - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + node.attrs["epsilon"])).reshape(x.shape)
    if node.attrs["per_group"]:
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return [(y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


register("GroupNormalization", _group_eval, same_as_input(), kind="rows", epilogue=True)
register(
    "InstanceNormalization",
    _group_eval,
    same_as_input(),
    kind="rows",
    epilogue=True,
)


def _lrn_eval(node: Node, xs):
    x = xs[0]
    a = node.attrs
    c, size = x.shape[1], a["size"]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x.astype(np.float32) ** 2
    total = np.zeros_like(sq)
    for ch in range(c):
        total[:, ch] = sq[:, max(0, ch - lo) : min(c, ch + hi + 1)].sum(axis=1)
    y = x / (a["bias"] + a["alpha"] / size * total) ** a["beta"]
    return [y.astype(x.dtype)]


register("LRN", _lrn_eval, same_as_input(), kind="window", epilogue=True)
