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
    np.dtype(np.float16): "f32",  # storage only: float16 values compute in float32
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16",
    np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64",
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
    # ONNX integer Div truncates toward zero; Python's // floors, one too low when the signs
    # differ and b does not divide a (no abs(): abs(-2**63) overflows)
    up = f"(1 if {a} % {b} != 0 and ({a} < 0) != ({b} < 0) else 0)"
    return f"{t}({a} // {b} + {up})"


def _div(n: Node, a: list[str], t: str) -> str:
    if t.startswith(("i", "u")):
        return _int_div(a[0], a[1], t)
    return _fdiv(a[0], a[1])


def _fdiv(a: str, b: str) -> str:
    # the ufunc divides as IEEE does (x/0 is +-inf or NaN); cpu's ``/`` raises ZeroDivisionError
    return f"np.true_divide({a}, {b})"


def nan_max(a: str, b: str, op: str = "max") -> str:
    # Python's max(a, b) drops a NaN b; ORT keeps either NaN and, of -0.0 and 0.0, gives b
    return f"({a} if {a} {'>' if op == 'max' else '<'} {b} or {a} != {a} else {b})"


def _integral(fn: str):
    """Floor, Ceil, Round of floats: math's forms give an int64 (wrong past 2**63, -2**63 for
    inf and NaN), so values already integral pass through and zeros keep their sign."""

    def expr(n: Node, a: list[str], t: str) -> str:
        x = a[0]
        if t.startswith(("i", "u", "b")):
            return x
        return f"({x} if not abs({x}) < {lit(2.0**52, t)} else math.copysign({t}({fn(x)}), {x}))"

    return expr


def _gelu(n: Node, a: list[str], t: str) -> str:
    x = a[0]
    if n.attrs["approximate"] == "tanh":
        c = lit(np.sqrt(2 / np.pi), t)
        inner = f"{c} * ({x} + {lit(0.044715, t)} * {x} * {x} * {x})"
        return f"{lit(0.5, t)} * {x} * ({lit(1, t)} + {tanh(inner, t)})"
    return f"{lit(0.5, t)} * {x} * ({lit(1, t)} + {erf(f'{x} * {lit(0.7071067811865476, t)}', t)})"


def _clip(n: Node, a: list[str], t: str) -> str:
    x = a[0]
    if n.attr("min") is not None:
        x = f"max({x}, {lit(n.attr('min'), t)})"
    if n.attr("max") is not None:
        x = f"min({x}, {lit(n.attr('max'), t)})"
    return x


def _cast(n: Node, x: str, t: str) -> str:
    if t == "b1":
        return f"({x} != 0)"
    if np.dtype(n.attrs["to"]) == np.float16:  # computed in float32, but rounded as asked
        return f"f32(f16({x}))"
    return f"{t}({x})"


def exp(x: str, t: str, flush: bool = False) -> str:
    """e**x: float32 through ``fexp`` (emit.FEXP_CPU, a polynomial that vectorises; on cuda
    math.exp), or ``fexpz`` (0 for a subnormal result) where ``flush``; float64 through
    math.exp."""
    return f"fexp{'z' if flush else ''}({x})" if t == "f32" else f"math.exp({x})"


def erf(x: str, t: str) -> str:
    """float32 through ``ferf`` (emit.FERF_CPU, vectorises; on cuda math.erf), else math.erf."""
    return f"ferf({x})" if t == "f32" else f"math.erf({x})"


def tanh(x: str, t: str) -> str:
    """float32 through ``ftanh`` (emit.FTANH_CPU, vectorises; on cuda math.tanh), else math.tanh."""
    return f"ftanh({x})" if t == "f32" else f"math.tanh({x})"


def _sigmoid(x: str, t: str) -> str:
    # np.true_divide: ``/`` tests for a zero divisor, and the branch keeps the loop scalar
    return f"np.true_divide({lit(1, t)}, {lit(1, t)} + {exp(f'-{x}', t)})"


SCALAR: dict[str, Scalar] = {
    "Relu": lambda n, a, t: f"max({a[0]}, {lit(0, t)})",
    "Sigmoid": lambda n, a, t: _sigmoid(a[0], t),
    "Tanh": lambda n, a, t: tanh(a[0], t),
    "Exp": lambda n, a, t: exp(a[0], t),
    "Log": lambda n, a, t: f"math.log({a[0]})",
    "Sqrt": lambda n, a, t: f"math.sqrt({a[0]})",
    "Neg": lambda n, a, t: f"(-{a[0]})",
    "Abs": lambda n, a, t: f"abs({a[0]})",
    "Reciprocal": lambda n, a, t: _fdiv(lit(1, t), a[0]),
    "Floor": _integral(lambda x: f"math.floor({x})"),
    "Ceil": _integral(lambda x: f"math.ceil({x})"),
    "Erf": lambda n, a, t: erf(a[0], t),
    "Gelu": _gelu,
    "LeakyRelu": lambda n, a, t: (
        f"({a[0]} if {a[0]} >= {lit(0, t)} else {a[0]} * {lit(n.attrs['alpha'], t)})"
    ),
    "HardSigmoid": lambda n, a, t: (
        f"min(max({a[0]} * {lit(n.attrs['alpha'], t)} + {lit(n.attrs['beta'], t)},"
        f" {lit(0, t)}), {lit(1, t)})"
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
    "Cast": lambda n, a, t: _cast(n, a[0], t),
}


def _fold(op: str):
    def expr(n: Node, a: list[str], t: str) -> str:
        out = a[0]
        for b in a[1:]:
            out = nan_max(out, b, op) if op in ("max", "min") else f"({out} {op} {b})"
        return out

    return expr


def _mean(n: Node, a: list[str], t: str) -> str:
    return _fdiv(_fold("+")(n, a, t), lit(len(a), t))


def _mod(n: Node, a: list[str], t: str) -> str:
    if not n.attrs["fmod"]:  # Python's floored modulo, as ONNX's fmod=0
        if t.startswith("f"):  # cpu's % raises ZeroDivisionError where IEEE gives NaN
            return f"({a[0]} % {a[1]} if {a[1]} != 0 else {lit(np.nan, t)})"
        return f"({a[0]} % {a[1]})"
    if t.startswith(("i", "u")):
        return f"{t}({a[0]} - {a[1]} * {_int_div(a[0], a[1], t)})"
    # fmod(a, b) is sign(a) * (|a| mod |b|), and math.fmod is not typed by Numba's cpu target;
    # the guard stands in for the ZeroDivisionError cpu's % would raise
    x, y = a
    return f"({t}(math.copysign(abs({x}) % abs({y}), {x})) if {y} != 0 else {lit(np.nan, t)})"


def _round_half_even(x: str) -> str:
    f = f"math.floor({x})"
    up = f"({x} - {f} > 0.5 or ({x} - {f} == 0.5 and {f} % 2 != 0))"
    return f"{f} + (1.0 if {up} else 0.0)"


def _isinf(n: Node, a: list[str], t: str) -> str:
    pos, neg = n.attrs["detect_positive"], n.attrs["detect_negative"]
    return (
        f"(math.isinf({a[0]}) and (({a[0]} > 0 and {bool(pos)}) or ({a[0]} < 0 and {bool(neg)})))"
    )


def _elu_like(scale: float, alpha: float):
    def expr(n: Node, a: list[str], t: str) -> str:
        x = a[0]
        neg = f"{lit(alpha, t)} * math.expm1({x})"
        return f"{lit(scale, t)} * ({x} if {x} > {lit(0, t)} else {neg})"

    return expr


def _shrink(n: Node, a: list[str], t: str) -> str:
    x, lam, bias = a[0], lit(n.attrs["lambd"], t), lit(n.attrs["bias"], t)
    return f"({x} + {bias} if {x} < -{lam} else ({x} - {bias} if {x} > {lam} else {lit(0, t)}))"


def _softplus(x: str, t: str) -> str:
    return f"(max({x}, {lit(0, t)}) + math.log1p(math.exp(-abs({x}))))"


SCALAR.update(
    {
        "Sin": lambda n, a, t: f"math.sin({a[0]})",
        "Cos": lambda n, a, t: f"math.cos({a[0]})",
        "Tan": lambda n, a, t: f"math.tan({a[0]})",
        "Asin": lambda n, a, t: f"math.asin({a[0]})",
        "Acos": lambda n, a, t: f"math.acos({a[0]})",
        "Atan": lambda n, a, t: f"math.atan({a[0]})",
        "Sinh": lambda n, a, t: f"math.sinh({a[0]})",
        "Cosh": lambda n, a, t: f"math.cosh({a[0]})",
        "Asinh": lambda n, a, t: f"math.asinh({a[0]})",
        "Acosh": lambda n, a, t: f"math.acosh({a[0]})",
        "Atanh": lambda n, a, t: f"math.atanh({a[0]})",
        "Sign": lambda n, a, t: (  # NaN is its own sign, as in ORT
            f"({lit(1, t)} if {a[0]} > 0 else ({lit(-1, t)} if {a[0]} < 0 else"
            f" ({a[0]} if {a[0]} != {a[0]} else {lit(0, t)})))"
        ),
        "Round": _integral(_round_half_even),
        "Not": lambda n, a, t: f"(not {a[0]})",
        "BitwiseNot": lambda n, a, t: f"{t}(~{a[0]})",
        "IsNaN": lambda n, a, t: f"math.isnan({a[0]})",
        "IsInf": _isinf,
        "Softplus": lambda n, a, t: _softplus(a[0], t),
        "Softsign": lambda n, a, t: f"({a[0]} / ({lit(1, t)} + abs({a[0]})))",
        "Elu": lambda n, a, t: _elu_like(1.0, n.attrs["alpha"])(n, a, t),
        "Selu": lambda n, a, t: _elu_like(n.attrs["gamma"], n.attrs["alpha"])(n, a, t),
        "Celu": lambda n, a, t: (
            f"(max({a[0]}, {lit(0, t)}) + min({lit(0, t)}, {lit(n.attrs['alpha'], t)}"
            f" * math.expm1({a[0]} / {lit(n.attrs['alpha'], t)})))"
        ),
        "Mish": lambda n, a, t: f"({a[0]} * math.tanh({_softplus(a[0], t)}))",
        "ThresholdedRelu": lambda n, a, t: (
            f"({a[0]} if {a[0]} > {lit(n.attrs['alpha'], t)} else {lit(0, t)})"
        ),
        "Shrink": _shrink,
        "Swish": lambda n, a, t: (
            f"({a[0]} * {_sigmoid(lit(n.attrs['alpha'], t) + ' * ' + a[0], t)})"
        ),
        "Max": _fold("max"),
        "Min": _fold("min"),
        "Sum": _fold("+"),
        "Mean": _mean,
        "Mod": _mod,
        "PRelu": lambda n, a, t: f"({a[0]} if {a[0]} >= {lit(0, t)} else {a[0]} * {a[1]})",
        "Equal": lambda n, a, t: f"({a[0]} == {a[1]})",
        "Less": lambda n, a, t: f"({a[0]} < {a[1]})",
        "LessOrEqual": lambda n, a, t: f"({a[0]} <= {a[1]})",
        "Greater": lambda n, a, t: f"({a[0]} > {a[1]})",
        "GreaterOrEqual": lambda n, a, t: f"({a[0]} >= {a[1]})",
        "And": lambda n, a, t: f"({a[0]} and {a[1]})",
        "Or": lambda n, a, t: f"({a[0]} or {a[1]})",
        "Xor": lambda n, a, t: f"({a[0]} != {a[1]})",
        "BitwiseAnd": lambda n, a, t: f"{t}({a[0]} & {a[1]})",
        "BitwiseOr": lambda n, a, t: f"{t}({a[0]} | {a[1]})",
        "BitwiseXor": lambda n, a, t: f"{t}({a[0]} ^ {a[1]})",
        "BitShift": lambda n, a, t: (
            f"{t}({a[0]} {'>>' if n.attr('direction') == 'RIGHT' else '<<'} {a[1]})"
        ),
        "Where": lambda n, a, t: f"({a[1]} if {a[0]} else {a[2]})",
    }
)
