"""Seeded random ONNX graphs over the ops pyforge claims, with random inputs to feed them.

``generate(seed)`` gives a ``Case``: a model that passes ``onnx.checker.check_model(full_check=
True)`` and feeds for its inputs. Output shapes come from ONNX shape inference after every node,
so a node whose random attributes ONNX rejects is dropped and another op is drawn. Each value
carries a rough magnitude bound and lower bound, so domain-limited ops (Log, Sqrt, Div, Acos...)
get inputs where they are defined, and discontinuous ops (Floor, Sign, comparisons, ArgMax) read
only values that every backend computes exactly, so a 1-ulp difference cannot flip them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = (17, 18, 21, 23, 24)
DIMS = (1, 2, 3, 4, 5)
F, I, B = "f", "i", "b"
NP = {F: np.float32, I: np.int64, B: np.bool_}
ONNX_T = {F: TensorProto.FLOAT, I: TensorProto.INT64, B: TensorProto.BOOL}
FROM_ONNX = {v: k for k, v in ONNX_T.items()}


class Reject(Exception):
    """This op cannot be built on the current pool: draw another."""


@dataclass
class Val:
    name: str
    shape: tuple[int, ...]
    dtype: str
    mag: float = 2.0  # a bound on |value| (rough)
    lo: float = -2.0  # a lower bound on value (rough)
    exact: bool = True  # every backend computes it bit-exactly (no rounding so far)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Case:
    seed: int
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)


class Builder:
    def __init__(self, rng: np.random.Generator, opset: int, nan: bool = False):
        self.rng, self.opset, self.nan = rng, opset, nan
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.pool: list[Val] = []
        self.used: set[str] = set()
        self.count = 0
        self.shapes = [self.rand_shape() for _ in range(2)]  # few shapes: kernels get reused

    # -- names, shapes, constants ------------------------------------------------------------

    def fresh_name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def rand_shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 5)) if rank is None else rank
        return tuple(int(self.rng.choice(DIMS)) for _ in range(rank))

    def const(self, arr, dtype=np.int64) -> str:
        name = self.fresh_name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
        return name

    def data(self, shape, dtype: str, lo: float = -2.0, hi: float = 2.0, nonzero: bool = False):
        rng = self.rng
        if dtype == F:
            arr = rng.uniform(lo, hi, size=shape).astype(np.float32)
            if nonzero:
                arr[np.abs(arr) < 0.1] = 0.5
        elif dtype == I:
            arr = rng.integers(int(lo), int(hi) + 1, size=shape).astype(np.int64)
            if nonzero:
                arr[arr == 0] = 1
        else:
            arr = np.asarray(rng.random(size=shape) < 0.5)
        if arr.size and not arr.any() and dtype != B:
            arr.flat[0] = hi if hi != 0 else lo
        return arr

    def leaf(self, shape, dtype: str, lo=-2.0, hi=2.0, nonzero=False, as_input=None) -> Val:
        """A new graph input (fed at run time) or an initializer, of random values."""
        arr = self.data(shape, dtype, lo, hi, nonzero)
        as_input = self.rng.random() < 0.7 if as_input is None else as_input
        if dtype == F and self.nan and as_input and arr.size > 1 and self.rng.random() < 0.5:
            flat = arr.reshape(-1)
            flat[int(self.rng.integers(flat.size))] = self.rng.choice([np.nan, np.inf, -np.inf])
        if as_input:
            name = self.fresh_name("in")
            self.inputs.append(helper.make_tensor_value_info(name, ONNX_T[dtype], list(shape)))
            self.feeds[name] = arr
        else:
            name = self.fresh_name("w")
            self.inits.append(numpy_helper.from_array(arr, name))
        if dtype == F or dtype == I:
            mag, low = max(abs(lo), abs(hi)), lo
        else:
            mag, low = 1.0, 0.0
        if nonzero and lo >= 0:
            low = max(low, 0.1 if dtype == F else 1)
        return Val(name, tuple(shape), dtype, mag, low, True)

    # -- nodes -------------------------------------------------------------------------------

    def model(self, outputs: list[Val]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "fuzz",
            self.inputs,
            [
                helper.make_tensor_value_info(v.name, ONNX_T[v.dtype], list(v.shape))
                for v in outputs
            ],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 10
        return model

    def node(self, op: str, ins: list[str], n_out: int = 1, **attrs) -> list[Val]:
        """Append one node; its outputs' shapes and types come from ONNX shape inference."""
        outs = [self.fresh_name("v") for _ in range(n_out)]
        node = helper.make_node(op, ins, outs, name=self.fresh_name(op + "_"), **attrs)
        self.nodes.append(node)
        try:
            inferred = onnx.shape_inference.infer_shapes(
                self.model([]), check_type=True, strict_mode=True, data_prop=True
            )
        except Exception as e:  # noqa: BLE001  (any rejection by ONNX: drop the node)
            self.nodes.pop()
            raise Reject(f"{op}: {e}") from None
        types = {vi.name: vi.type.tensor_type for vi in inferred.graph.value_info}
        vals = []
        for name in outs:
            t = types.get(name)
            if t is None or t.elem_type not in FROM_ONNX or not t.HasField("shape"):
                self.nodes.pop()
                raise Reject(f"{op}: no static type for {name}")
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            if any(d < 0 for d in dims) or int(np.prod(dims, dtype=np.int64)) > 4096:
                self.nodes.pop()
                raise Reject(f"{op}: shape {dims}")
            vals.append(Val(name, dims, FROM_ONNX[t.elem_type]))
        self.used.update(ins)
        return vals

    def add(self, v: Val, mag: float, lo: float, exact: bool) -> Val:
        v.mag, v.lo, v.exact = float(min(mag, 1e30)), float(max(lo, -1e30)), exact
        if v.dtype == B:
            v.mag, v.lo = 1.0, 0.0
        if 0 not in v.shape:
            self.pool.append(v)
        return v

    # -- choosing operands -------------------------------------------------------------------

    def pick(
        self, dtype: str = F, exact: bool = False, rank=None, min_size: int = 1, scalar=False
    ) -> Val:
        """An operand from the pool (recent ones favoured), or a new leaf; rank 0 if ``scalar``."""
        cands = [
            v
            for v in self.pool
            if v.dtype == dtype
            and (v.exact or not exact)
            and (v.rank > 0 or scalar)
            and (rank is None or v.rank in (rank if isinstance(rank, tuple) else (rank,)))
            and v.size >= min_size
        ]
        if cands and self.rng.random() < 0.8:
            weights = np.arange(1, len(cands) + 1, dtype=np.float64) ** 2
            return cands[int(self.rng.choice(len(cands), p=weights / weights.sum()))]
        if rank is None:
            shape = self.shapes[int(self.rng.integers(len(self.shapes)))]
        else:
            r = rank if isinstance(rank, int) else int(self.rng.choice(rank))
            same = [s for s in self.shapes if len(s) == r]
            shape = same[0] if same and self.rng.random() < 0.7 else self.rand_shape(r)
        if dtype == I:
            return self.leaf(shape, I, -5, 5)
        return self.leaf(shape, dtype)

    def bcast_partner(self, v: Val, dtype: str | None = None, **kw) -> Val:
        """A new leaf whose shape broadcasts with ``v``'s (dims dropped, set to 1, or equal)."""
        shape = list(v.shape)
        r = self.rng.random()
        if r < 0.3:
            shape = shape[int(self.rng.integers(0, len(shape) + 1)) :]
        elif r < 0.7:
            shape = [1 if self.rng.random() < 0.4 else d for d in shape]
        elif r < 0.8 and len(shape) < 4:
            shape = [1] + shape
        dtype = dtype or v.dtype
        if dtype == I:
            kw.setdefault("lo", -5)
            kw.setdefault("hi", 5)
        return self.leaf(tuple(shape), dtype, **kw)

    def operand2(self, dtype: str = F, exact: bool = False) -> tuple[Val, Val]:
        a = self.pick(dtype, exact, scalar=True)
        same = [
            v
            for v in self.pool
            if v.dtype == dtype
            and v is not a
            and (v.exact or not exact)
            and _broadcasts(a.shape, v.shape)
        ]
        if same and self.rng.random() < 0.5:
            b = same[int(self.rng.integers(len(same)))]
        else:
            b = self.bcast_partner(a, dtype)
        return (a, b) if self.rng.random() < 0.5 else (b, a)

    # -- keeping values in range -------------------------------------------------------------

    def squash(self, v: Val, limit: float) -> Val:
        if v.mag <= limit and not self.nan_risk(v):
            return v
        (out,) = self.node("Tanh", [v.name])
        if limit < 1:
            (out,) = self.node("Mul", [out.name, self.const(limit, np.float32)])
        return self.add(out, min(limit, 1.0), -min(limit, 1.0), False)

    def nan_risk(self, v: Val) -> bool:
        return False

    def positive(self, v: Val, margin: float = 0.1) -> Val:
        if v.lo >= margin:
            return v
        (a,) = self.node("Abs", [v.name])
        self.add(a, v.mag, 0.0, v.exact)
        (out,) = self.node("Add", [a.name, self.const(0.5, np.float32)])
        return self.add(out, v.mag + 0.5, 0.5, False)


def _broadcasts(a, b) -> bool:
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and x != 1 and y != 1:
            return False
    return True


# -- the op builders: each emits one op (maybe with helper nodes) or raises Reject ------------

BUILDERS: dict[str, Callable[[Builder], None]] = {}
WEIGHT: dict[str, float] = {}


def builder(*ops: str, weight: float = 1.0):
    def wrap(fn):
        for op in ops:
            BUILDERS[op] = lambda g, op=op: fn(g, op)
            WEIGHT[op] = weight
        return fn

    return wrap


# unary float ops: (max safe input magnitude, output mag fn, output lo fn)
SMOOTH = {
    "Abs": (None, lambda m: m, lambda m, lo: 0.0),
    "Neg": (None, lambda m: m, lambda m, lo: -m),
    "Relu": (None, lambda m: m, lambda m, lo: 0.0),
    "Sigmoid": (None, lambda m: 1.0, lambda m, lo: 0.0),
    "Tanh": (None, lambda m: 1.0, lambda m, lo: -1.0),
    "Sin": (None, lambda m: 1.0, lambda m, lo: -1.0),
    "Cos": (None, lambda m: 1.0, lambda m, lo: -1.0),
    "Atan": (None, lambda m: 1.6, lambda m, lo: -1.6),
    "Asinh": (None, lambda m: math.asinh(m), lambda m, lo: -math.asinh(m)),
    "Erf": (None, lambda m: 1.0, lambda m, lo: -1.0),
    "Softsign": (None, lambda m: 1.0, lambda m, lo: -1.0),
    "Softplus": (30.0, lambda m: m + 1, lambda m, lo: 0.0),
    "Exp": (10.0, lambda m: math.exp(m), lambda m, lo: 0.0),
    "Sinh": (8.0, lambda m: math.sinh(m), lambda m, lo: -math.sinh(m)),
    "Cosh": (8.0, lambda m: math.cosh(m), lambda m, lo: 1.0),
    "Tan": (1.2, lambda m: 3.0, lambda m, lo: -3.0),
    "HardSwish": (None, lambda m: m, lambda m, lo: -0.5),
    "Mish": (None, lambda m: m, lambda m, lo: -0.4),
    "Gelu": (None, lambda m: m, lambda m, lo: -0.2),
    "Swish": (None, lambda m: m, lambda m, lo: -0.3),
    "Sqrt": ("pos", lambda m: math.sqrt(m), lambda m, lo: 0.0),
    "Log": ("pos", lambda m: math.log(m) + 3, lambda m, lo: -3.0),
    "Reciprocal": ("pos", lambda m: 10.0, lambda m, lo: 0.0),
    "Acos": ("unit", lambda m: 3.2, lambda m, lo: 0.0),
    "Asin": ("unit", lambda m: 1.6, lambda m, lo: -1.6),
    "Atanh": ("unit", lambda m: 1.5, lambda m, lo: -1.5),
    "Acosh": ("ge1", lambda m: math.log(2 * m) + 1, lambda m, lo: 0.0),
}
EXACT_UNARY = {"Abs", "Neg", "Relu"}


def unary(g: Builder, op: str) -> None:
    limit, magf, lof = SMOOTH[op]
    v = g.pick(F, scalar=True)
    if limit == "pos":
        v = g.positive(v)
    elif limit == "unit":
        v = g.squash(v, 0.9)
    elif limit == "ge1":
        v = g.positive(v)
        (v,) = [g.add(g.node("Add", [v.name, g.const(1.0, np.float32)])[0], v.mag + 1, 1.5, False)]
    elif limit is not None:
        v = g.squash(v, limit)
    attrs = {}
    if op == "Gelu" and g.rng.random() < 0.5:
        attrs["approximate"] = "tanh"
    if op == "Swish" and g.rng.random() < 0.5:
        attrs["alpha"] = float(np.round(g.rng.uniform(0.5, 2.0), 2))
    (out,) = g.node(op, [v.name], **attrs)
    m = min(v.mag, 80.0)  # the bound only has to be rough; exp() of more overflows
    g.add(out, magf(m), lof(m, v.lo), v.exact and op in EXACT_UNARY)


builder(*SMOOTH, weight=0.6)(unary)

PARAM_UNARY = {
    "Elu": lambda r: {"alpha": r(0.1, 2.0)},
    "Selu": lambda r: {"alpha": r(1.0, 2.0), "gamma": r(0.5, 1.5)},
    "Celu": lambda r: {"alpha": r(0.2, 2.0)},
    "LeakyRelu": lambda r: {"alpha": r(0.01, 0.5)},
    "HardSigmoid": lambda r: {"alpha": r(0.1, 0.5), "beta": r(0.2, 0.7)},
    "ThresholdedRelu": lambda r: {"alpha": r(0.1, 1.5)},
    "Shrink": lambda r: {"bias": r(0.0, 1.0), "lambd": r(0.0, 1.0)},
}


@builder(*PARAM_UNARY, weight=0.5)
def param_unary(g: Builder, op: str) -> None:
    def r(a, b):
        return float(np.round(g.rng.uniform(a, b), 2))

    attrs = PARAM_UNARY[op](r) if g.rng.random() < 0.8 else {}
    v = g.pick(F)
    if op in ("ThresholdedRelu", "Shrink"):
        v = g.pick(F, exact=True)  # a threshold: exact inputs only
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, v.mag * 2 + 2, -v.mag * 2 - 2, False)


@builder("Floor", "Ceil", "Round", "Sign", weight=0.4)
def discontinuous(g: Builder, op: str) -> None:
    dtype = I if op == "Sign" and g.rng.random() < 0.3 else F
    v = g.pick(dtype, exact=True)
    (out,) = g.node(op, [v.name])
    g.add(out, v.mag + 1, min(v.lo - 1, -1.0), True)


@builder("IsNaN", "IsInf", weight=0.2)
def isnan(g: Builder, op: str) -> None:
    v = g.pick(F)
    attrs = {}
    if op == "IsInf" and g.rng.random() < 0.5:
        attrs = {
            "detect_negative": int(g.rng.integers(2)),
            "detect_positive": int(g.rng.integers(2)),
        }
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, 1, 0, True)


@builder("Clip", weight=0.5)
def clip(g: Builder, op: str) -> None:
    dtype = I if g.rng.random() < 0.2 else F
    v = g.pick(dtype)
    lo, hi = sorted(g.rng.uniform(-1.5, 1.5, size=2))
    if dtype == I:
        lo, hi = math.floor(lo * 3), math.ceil(hi * 3)
    npdt = NP[dtype]
    form = int(g.rng.integers(4))
    ins = [v.name]
    if form in (0, 1):
        ins.append(g.const(lo, npdt))
    elif form == 2:
        ins.append("")
    if form in (0, 2):
        ins.append(g.const(hi, npdt))
    (out,) = g.node(op, ins)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Add", "Sub", "Mul", "Div", "Max", "Min", weight=1.5)
def binary(g: Builder, op: str) -> None:
    dtype = I if g.rng.random() < 0.2 else F
    a, b = g.operand2(dtype)
    if op == "Div":
        if dtype == F:
            b = g.positive(b, 0.3)
            if g.rng.random() < 0.5:
                (b,) = [g.add(g.node("Neg", [b.name])[0], b.mag, -b.mag, b.exact)]
        else:
            b = g.bcast_partner(a, I, lo=1, hi=5, nonzero=True)
            if g.rng.random() < 0.5:
                (b,) = [g.add(g.node("Neg", [b.name])[0], b.mag, -b.mag, True)]
    if op == "Mul" and a.mag * b.mag > (1e6 if dtype == I else 1e4):
        raise Reject("Mul would overflow")
    (out,) = g.node(op, [a.name, b.name])
    mag = {
        "Add": a.mag + b.mag,
        "Sub": a.mag + b.mag,
        "Mul": a.mag * b.mag,
        "Div": a.mag / max(b.lo, 0.3) if b.lo > 0 else a.mag * 4,
        "Max": max(a.mag, b.mag),
        "Min": max(a.mag, b.mag),
    }[op]
    lo = {"Add": a.lo + b.lo, "Max": max(a.lo, b.lo), "Min": min(a.lo, b.lo)}.get(op, -mag)
    exact = dtype == I or (op in ("Max", "Min") and a.exact and b.exact)
    g.add(out, mag, lo, exact)


@builder("Sum", "Mean", weight=0.4)
def variadic(g: Builder, op: str) -> None:
    a = g.pick(F)
    vals = [a] + [g.bcast_partner(a, F) for _ in range(int(g.rng.integers(0, 3)))]
    (out,) = g.node(op, [v.name for v in vals])
    g.add(out, sum(v.mag for v in vals), -sum(v.mag for v in vals), False)


@builder("Pow", weight=0.4)
def power(g: Builder, op: str) -> None:
    a = g.pick(F)
    if g.rng.random() < 0.5:
        a = g.squash(g.positive(a), 8.0) if a.lo < 0.1 else g.squash(a, 8.0)
        a = g.positive(a)
        b = g.bcast_partner(a, F, lo=-2.0, hi=2.0)
    else:
        a = g.squash(a, 4.0)
        b = g.leaf((), F if g.rng.random() < 0.7 else I, as_input=False, lo=0, hi=3)
        exp = float(g.rng.integers(0, 4))
        g.inits[-1].CopyFrom(numpy_helper.from_array(np.asarray(exp, NP[b.dtype]), b.name))
    (out,) = g.node(op, [a.name, b.name])
    g.add(out, max(a.mag, 1.0) ** 3 + 1, -(max(a.mag, 1.0) ** 3), False)


@builder("PRelu", weight=0.3)
def prelu(g: Builder, op: str) -> None:
    x = g.pick(F)
    shape = list(x.shape)
    r = g.rng.random()
    if r < 0.4:
        shape = shape[int(g.rng.integers(0, len(shape) + 1)) :]
    elif r < 0.8:
        shape = [1 if g.rng.random() < 0.5 else d for d in shape]
    slope = g.leaf(tuple(shape), F, -0.5, 0.5, as_input=g.rng.random() < 0.3)
    (out,) = g.node(op, [x.name, slope.name])
    g.add(out, x.mag, -x.mag, False)


@builder("Mod", weight=0.4)
def mod(g: Builder, op: str) -> None:
    dtype = I if g.rng.random() < 0.6 else F
    a = g.pick(dtype, exact=True)
    b = g.bcast_partner(a, dtype, lo=1, hi=4, nonzero=True)
    if g.rng.random() < 0.5:
        (b,) = [g.add(g.node("Neg", [b.name])[0], b.mag, -b.mag, True)]
    fmod = 1 if dtype == F else int(g.rng.integers(2))
    (out,) = g.node(op, [a.name, b.name], fmod=fmod)
    g.add(out, 5.0, -5.0, dtype == I)


@builder("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", weight=0.5)
def compare(g: Builder, op: str) -> None:
    dtype = I if g.rng.random() < 0.4 else F
    a, b = g.operand2(dtype, exact=True)
    (out,) = g.node(op, [a.name, b.name])
    g.add(out, 1, 0, True)


@builder("And", "Or", "Xor", weight=0.3)
def logical(g: Builder, op: str) -> None:
    a, b = g.operand2(B)
    (out,) = g.node(op, [a.name, b.name])
    g.add(out, 1, 0, True)


@builder("Not", weight=0.2)
def logical_not(g: Builder, op: str) -> None:
    (out,) = g.node(op, [g.pick(B).name])
    g.add(out, 1, 0, True)


@builder("BitwiseAnd", "BitwiseOr", "BitwiseXor", weight=0.2)
def bitwise(g: Builder, op: str) -> None:
    a, b = g.operand2(I)
    (out,) = g.node(op, [a.name, b.name])
    g.add(out, 2 * max(a.mag, b.mag) + 2, -2 * max(a.mag, b.mag) - 2, True)


@builder("BitwiseNot", weight=0.1)
def bitwise_not(g: Builder, op: str) -> None:
    v = g.pick(I)
    (out,) = g.node(op, [v.name])
    g.add(out, v.mag + 1, -v.mag - 1, True)


@builder("Where", weight=0.5)
def where(g: Builder, op: str) -> None:
    cond = g.pick(B)
    dtype = I if g.rng.random() < 0.2 else F
    x = g.bcast_partner(cond, dtype) if g.rng.random() < 0.5 else g.pick(dtype)
    y = g.bcast_partner(x, dtype)
    if not (_broadcasts(cond.shape, x.shape) and _broadcasts(cond.shape, y.shape)):
        raise Reject("where shapes")
    (out,) = g.node(op, [cond.name, x.name, y.name])
    g.add(out, max(x.mag, y.mag), min(x.lo, y.lo), x.exact and y.exact)


@builder("Cast", "CastLike", weight=0.4)
def cast(g: Builder, op: str) -> None:
    src = [F, I, B][int(g.rng.choice(3, p=[0.5, 0.3, 0.2]))]
    v = g.pick(src, exact=src == F)
    to = [d for d in (F, I, B) if d != src][int(g.rng.integers(2))]
    if op == "Cast":
        (out,) = g.node(op, [v.name], to=ONNX_T[to])
    else:
        like = g.const(np.zeros((1,), NP[to]) + 1, NP[to])
        (out,) = g.node(op, [v.name, like])
    mag = 1.0 if to == B else v.mag + 1
    g.add(out, mag, min(v.lo - 1, 0.0), True)


# -- views and data movement ------------------------------------------------------------------


@builder("Reshape", weight=0.5)
def reshape(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.2)])
    dims = _factor(g.rng, v.size)
    shape = list(dims)
    if len(shape) and g.rng.random() < 0.3:
        shape[int(g.rng.integers(len(shape)))] = -1
    if g.rng.random() < 0.2 and len(shape) <= v.rank:
        k = int(g.rng.integers(len(shape))) if shape else 0
        if shape and k < v.rank and shape[k] == v.shape[k]:
            shape[k] = 0
    (out,) = g.node(op, [v.name, g.const(shape)])
    g.add(out, v.mag, v.lo, v.exact)


def _factor(rng, n: int) -> tuple[int, ...]:
    """A random shape of ``n`` elements, rank 1-4."""
    dims = []
    while n > 1 and len(dims) < 3:
        divs = [d for d in range(1, n + 1) if n % d == 0]
        d = int(rng.choice(divs))
        dims.append(d)
        n //= d
    dims.append(n)
    rng.shuffle(dims)
    return tuple(dims)


@builder("Flatten", weight=0.3)
def flatten(g: Builder, op: str) -> None:
    v = g.pick(F)
    (out,) = g.node(op, [v.name], axis=int(g.rng.integers(-v.rank, v.rank + 1)))
    g.add(out, v.mag, v.lo, v.exact)


@builder("Squeeze", "Unsqueeze", weight=0.3)
def squeeze(g: Builder, op: str) -> None:
    v = g.pick(F)
    if op == "Squeeze":
        ones = [i for i, d in enumerate(v.shape) if d == 1]
        if not ones:
            raise Reject("nothing to squeeze")
        axes = [i - v.rank if g.rng.random() < 0.3 else i for i in ones if g.rng.random() < 0.7]
        ins = [v.name] + ([g.const(axes)] if axes or g.rng.random() < 0.5 else [])
    else:
        if v.rank >= 4:
            raise Reject("rank")
        axes = [int(g.rng.integers(0, v.rank + 1))]
        ins = [v.name, g.const(axes)]
    (out,) = g.node(op, ins)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Identity", "Dropout", weight=0.15)
def identity(g: Builder, op: str) -> None:
    v = g.pick(F)
    (out,) = g.node(op, [v.name])
    g.add(out, v.mag, v.lo, v.exact)


@builder("Transpose", weight=0.6)
def transpose(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.2)], rank=(2, 3, 4))
    attrs = {} if g.rng.random() < 0.2 else {"perm": [int(p) for p in g.rng.permutation(v.rank)]}
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Concat", weight=0.5)
def concat(g: Builder, op: str) -> None:
    a = g.pick([F, I][int(g.rng.random() < 0.2)])
    axis = int(g.rng.integers(-a.rank, a.rank))
    parts = [a]
    for _ in range(int(g.rng.integers(1, 3))):
        same = [
            v
            for v in g.pool
            if v.dtype == a.dtype
            and v.rank == a.rank
            and all(x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != axis % a.rank)
        ]
        if same and g.rng.random() < 0.5:
            parts.append(same[int(g.rng.integers(len(same)))])
        else:
            shape = list(a.shape)
            shape[axis] = int(g.rng.choice(DIMS))
            parts.append(g.leaf(tuple(shape), a.dtype, -2, 2))
    (out,) = g.node(op, [p.name for p in parts], axis=axis)
    g.add(out, max(p.mag for p in parts), min(p.lo for p in parts), all(p.exact for p in parts))


@builder("Slice", weight=0.6)
def slice_(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.2)])
    axes = sorted({int(a) for a in g.rng.integers(0, v.rank, size=int(g.rng.integers(1, 3)))})
    starts, ends, steps = [], [], []
    for ax in axes:
        d = v.shape[ax]
        step = int(g.rng.choice([1, 1, 1, 2, -1, -2]))
        s, e = sorted(g.rng.integers(-d - 1, d + 2, size=2).tolist())
        if step < 0:
            s, e = e, s
        if g.rng.random() < 0.1:
            e = 2**62 if step > 0 else -(2**62)
        starts.append(s)
        ends.append(e)
        steps.append(step)
    neg_axes = [a - v.rank if g.rng.random() < 0.3 else a for a in axes]
    ins = [v.name, g.const(starts), g.const(ends)]
    form = g.rng.random()
    if form < 0.8 or any(s != 1 for s in steps):
        ins.append(g.const(neg_axes))
        if form < 0.6 or any(s != 1 for s in steps):
            ins.append(g.const(steps))
    (out,) = g.node(op, ins)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Gather", weight=0.5)
def gather(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.2)])
    axis = int(g.rng.integers(-v.rank, v.rank))
    d = v.shape[axis]
    shape = g.rand_shape(int(g.rng.integers(0, 3)))
    idx = g.leaf(shape, I, -d, d - 1, as_input=g.rng.random() < 0.4)
    if v.rank + idx.rank - 1 > 5:
        raise Reject("rank")
    (out,) = g.node(op, [v.name, idx.name], axis=axis)
    g.add(out, v.mag, v.lo, v.exact)


@builder("GatherElements", weight=0.3)
def gather_elements(g: Builder, op: str) -> None:
    v = g.pick(F)
    axis = int(g.rng.integers(-v.rank, v.rank))
    shape = list(v.shape)  # ORT allows smaller dims, the reference does not
    shape[axis] = int(g.rng.choice(DIMS))
    d = v.shape[axis]
    idx = g.leaf(tuple(shape), I, -d, d - 1, as_input=g.rng.random() < 0.4)
    (out,) = g.node(op, [v.name, idx.name], axis=axis)
    g.add(out, v.mag, v.lo, v.exact)


@builder("GatherND", weight=0.2)
def gather_nd(g: Builder, op: str) -> None:
    v = g.pick(F, rank=(2, 3, 4))
    b = int(g.rng.integers(0, 2)) if v.rank > 2 else 0
    last = int(g.rng.integers(1, v.rank - b + 1))
    lead = v.shape[:b] + g.rand_shape(int(g.rng.integers(0, 2)))
    cols = [g.rng.integers(0, v.shape[b + k], size=lead) for k in range(last)]
    idx_arr = np.stack(cols, axis=-1).astype(np.int64)
    idx = g.const(idx_arr)
    (out,) = g.node(op, [v.name, idx], batch_dims=b)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Expand", weight=0.3)
def expand(g: Builder, op: str) -> None:
    v = g.pick(F)
    shape = [int(g.rng.choice(DIMS)) if d == 1 else d for d in v.shape]
    if g.rng.random() < 0.3 and len(shape) < 4:
        shape = [int(g.rng.choice(DIMS))] + shape
    if g.rng.random() < 0.2:
        shape = [1 if g.rng.random() < 0.5 else d for d in shape]
    (out,) = g.node(op, [v.name, g.const(shape)])
    g.add(out, v.mag, v.lo, v.exact)


@builder("Tile", weight=0.2)
def tile(g: Builder, op: str) -> None:
    v = g.pick(F)
    reps = [int(g.rng.integers(1, 3)) for _ in v.shape]
    (out,) = g.node(op, [v.name, g.const(reps)])
    g.add(out, v.mag, v.lo, v.exact)


@builder("Pad", weight=0.4)
def pad(g: Builder, op: str) -> None:
    v = g.pick(F)
    mode = str(g.rng.choice(["constant", "constant", "reflect", "edge"]))
    lo_ = 0 if mode == "reflect" else -1
    pads = [int(g.rng.integers(lo_, (d - 1 if mode == "reflect" else 2) + 1)) for d in v.shape * 2]
    if g.opset >= 18 and g.rng.random() < 0.3:
        axes = sorted({int(a) for a in g.rng.integers(0, v.rank, size=2)})
        pads = [pads[a] for a in axes] + [pads[v.rank + a] for a in axes]
        ins = [v.name, g.const(pads), "", g.const(axes)]
    else:
        ins = [v.name, g.const(pads)]
    if mode == "constant" and g.rng.random() < 0.6:
        ins = ins[:2] + [g.const(float(np.round(g.rng.uniform(-2, 2), 2)), np.float32)] + ins[3:]
    (out,) = g.node(op, ins, mode=mode)
    g.add(out, max(v.mag, 2), min(v.lo, -2), v.exact)


@builder("Split", weight=0.3)
def split(g: Builder, op: str) -> None:
    v = g.pick(F)
    axis = int(g.rng.integers(-v.rank, v.rank))
    d = v.shape[axis]
    if d < 2:
        raise Reject("small")
    n = int(g.rng.integers(2, min(d, 3) + 1))
    if g.opset >= 18 and g.rng.random() < 0.5:
        outs = g.node(op, [v.name], n_out=n, axis=axis, num_outputs=n)
    else:
        cuts = sorted(g.rng.choice(np.arange(1, d), size=n - 1, replace=False).tolist())
        sizes = np.diff([0] + cuts + [d]).tolist()
        outs = g.node(op, [v.name, g.const(sizes)], n_out=n, axis=axis)
    for out in outs:
        g.add(out, v.mag, v.lo, v.exact)


@builder("DepthToSpace", "SpaceToDepth", weight=0.2)
def depth_space(g: Builder, op: str) -> None:
    bs = int(g.rng.choice([1, 2]))
    n, c, h, w = [int(g.rng.choice([1, 2])), 4 * int(g.rng.integers(1, 3)), 2, 4]
    if op == "DepthToSpace":
        v = g.leaf((n, c, h, w), F)
        attrs = {"blocksize": bs, "mode": str(g.rng.choice(["DCR", "CRD"]))}
    else:
        v = g.leaf((n, c // 2, h * 2, w), F)
        attrs = {"blocksize": bs}
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, v.mag, v.lo, v.exact)


@builder("Trilu", weight=0.2)
def trilu(g: Builder, op: str) -> None:
    v = g.pick(F, rank=(2, 3, 4))
    ins = [v.name]
    if g.rng.random() < 0.7:
        ins.append(g.const(int(g.rng.integers(-3, 4))))
    (out,) = g.node(op, ins, upper=int(g.rng.integers(2)))
    g.add(out, v.mag, min(v.lo, 0), v.exact)


@builder("OneHot", weight=0.15)
def one_hot(g: Builder, op: str) -> None:
    depth = int(g.rng.integers(2, 6))
    idx = g.leaf(g.rand_shape(int(g.rng.integers(1, 3))), I, -depth, depth - 1)
    values = g.const(np.round(g.rng.uniform(-2, 2, size=2), 2), np.float32)
    rank = idx.rank + 1
    axis = int(g.rng.integers(-rank, rank))
    (out,) = g.node(op, [idx.name, g.const(depth), values], axis=axis)
    g.add(out, 2.0, -2.0, True)


@builder("Resize", weight=0.3)
def resize(g: Builder, op: str) -> None:
    v = g.pick(F, rank=4)
    mode = str(g.rng.choice(["nearest", "linear", "cubic"]))
    ctm = str(g.rng.choice(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = str(
            g.rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
        )
    if g.rng.random() < 0.5:
        scales = [1.0, 1.0] + [float(g.rng.choice([0.5, 1.0, 2.0, 3.0])) for _ in range(2)]
        ins = [v.name, "", g.const(scales, np.float32)]
    else:
        sizes = list(v.shape[:2]) + [int(g.rng.integers(1, 8)) for _ in range(2)]
        ins = [v.name, "", "", g.const(sizes)]
    (out,) = g.node(op, ins, **attrs)
    g.add(out, v.mag * (1.5 if mode == "cubic" else 1), v.lo * 1.5, mode == "nearest" and v.exact)


# -- reductions --------------------------------------------------------------------------------

REDUCE = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
)


@builder(*REDUCE, weight=0.3)
def reduce_(g: Builder, op: str) -> None:
    dtype = I if op in ("ReduceSum", "ReduceMax", "ReduceMin") and g.rng.random() < 0.2 else F
    v = g.pick(dtype)
    if op == "ReduceLogSum":
        v = g.positive(v)
    if op in ("ReduceProd", "ReduceLogSumExp"):
        v = g.squash(v, 2.0)
    k = int(g.rng.integers(0, v.rank + 1))
    axes = sorted(g.rng.choice(v.rank, size=k, replace=False).tolist()) if k else []
    axes = [a - v.rank if g.rng.random() < 0.3 else a for a in axes]
    attrs = {"keepdims": int(g.rng.integers(2))}
    ins = [v.name]
    as_input = op == "ReduceSum" or g.opset >= 18
    if axes:
        if as_input:
            ins.append(g.const(axes))
        else:
            attrs["axes"] = axes
    if as_input and g.rng.random() < 0.2:
        attrs["noop_with_empty_axes"] = 1
    (out,) = g.node(op, ins, **attrs)
    n = max(1, v.size // max(1, out.size))
    exact = v.exact and op in ("ReduceMax", "ReduceMin") or dtype == I
    mag = {"ReduceProd": min(v.mag, 1e3) ** min(n, 10), "ReduceMax": v.mag, "ReduceMin": v.mag}.get(
        op, n * v.mag**2 + 5
    )
    lo = 0.0 if op in ("ReduceL1", "ReduceL2", "ReduceSumSquare") else -mag
    g.add(out, mag, lo, exact)


@builder("ArgMax", "ArgMin", weight=0.3)
def argmax(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.4)], exact=True)
    attrs = {
        "axis": int(g.rng.integers(-v.rank, v.rank)),
        "keepdims": int(g.rng.integers(2)),
        "select_last_index": int(g.rng.random() < 0.3),
    }
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, 5, 0, True)


@builder("CumSum", weight=0.3)
def cumsum(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.3)])
    axis = g.const(int(g.rng.integers(-v.rank, v.rank)))
    attrs = {"exclusive": int(g.rng.integers(2)), "reverse": int(g.rng.integers(2))}
    (out,) = g.node(op, [v.name, axis], **attrs)
    g.add(out, v.mag * 5, -v.mag * 5, v.dtype == I)


@builder("TopK", weight=0.3)
def topk(g: Builder, op: str) -> None:
    v = g.pick([F, I][int(g.rng.random() < 0.3)], exact=True)
    axis = int(g.rng.integers(-v.rank, v.rank))
    k = int(g.rng.integers(1, v.shape[axis] + 1))
    attrs = {"axis": axis, "largest": int(g.rng.integers(2)), "sorted": 1}
    vals, idx = g.node(op, [v.name, g.const([k])], n_out=2, **attrs)
    g.add(vals, v.mag, v.lo, True)
    if v.dtype == F:  # with ties (ints) the index order is not fixed by the spec
        g.add(idx, 5, 0, True)


@builder("Einsum", weight=0.3)
def einsum(g: Builder, op: str) -> None:
    eq = str(
        g.rng.choice(
            [
                "ij,jk->ik",
                "bij,bjk->bik",
                "ij->ji",
                "ij,ij->i",
                "i,j->ij",
                "ii->i",
                "ij->",
                "bij->bj",
            ]
        )
    )
    lhs, _ = eq.split("->")
    sizes = {c: int(g.rng.choice(DIMS)) for c in "bijk"}
    ins = [g.leaf(tuple(sizes[c] for c in term), F) for term in lhs.split(",")]
    (out,) = g.node(op, [v.name for v in ins], equation=eq)
    g.add(out, 4 * 25, -100, False)


# -- rows: softmax and norms --------------------------------------------------------------------


@builder("Softmax", "LogSoftmax", "Hardmax", weight=0.4)
def softmax(g: Builder, op: str) -> None:
    v = g.pick(F, exact=op == "Hardmax")
    v = g.squash(v, 20.0) if op != "Hardmax" else v
    attrs = {} if g.rng.random() < 0.2 else {"axis": int(g.rng.integers(-v.rank, v.rank))}
    (out,) = g.node(op, [v.name], **attrs)
    g.add(
        out,
        1.0 if op != "LogSoftmax" else 50.0,
        -50.0 if op == "LogSoftmax" else 0,
        op == "Hardmax",
    )


@builder("LayerNormalization", "RMSNormalization", weight=0.3)
def layer_norm(g: Builder, op: str) -> None:
    v = g.pick(F, min_size=2)
    axis = int(g.rng.integers(-v.rank, v.rank))
    norm = v.shape[axis % v.rank :]
    if int(np.prod(norm)) < 2:
        raise Reject("one element per row")
    ins = [v.name, g.leaf(norm, F, 0.5, 1.5, as_input=False).name]
    if op == "LayerNormalization" and g.rng.random() < 0.7:
        ins.append(g.leaf(norm, F, as_input=False).name)
    attrs = {"axis": axis}
    if g.rng.random() < 0.3:
        attrs["epsilon"] = float(g.rng.choice([1e-3, 1e-6]))
    (out,) = g.node(op, ins, **attrs)
    g.add(out, 10.0, -10.0, False)


@builder("GroupNormalization", "InstanceNormalization", "BatchNormalization", weight=0.25)
def group_norm(g: Builder, op: str) -> None:
    v = g.pick(F, rank=(3, 4) if op != "BatchNormalization" else (2, 3, 4), min_size=2)
    c = v.shape[1]
    if op != "BatchNormalization" and v.size // c < 2 and op == "InstanceNormalization":
        raise Reject("one element per instance")
    attrs = {}
    if op == "GroupNormalization":
        divs = [k for k in range(1, c + 1) if c % k == 0]
        ng = int(g.rng.choice(divs))
        attrs["num_groups"] = ng
        if (v.size // v.shape[0]) // ng < 2:
            raise Reject("one element per group")
        if g.opset < 21:
            c = ng
    ins = [v.name, g.leaf((c,), F, 0.5, 1.5, as_input=False).name]
    ins.append(g.leaf((c,), F, as_input=False).name)
    if op == "BatchNormalization":
        ins.append(g.leaf((c,), F, -1, 1, as_input=False).name)
        ins.append(g.leaf((c,), F, 0.5, 2, as_input=False).name)
    (out,) = g.node(op, ins, **attrs)
    g.add(out, 20.0, -20.0, False)


# -- gemm, conv, pools -------------------------------------------------------------------------


@builder("MatMul", weight=0.6)
def matmul(g: Builder, op: str) -> None:
    a = g.squash(g.pick(F), 10.0)
    k = a.shape[-1]
    r = g.rng.random()
    if r < 0.2:
        bshape = (k,)
    elif r < 0.6 or a.rank == 1:
        bshape = (k, int(g.rng.choice(DIMS)))
    else:
        bshape = tuple(1 if g.rng.random() < 0.3 else d for d in a.shape[:-2]) + (
            k,
            int(g.rng.choice(DIMS)),
        )
    b = g.leaf(bshape, F, as_input=g.rng.random() < 0.4)
    (out,) = g.node(op, [a.name, b.name])
    g.add(out, k * a.mag * 2, -k * a.mag * 2, False)


@builder("Gemm", weight=0.4)
def gemm(g: Builder, op: str) -> None:
    a = g.squash(g.pick(F, rank=2), 10.0)
    ta, tb = int(g.rng.integers(2)), int(g.rng.integers(2))
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = int(g.rng.choice(DIMS))
    b = g.leaf((n, k) if tb else (k, n), F, as_input=g.rng.random() < 0.3)
    ins = [a.name, b.name]
    if g.rng.random() < 0.7:
        cshape = [(m, n), (n,), (1, n), (m, 1), ()][int(g.rng.integers(5))]
        ins.append(g.leaf(cshape, F, as_input=g.rng.random() < 0.3).name)
    attrs = {"transA": ta, "transB": tb}
    if g.rng.random() < 0.4:
        attrs["alpha"] = float(np.round(g.rng.uniform(-2, 2), 2))
    if g.rng.random() < 0.4:
        attrs["beta"] = float(np.round(g.rng.uniform(-2, 2), 2))
    (out,) = g.node(op, ins, **attrs)
    g.add(out, 4 * k * a.mag + 4, -4 * k * a.mag - 4, False)


def _spatial(g: Builder, rank=4) -> Val:
    v = g.pick(F, rank=rank)
    v = g.squash(v, 10.0)
    return v


@builder("Conv", "ConvTranspose", weight=0.4)
def conv(g: Builder, op: str) -> None:
    x = _spatial(g, rank=(3, 4))
    c = x.shape[1]
    nsp = x.rank - 2
    divs = [d for d in range(1, c + 1) if c % d == 0]
    group = int(g.rng.choice(divs)) if g.rng.random() < 0.4 else 1
    cout = group * int(g.rng.integers(1, 3))
    ks = [int(g.rng.integers(1, 4)) for _ in range(nsp)]
    if op == "Conv":
        wshape = (cout, c // group, *ks)
    else:
        wshape = (c, cout // group, *ks)
    w = g.leaf(wshape, F, -1, 1, as_input=False)
    ins = [x.name, w.name]
    if g.rng.random() < 0.6:
        ins.append(g.leaf((cout,), F, as_input=False).name)
    attrs = {}
    if g.rng.random() < 0.4:
        attrs["strides"] = [int(g.rng.integers(1, 3)) for _ in range(nsp)]
    if g.rng.random() < 0.3:
        attrs["dilations"] = [int(g.rng.integers(1, 3)) for _ in range(nsp)]
    if g.rng.random() < 0.3:
        # ORT refuses dilations with SAME padding
        attrs["auto_pad"] = str(g.rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if attrs["auto_pad"] != "VALID":
            attrs.pop("dilations", None)
    elif g.rng.random() < 0.5:
        attrs["pads"] = [int(g.rng.integers(0, 2)) for _ in range(2 * nsp)]
    if op == "ConvTranspose" and g.rng.random() < 0.2 and "strides" in attrs:
        attrs["output_padding"] = [int(g.rng.integers(0, s)) for s in attrs["strides"]]
    if group > 1:
        attrs["group"] = group
    (out,) = g.node(op, ins, **attrs)
    fan = (c // group) * int(np.prod(ks))
    g.add(out, fan * x.mag + 2, -fan * x.mag - 2, False)


@builder("MaxPool", "AveragePool", "LpPool", weight=0.35)
def pool(g: Builder, op: str) -> None:
    x = _spatial(g, rank=(3, 4))
    nsp = x.rank - 2
    ks = [int(g.rng.integers(1, 4)) for _ in range(nsp)]
    attrs: dict = {"kernel_shape": ks}
    if g.rng.random() < 0.4:
        attrs["strides"] = [int(g.rng.integers(1, 3)) for _ in range(nsp)]
    if g.rng.random() < 0.3:
        attrs["auto_pad"] = str(g.rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    elif g.rng.random() < 0.5:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in ks * 2]
    if op != "LpPool" and g.rng.random() < 0.2:
        attrs["ceil_mode"] = 1
    if op == "MaxPool" and g.rng.random() < 0.2:
        attrs["dilations"] = [int(g.rng.integers(1, 3)) for _ in range(nsp)]
    if op == "AveragePool" and g.rng.random() < 0.4:
        attrs["count_include_pad"] = 1
    if op == "LpPool":
        attrs["p"] = int(g.rng.choice([1, 2, 3]))
    (out,) = g.node(op, [x.name], **attrs)
    g.add(out, x.mag * 9, x.lo, op == "MaxPool" and x.exact)


@builder("GlobalAveragePool", "GlobalMaxPool", weight=0.2)
def global_pool(g: Builder, op: str) -> None:
    x = g.pick(F, rank=(3, 4))
    (out,) = g.node(op, [x.name])
    g.add(out, x.mag, x.lo, op == "GlobalMaxPool" and x.exact)


@builder("LRN", weight=0.15)
def lrn(g: Builder, op: str) -> None:
    x = _spatial(g, rank=4)
    attrs = {"size": int(g.rng.choice([1, 3, 5]))}
    if g.rng.random() < 0.5:
        attrs.update(alpha=float(g.rng.choice([1e-4, 1e-2])), beta=0.75, bias=1.0)
    (out,) = g.node(op, [x.name], **attrs)
    g.add(out, x.mag, -x.mag, False)


# -- shape ops ---------------------------------------------------------------------------------


@builder("Shape", "Size", weight=0.15)
def shape_op(g: Builder, op: str) -> None:
    v = g.pick(F)
    attrs = {}
    if op == "Shape" and g.rng.random() < 0.4:
        attrs = {"start": int(g.rng.integers(-v.rank, v.rank))}
    (out,) = g.node(op, [v.name], **attrs)
    g.add(out, 5 ** max(1, v.rank), 1, True)


@builder("ConstantOfShape", "EyeLike", "Range", "Constant", weight=0.1)
def constant_like(g: Builder, op: str) -> None:
    value = float(np.round(g.rng.uniform(-2, 2), 2)) or 1.0
    if op == "ConstantOfShape":
        shape = g.const(list(g.rand_shape()))
        (out,) = g.node(op, [shape], value=numpy_helper.from_array(np.array([value], np.float32)))
    elif op == "EyeLike":
        v = g.pick(F, rank=2)
        (out,) = g.node(op, [v.name], k=int(g.rng.integers(-2, 3)))
    elif op == "Range":
        start = float(np.round(g.rng.uniform(-3, 3), 1))
        delta = float(g.rng.choice([0.5, 1.0, -1.0, 2.0]))
        limit = start + delta * int(g.rng.integers(1, 6))
        ins = [g.const(x, np.float32) for x in (start, limit, delta)]
        (out,) = g.node(op, ins)
    else:
        arr = g.data(g.rand_shape(), F)
        (out,) = g.node(op, [], value=numpy_helper.from_array(arr))
    g.add(out, 3.0, -3.0, op != "Range")


# -- the graph ---------------------------------------------------------------------------------


def available(opset: int) -> list[str]:
    """Ops both pyforge and ONNX (at ``opset``) know, that this generator can build."""
    from pyforge.ops import OPS

    ops = []
    for op in BUILDERS:
        if op not in OPS or OPS[op].internal:
            continue
        try:
            schema = onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            continue
        if not schema.deprecated:
            ops.append(op)
    return ops


def generate(seed: int, n_nodes: tuple[int, int] = (3, 25), only: list[str] | None = None) -> Case:
    """The random case of ``seed``: a valid model of 3-25 nodes and feeds for its inputs."""
    rng = np.random.default_rng(seed)
    opset = int(rng.choice(OPSETS))
    g = Builder(rng, opset, nan=rng.random() < 0.08)
    ops = only or available(opset)
    weights = np.array([WEIGHT[o] for o in ops])
    # small graphs are more common: each new fused kernel costs a Numba JIT
    target = n_nodes[0] + int((n_nodes[1] - n_nodes[0] + 1) * rng.random() ** 2)
    # a small op vocabulary per graph keeps the number of distinct kernels (Numba JITs) low
    vocab = list(rng.choice(ops, size=min(len(ops), 6), replace=False, p=weights / weights.sum()))
    drawn: list[str] = []
    tries = 0
    while len(g.nodes) < target and tries < 200:
        tries += 1
        op = str(rng.choice(vocab))
        n_before = len(g.nodes)
        try:
            BUILDERS[op](g)
            drawn.append(op)
        except Reject:
            del g.nodes[n_before:]
            g.pool = [v for v in g.pool if _defined(g, v)]
            continue
    outs = [v for v in g.pool if v.name not in g.used and not v.name.startswith(("in", "w"))]
    if not outs:
        outs = g.pool[-1:]
    model = _prune(g.model(outs[-4:]))  # at most 4 outputs: the rest is pruned away
    onnx.checker.check_model(model, full_check=True)
    return Case(seed, model, {k: v for k, v in g.feeds.items() if _is_input(model, k)}, drawn)


def _defined(g: Builder, v: Val) -> bool:
    if v.name.startswith(("in", "w")):
        return True
    return any(v.name in n.output for n in g.nodes)


def _is_input(model: onnx.ModelProto, name: str) -> bool:
    return any(i.name == name for i in model.graph.input)


def _prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop nodes, inputs and initializers no output depends on."""
    g = model.graph
    need = {o.name for o in g.output}
    keep = []
    for node in reversed(g.node):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    keep.reverse()
    graph = helper.make_graph(
        keep,
        g.name,
        [i for i in g.input if i.name in need],
        list(g.output),
        [t for t in g.initializer if t.name in need],
    )
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out
