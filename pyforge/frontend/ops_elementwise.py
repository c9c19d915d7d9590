"""Elementwise ops: unary and broadcasting binary math, activations, Clip, comparisons."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import broadcast_shapes, const_input, register, same_as_input


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[x.dtype])(x) if x.size else x


def _gelu(n: Node, x: np.ndarray) -> np.ndarray:
    if n.attr("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


# op -> numpy function of (node, x); the cuda/cpu scalar forms live in lower_numba/scalar.py
UNARY = {
    "Relu": lambda n, x: np.maximum(x, 0),
    "Sigmoid": lambda n, x: 1 / (1 + np.exp(-x)),
    "Tanh": lambda n, x: np.tanh(x),
    "Exp": lambda n, x: np.exp(x),
    "Log": lambda n, x: np.log(x),
    "Sqrt": lambda n, x: np.sqrt(x),
    "Neg": lambda n, x: -x,
    "Abs": lambda n, x: np.abs(x),
    "Reciprocal": lambda n, x: 1 / x,
    "Floor": lambda n, x: np.floor(x),
    "Ceil": lambda n, x: np.ceil(x),
    "Identity": lambda n, x: x,
    "Erf": lambda n, x: _erf(x),
    "Gelu": _gelu,
    "LeakyRelu": lambda n, x: np.where(x >= 0, x, x * n.attr("alpha", 0.01)),
    "HardSigmoid": lambda n, x: np.clip(x * n.attr("alpha", 0.2) + n.attr("beta", 0.5), 0, 1),
    "HardSwish": lambda n, x: x * np.clip(x / 6 + 0.5, 0, 1),
    "Clip": lambda n, x: np.clip(
        x,
        n.attr("min") if n.attr("min") is not None else -np.inf,
        n.attr("max") if n.attr("max") is not None else np.inf,
    ),
}

BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": lambda a, b: (
        np.trunc(a / b).astype(a.dtype) if np.issubdtype(a.dtype, np.integer) else a / b
    ),
    "Pow": lambda a, b: np.power(a, b).astype(a.dtype),
    "Max": np.maximum,
    "Min": np.minimum,
}


def _clip_normalize(node: Node) -> None:
    if node.opset >= 11:
        for i, key in ((1, "min"), (2, "max")):
            arr = const_input(node, i, key, required=False)
            node.attrs[key] = None if arr is None else float(arr)
        node.inputs = node.inputs[:1]


def _unary(fn):
    def evaluate(node: Node, xs):
        x = xs[0]
        return [np.asarray(fn(node, x)).astype(x.dtype, copy=False)]

    return evaluate


def _binary(fn):
    def evaluate(node: Node, xs):
        out = fn(xs[0], xs[1])
        return [np.asarray(out).astype(np.result_type(xs[0], xs[1]), copy=False)]

    return evaluate


def _infer_binary(node: Node):
    a, b = node.inputs
    return [(broadcast_shapes(node, a.shape, b.shape), a.dtype)]


def _legacy_broadcast_check(node: Node) -> None:
    if node.attrs.get("broadcast") and node.attrs.get("axis") is not None:
        from .registry import fail

        fail(node, "legacy broadcast with an axis attribute (opset < 7)")


for _name, _fn in UNARY.items():
    register(
        _name,
        _unary(_fn),
        same_as_input(),
        _clip_normalize if _name == "Clip" else None,
    )

for _name, _fn in BINARY.items():
    register(_name, _binary(_fn), _infer_binary, _legacy_broadcast_check)
