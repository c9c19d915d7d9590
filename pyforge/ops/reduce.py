"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax, ArgMin.

Canonical attrs: ``axes`` (sorted, non-negative; every axis when the input gives none) and
``keepdims``. Axes come from the attribute or, from the opset that made them an input, from a
constant input.
"""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register

# op -> (numpy reduction of (x, axes) with keepdims, opset from which axes is an input)
REDUCE = {
    "ReduceSum": (lambda x, a: _sum(x, a), 13),
    "ReduceMean": (lambda x, a: _sum(x, a) / max(int(np.prod([x.shape[i] for i in a])), 1), 18),
    "ReduceMax": (lambda x, a: _extreme(np.max, x, a, -np.inf), 18),
    "ReduceMin": (lambda x, a: _extreme(np.min, x, a, np.inf), 18),
    "ReduceProd": (lambda x, a: np.prod(x, axis=a, keepdims=True), 18),
    "ReduceL1": (lambda x, a: np.sum(np.abs(x), axis=a, keepdims=True), 18),
    "ReduceL2": (lambda x, a: np.sqrt(np.sum(np.square(x), axis=a, keepdims=True)), 18),
    "ReduceLogSum": (lambda x, a: np.log(np.sum(x, axis=a, keepdims=True)), 18),
    "ReduceLogSumExp": (lambda x, a: _logsumexp(x, a), 18),
    "ReduceSumSquare": (lambda x, a: np.sum(np.square(x), axis=a, keepdims=True), 18),
}


def _sum(x: np.ndarray, axes) -> np.ndarray:
    # -0.0 is the float identity: an all -0.0 sum stays -0.0, as ORT sums
    start = x.dtype.type(-0.0) if x.dtype.kind == "f" else 0
    return np.sum(x, axis=axes, keepdims=True, initial=start)


def _extreme(fn, x: np.ndarray, axes, empty: float) -> np.ndarray:
    if x.size == 0:
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
        if x.dtype.kind == "f":
            fill = empty
        elif x.dtype.kind == "b":
            fill = empty > 0
        else:
            fill = np.iinfo(x.dtype).min if empty < 0 else np.iinfo(x.dtype).max
        return np.full(shape, fill, x.dtype)
    return fn(x, axis=axes, keepdims=True)


def _logsumexp(x: np.ndarray, axes) -> np.ndarray:
    m = _extreme(np.max, x, axes, -np.inf)
    m = np.where(np.isfinite(m), m, 0)
    return np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m


def _out_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    axes, keep = node.attrs["axes"], node.attrs["keepdims"]
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def _reduce_eval(node: Node, xs):
    x = xs[0]
    axes = tuple(node.attrs["axes"])
    fn = REDUCE[node.op][0]
    y = fn(x, axes) if axes else fn(x[..., None], (x.ndim,))[..., 0]
    return [np.asarray(y).astype(x.dtype).reshape(_out_shape(node, x.shape))]


def _reduce_infer(node: Node):
    x = node.inputs[0]
    return [(_out_shape(node, x.shape), x.dtype)]


for _op in REDUCE:
    register(
        _op,
        _reduce_eval,
        _reduce_infer,
        const_inputs=(1,),
        kind="reduce",
        epilogue=True,
    )


def _arg_eval(node: Node, xs):
    x = xs[0]
    axis = node.attrs["axes"][0]
    fn = np.argmax if node.op == "ArgMax" else np.argmin
    if node.attrs["select_last_index"]:
        y = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        y = fn(x, axis=axis)
    return [np.asarray(y, np.int64).reshape(_out_shape(node, x.shape))]


def _arg_infer(node: Node):
    return [(_out_shape(node, node.inputs[0].shape), np.dtype(np.int64))]


register("ArgMax", _arg_eval, _arg_infer, kind="reduce", epilogue=True)
register("ArgMin", _arg_eval, _arg_infer, kind="reduce", epilogue=True)
