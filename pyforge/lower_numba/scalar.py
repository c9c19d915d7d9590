"""Scalar expression templates of elementwise ops, shared by the cpu and cuda kernels.

Each entry maps (node, argument expressions, type constructor name) to one Python expression
that Numba compiles on both targets. Constants are wrapped in the output type so float32
kernels never widen to float64.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir import Node

Scalar = Callable[[Node, list[str], str], str]

TYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.float16): "f16",
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.bool_): "b1",
}


def lit(value: float, t: str) -> str:
    """A typed literal: repr keeps every bit of a float32 value through float64."""
    if t == "b1":
        return "True" if value else "False"
    if t.startswith(("i", "u")):
        return f"{t}({int(value)})"
    value = float(value)
    if not np.isfinite(value):
        return f"{t}({'np.nan' if np.isnan(value) else ('np.inf' if value > 0 else '-np.inf')})"
    return f"{t}({value!r})"


def _int_div(a: str, b: str, t: str) -> str:
    # ONNX integer Div truncates toward zero; Python's // floors
    return f"{t}(abs({a}) // abs({b}) * (1 if ({a} >= 0) == ({b} >= 0) else -1))"


def _div(n: Node, a: list[str], t: str) -> str:
    if t.startswith(("i", "u")):
        return _int_div(a[0], a[1], t)
    return f"({a[0]} / {a[1]})"


def _gelu(n: Node, a: list[str], t: str) -> str:
    x = a[0]
    if n.attr("approximate", "none") == "tanh":
        c = lit(np.sqrt(2 / np.pi), t)
        return f"{lit(0.5, t)} * {x} * ({lit(1, t)} + math.tanh({c} * ({x} + {lit(0.044715, t)} * {x} * {x} * {x})))"
    return f"{lit(0.5, t)} * {x} * ({lit(1, t)} + math.erf({x} * {lit(0.7071067811865476, t)}))"


def _clip(n: Node, a: list[str], t: str) -> str:
    x = a[0]
    if n.attr("min") is not None:
        x = f"max({x}, {lit(n.attr('min'), t)})"
    if n.attr("max") is not None:
        x = f"min({x}, {lit(n.attr('max'), t)})"
    return x


SCALAR: dict[str, Scalar] = {
    "Relu": lambda n, a, t: f"max({a[0]}, {lit(0, t)})",
    "Sigmoid": lambda n, a, t: f"({lit(1, t)} / ({lit(1, t)} + math.exp(-{a[0]})))",
    "Tanh": lambda n, a, t: f"math.tanh({a[0]})",
    "Exp": lambda n, a, t: f"math.exp({a[0]})",
    "Log": lambda n, a, t: f"math.log({a[0]})",
    "Sqrt": lambda n, a, t: f"math.sqrt({a[0]})",
    "Neg": lambda n, a, t: f"(-{a[0]})",
    "Abs": lambda n, a, t: f"abs({a[0]})",
    "Reciprocal": lambda n, a, t: f"({lit(1, t)} / {a[0]})",
    "Floor": lambda n, a, t: f"{t}(math.floor({a[0]}))",
    "Ceil": lambda n, a, t: f"{t}(math.ceil({a[0]}))",
    "Erf": lambda n, a, t: f"math.erf({a[0]})",
    "Gelu": _gelu,
    "LeakyRelu": lambda n, a, t: (
        f"({a[0]} if {a[0]} >= {lit(0, t)} else {a[0]} * {lit(n.attr('alpha', 0.01), t)})"
    ),
    "HardSigmoid": lambda n, a, t: (
        f"max({lit(0, t)}, min({lit(1, t)}, {a[0]} * {lit(n.attr('alpha', 0.2), t)}"
        f" + {lit(n.attr('beta', 0.5), t)}))"
    ),
    "HardSwish": lambda n, a, t: (
        f"({a[0]} * max({lit(0, t)}, min({lit(1, t)}, {a[0]} / {lit(6, t)} + {lit(0.5, t)})))"
    ),
    "Clip": _clip,
    "Add": lambda n, a, t: f"({a[0]} + {a[1]})",
    "Sub": lambda n, a, t: f"({a[0]} - {a[1]})",
    "Mul": lambda n, a, t: f"({a[0]} * {a[1]})",
    "Div": _div,
    "Pow": lambda n, a, t: f"{t}({a[0]} ** {a[1]})",
    "Max": lambda n, a, t: f"max({a[0]}, {a[1]})",
    "Min": lambda n, a, t: f"min({a[0]}, {a[1]})",
    "Cast": lambda n, a, t: f"({a[0]} != 0)" if t == "b1" else f"{t}({a[0]})",
}
