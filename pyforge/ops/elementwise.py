"""Elementwise ops: unary and broadcasting binary math, activations, Clip, comparisons."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import broadcast_shapes, register


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[x.dtype])(x) if x.size else x


def _gelu(n: Node, x: np.ndarray) -> np.ndarray:
    if n.attrs["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


# op -> numpy function of (node, x); the cuda/cpu scalar forms live in lower_numba/scalar.py
UNARY = {
    "Relu": lambda n, x: np.where(x < 0, 0, x),  # -0.0 and NaN pass, as in ORT
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
    "LeakyRelu": lambda n, x: np.where(x >= 0, x, x * n.attrs["alpha"]),
    "HardSigmoid": lambda n, x: np.clip(x * n.attrs["alpha"] + n.attrs["beta"], 0, 1),
    "HardSwish": lambda n, x: x * np.clip(x / 6 + 0.5, 0, 1),
    "Sin": lambda n, x: np.sin(x),
    "Cos": lambda n, x: np.cos(x),
    "Tan": lambda n, x: np.tan(x),
    "Asin": lambda n, x: np.arcsin(x),
    "Acos": lambda n, x: np.arccos(x),
    "Atan": lambda n, x: np.arctan(x),
    "Sinh": lambda n, x: np.sinh(x),
    "Cosh": lambda n, x: np.cosh(x),
    "Asinh": lambda n, x: np.arcsinh(x),
    "Acosh": lambda n, x: np.arccosh(x),
    "Atanh": lambda n, x: np.arctanh(x),
    "Sign": lambda n, x: np.sign(x),
    "Round": lambda n, x: np.round(x),
    "Not": lambda n, x: np.logical_not(x),
    "BitwiseNot": lambda n, x: np.invert(x),
    "IsNaN": lambda n, x: np.isnan(x),
    "IsInf": lambda n, x: (
        (np.isposinf(x) & bool(n.attrs["detect_positive"]))
        | (np.isneginf(x) & bool(n.attrs["detect_negative"]))
    ),
    "Softplus": lambda n, x: np.logaddexp(0, x),
    "Softsign": lambda n, x: x / (1 + np.abs(x)),
    "Elu": lambda n, x: np.where(x >= 0, x, n.attrs["alpha"] * np.expm1(x)),
    "Selu": lambda n, x: n.attrs["gamma"] * np.where(x > 0, x, n.attrs["alpha"] * np.expm1(x)),
    "Celu": lambda n, x: (
        np.maximum(x, 0) + np.minimum(0, n.attrs["alpha"] * np.expm1(x / n.attrs["alpha"]))
    ),
    "Mish": lambda n, x: x * np.tanh(np.logaddexp(0, x)),
    "ThresholdedRelu": lambda n, x: np.where(x > n.attrs["alpha"], x, 0),
    "Shrink": lambda n, x: np.where(
        x < -n.attrs["lambd"],
        x + n.attrs["bias"],
        np.where(x > n.attrs["lambd"], x - n.attrs["bias"], 0),
    ),
    "Swish": lambda n, x: x / (1 + np.exp(-n.attrs["alpha"] * x)),
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
    "Sum": np.add,
    "Mean": np.add,  # divided by the input count after the sum
    "Mod": np.mod,  # fmod=1 is np.fmod, chosen at evaluation
    "PRelu": lambda x, s: np.where(x < 0, x * s, x),
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
    "BitShift": np.left_shift,  # direction="RIGHT" is np.right_shift, chosen at evaluation
    "Where": np.where,
}

# exact in float16, or computed in float32 from float16 inputs and rounded once
HALF_FOLLOW = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Neg", "Abs", "HardSigmoid"}
HALF_FOLLOW |= {"HardSwish", "Add", "Sub", "Mul", "Max", "Min", "Identity"}

BOOL_OUT = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"}
BOOL_OUT |= {"Not", "IsNaN", "IsInf"}
VARIADIC = {"Max", "Min", "Sum", "Mean"}
# ops whose integer forms are not the same expression as the float ones (refused for ints)
FLOAT_ONLY = set(UNARY) - {"Relu", "Neg", "Abs", "Identity", "Sign", "Not", "BitwiseNot", "Clip"}
FLOAT_ONLY -= {"Floor", "Ceil", "Round", "IsNaN", "IsInf"}


def _unary(op: str, fn):
    def evaluate(node: Node, xs):
        x = xs[0]
        return [np.asarray(fn(node, x)).astype(_out_dtype(op, [x.dtype]), copy=False)]

    return evaluate


def _out_dtype(op: str, dtypes: list[np.dtype]) -> np.dtype:
    if op in BOOL_OUT:
        return np.dtype(np.bool_)
    return np.dtype(dtypes[1] if op == "Where" else dtypes[0])


def _binary(op: str, fn):
    def evaluate(node: Node, xs):
        xs = [x for x in xs if x is not None]
        if op == "Mod" and node.attrs["fmod"]:
            out = np.fmod(xs[0], xs[1])
        elif op == "BitShift" and node.attr("direction") == "RIGHT":
            out = np.right_shift(xs[0], xs[1])
        elif op in VARIADIC:
            out = xs[0]
            for x in xs[1:]:
                out = fn(out, x)
            if op == "Mean":
                out = out / len(xs)
        else:
            out = fn(*xs)
        return [np.asarray(out).astype(_out_dtype(op, [x.dtype for x in xs]), copy=False)]

    return evaluate


def _infer_binary(node: Node):
    xs = [v for v in node.inputs if v is not None]
    shape = broadcast_shapes(node, *(v.shape for v in xs))
    return [(shape, _out_dtype(node.op, [v.dtype for v in xs]))]


def _infer_unary(node: Node):
    x = node.inputs[0]
    return [(x.shape, _out_dtype(node.op, [x.dtype]))]


for _name, _fn in UNARY.items():
    register(
        _name,
        _unary(_name, _fn),
        _infer_unary,
        const_inputs=(1, 2) if _name == "Clip" else (),
        kind="view" if _name == "Identity" else "elementwise",
        half="follow" if _name in HALF_FOLLOW else None,
    )

for _name, _fn in BINARY.items():
    register(
        _name,
        _binary(_name, _fn),
        _infer_binary,
        kind="elementwise",
        half="follow" if _name in HALF_FOLLOW else None,
    )
