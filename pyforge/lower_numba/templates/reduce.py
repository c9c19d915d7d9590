"""Reduction kernels: each output element loops over its reduced extent."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, contiguous_strides, type_name
from ..registry import lowering
from ..scalar import lit

ROW_LONG = 256  # a reduced last axis at least this long gets a block of threads per row (cuda)

# op -> (initial value, accumulate(acc, v), finish(acc, count)); t is the type name.
# A sum starts at -0.0, the identity that keeps an all -0.0 sum -0.0; a NaN, once met, stays
_KINDS = {
    "ReduceSum": ("-0", "{a} + {v}", "{a}"),
    "ReduceMean": ("-0", "{a} + {v}", "{a} / {t}({n})"),
    "ReduceMax": ("lo", "({v} if {v} > {a} or {v} != {v} else {a})", "{a}"),
    "ReduceMin": ("hi", "({v} if {v} < {a} or {v} != {v} else {a})", "{a}"),
    "ReduceProd": ("1", "{a} * {v}", "{a}"),
    "ReduceL1": ("0", "{a} + abs({v})", "{a}"),
    "ReduceL2": ("0", "{a} + {v} * {v}", "math.sqrt({a})"),
    "ReduceLogSum": ("0", "{a} + {v}", "math.log({a})"),
    "ReduceSumSquare": ("0", "{a} + {v} * {v}", "{a}"),
}


def _init(kind: str, dtype: np.dtype, t: str) -> str:
    if kind in ("lo", "hi"):
        if dtype.kind == "b":
            return lit(kind == "hi", t)
        if dtype.kind == "f":
            return lit(-np.inf if kind == "lo" else np.inf, t)
        info = np.iinfo(dtype)
        return lit(info.min if kind == "lo" else info.max, t)
    if kind == "-0":
        return lit(-0.0, t) if dtype.kind == "f" else lit(0, t)
    return lit(int(kind), t)


def reduced_loop(node: Node, kb: KernelBuilder, coords: list[str]) -> tuple[str, str, str, int]:
    """Emit the loop header over the reduced axes; return (loop var, element expr, base, count).

    The loop body is at indent 1; ``coords`` are the output coordinates."""
    x = node.inputs[0]
    axes, keep = node.attrs["axes"], node.attrs["keepdims"]
    strides = contiguous_strides(x.shape)
    kept = [i for i in range(len(x.shape)) if i not in axes]
    out_coords = [c for i, c in enumerate(coords) if i not in axes] if keep else coords
    base = kb.tmp("b")
    kb.emit(f"{base} = {kb.offset([strides[i] for i in kept], out_coords)}")
    count = int(np.prod([x.shape[a] for a in axes]))
    j = kb.tmp("j")
    kb.emit(f"for {j} in range({kb.int_param(count, 'R')}):")
    rem, terms = j, []
    for a in reversed(axes):
        c = kb.tmp("q")
        if a == axes[0]:
            kb.emit(f"{c} = {rem}", 1)
        else:
            d = kb.int_param(x.shape[a], "d")
            kb.emit(f"{c} = {rem} % {d}", 1)
            nxt = kb.tmp("r")
            kb.emit(f"{nxt} = {rem} // {d}", 1)
            rem = nxt
        terms.append(f"{c} * {kb.int_param(strides[a], 's')}")
    off = " + ".join([base, *terms])
    return j, f"{kb.tensor(x.name)}[{off}]", base, count


@lowering(*_KINDS, "ReduceLogSumExp", form="element")
def reduce_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    acc = kb.tmp("acc")
    if node.op == "ReduceLogSumExp":
        m = kb.tmp("mx")
        kb.emit(f"{m} = {lit(-np.inf, t)}")
        _, v, _, n = reduced_loop(node, kb, coords)
        kb.emit(f"{m} = max({m}, {v})", 1)  # a NaN input makes the sum below NaN anyway
        kb.emit(f"if not math.isfinite({m}):")
        kb.emit(f"{m} = {lit(0, t)}", 1)
        kb.emit(f"{acc} = {lit(0, t)}")
        _, v, _, n = reduced_loop(node, kb, coords)
        kb.emit(f"{acc} += math.exp({v} - {m})", 1)
        kb.emit(f"{acc} = math.log({acc}) + {m}")
        return acc
    init, step, finish = _KINDS[node.op]
    kb.emit(f"{acc} = {_init(init, np.dtype(x.dtype), t)}")
    _, v, _, n = reduced_loop(node, kb, coords)
    val = kb.tmp("v")
    kb.emit(f"{val} = {v}", 1)
    kb.emit(f"{acc} = {step.format(a=acc, v=val)}", 1)
    out = kb.tmp("acc")
    kb.emit(f"{out} = {t}({finish.format(a=acc, t=t, n=kb.int_param(max(n, 1), 'R') if n else 0)})")
    return out


def _long_last_axis(node: Node) -> bool:
    """One long row a reduction (a vocabulary's logits): a block of threads per row on cuda."""
    x, axes = node.inputs[0], node.attrs["axes"]
    return axes == [len(x.shape) - 1] and node.attrs["keepdims"] and x.shape[-1] >= ROW_LONG


@lowering(
    "ArgMax",
    "ArgMin",
    form="element",
    when=_long_last_axis,
    rows=lambda n: len(n.inputs[0].shape) - 1,
)
def arg_rows(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """Two row reductions: the extreme (a NaN sticks, as in numpy), then the first index holding
    it (the last with select_last_index; a NaN row's first NaN)."""
    x = node.inputs[0]
    t, L = type_name(x.dtype), kb.int_param(x.shape[-1], "L")
    lo = node.op == "ArgMax"
    base, best, idx = kb.tmp("rb"), kb.tmp("best"), kb.tmp("idx")
    lead = kb.offset(contiguous_strides(x.shape[:-1]), coords[:-1]) if len(x.shape) > 1 else "0"
    with kb.at_row():
        kb.emit(f"{base} = ({lead}) * {L}")
    at = f"{kb.tensor(x.name)}[{base} + "
    better = "{v} > {a}" if lo else "{v} < {a}"
    init = _init("lo" if lo else "hi", np.dtype(x.dtype), t)
    kb.row_reduce(best, init, f"({{v}} if {better} or {{v}} != {{v}} else {{a}})", "{v}", L, at, t)
    hit = f"{{v}} == {best} or {{v}} != {{v}}"
    if node.attrs["select_last_index"]:
        kb.row_reduce(
            idx, "i64(-1)", "max({a}, {v})", f"({{j}} if {hit} else i64(-1))", L, at, "i64"
        )
    else:
        kb.row_reduce(
            idx, f"i64({L})", "min({a}, {v})", f"({{j}} if {hit} else i64({L}))", L, at, "i64"
        )
    return f"i64({idx})"


@lowering("ArgMax", "ArgMin", form="element", when=lambda node: not _long_last_axis(node))
def arg_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    best, idx = kb.tmp("best"), kb.tmp("idx")
    better = ">" if node.op == "ArgMax" else "<"
    # NaN is the extreme, as numpy and onnx.reference take it: the first (or last) NaN wins
    nan = f"{{v}} != {{v}} and {best} == {best}"
    if node.attrs["select_last_index"]:
        better += "="
        nan = "{v} != {v}"
    kb.emit(f"{best} = {_init('lo' if node.op == 'ArgMax' else 'hi', np.dtype(x.dtype), t)}")
    kb.emit(f"{idx} = 0")
    kb.emit("first = True")
    j, v, _, _ = reduced_loop(node, kb, coords)
    val = kb.tmp("v")
    kb.emit(f"{val} = {v}", 1)
    kb.emit(f"if first or {val} {better} {best} or {nan.format(v=val)}:", 1)
    kb.emit(f"{best} = {val}", 2)
    kb.emit(f"{idx} = {j}", 2)
    kb.emit("first = False", 2)
    return idx
