"""The int8 ops: QuantizeLinear and DequantizeLinear as element templates (scale and zero point
read at the element's coordinate along the axis, or element 0 per tensor), MatMulInteger as an
int32 dot product per output element, DynamicQuantizeLinear as one serial pass."""

from __future__ import annotations

import numpy as np

from ...ir import Node, Value
from ..emit import SPECIALIZE, KernelBuilder, broadcast_strides, contiguous_strides, type_name
from ..registry import lowering


def _param(kb: KernelBuilder, node: Node, index: int, coords: list[str]) -> str | None:
    """The scale or zero point of this element as an expression (None: no zero point)."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        return None
    if v.const is not None and v.size == 1:  # each layer's own: a run-time value, not a
        # literal, so the layers of a quantised model share kernels (minilm_l6_qstatic on cuda:
        # 406 sources, 402 of them new at a second shape; cpu reads it once before the loop)
        return f"{kb.tensor(v.name)}[0]" if SPECIALIZE.on else kb.scalar(v.name)
    a, block = node.attrs["axis"], node.attrs["block"]
    if block:  # the scale has the input's rank; the axis coordinate counts blocks
        at = list(coords)
        at[a] = f"({coords[a]} // {kb.int_param(block, 'B')})"
        return f"{kb.tensor(v.name)}[{kb.offset(contiguous_strides(v.shape), at)}]"
    return f"{kb.tensor(v.name)}[{'0' if a is None else coords[a]}]"


def _load(kb: KernelBuilder, v: Value, coords: list[str]) -> str:
    return f"{kb.tensor(v.name)}[{kb.offset(contiguous_strides(v.shape), coords)}]"


def _round_half_even(kb: KernelBuilder, x: str, indent: int = 0) -> str:
    """x rounded to the nearest integer, ties to even, as float (x must be finite)."""
    f, r = kb.tmp("fl"), kb.tmp("rn")
    up = f"{x} - {f} > 0.5 or ({x} - {f} == 0.5 and {f} % 2 != 0)"
    kb.emit(f"{f} = f64(math.floor({x}))", indent)
    kb.emit(f"{r} = {f} + (1.0 if ({up}) else 0.0)", indent)
    return r


def quantize_expr(
    kb: KernelBuilder, x: str, scale: str, zero: str, dtype: np.dtype, indent: int = 0
) -> str:
    """ORT's quantisation: x / scale in float32, rounded half to even, plus the zero point,
    saturated. Clamped before rounding too, so that an infinite quotient stays finite."""
    info = np.iinfo(dtype)
    v, q = kb.tmp("qv"), kb.tmp("q")
    lo, hi = f"{info.min - 1}.0 - {zero}", f"{info.max + 1}.0 - {zero}"
    kb.emit(f"{v} = min(max(f64(np.true_divide(f32({x}), f32({scale}))), {lo}), {hi})", indent)
    r = _round_half_even(kb, v, indent)
    kb.emit(f"{q} = min(max({r} + {zero}, {info.min}.0), {info.max}.0)", indent)
    return f"{type_name(dtype)}({q})"


@lowering("QuantizeLinear", form="element")
def quantize_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    zero = _param(kb, node, 2, coords)
    zero = "0" if zero is None else f"i32({zero})"
    out = kb.tmp()
    x, scale = _load(kb, node.inputs[0], coords), _param(kb, node, 1, coords)
    kb.emit(f"{out} = {quantize_expr(kb, x, scale, zero, node.attrs['dtype'])}")
    return out


@lowering("DequantizeLinear", form="element")
def dequantize_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    t = type_name(node.outputs[0].dtype)
    zero = _param(kb, node, 2, coords)
    diff = f"i32({_load(kb, node.inputs[0], coords)})"
    diff = diff if zero is None else f"({diff} - i32({zero}))"
    out = kb.tmp()
    kb.emit(f"{out} = {t}({diff}) * {t}({_param(kb, node, 1, coords)})")
    return out


def _int_dot(kb: KernelBuilder, node: Node, coords: list[str], a: Value, b: Value, zeros) -> str:
    """sum over k of (a - a_zero[m]) * (b - b_zero[n]) in int32, A and B batch-broadcast."""
    out_shape = node.outputs[0].shape
    batch, (m, n) = coords[:-2], coords[-2:]
    k = a.shape[-1]
    sa = broadcast_strides(a.shape[:-2], out_shape[:-2])
    sb = broadcast_strides(b.shape[:-2], out_shape[:-2])
    a0, b0, acc, j = kb.tmp("a0"), kb.tmp("b0"), kb.tmp("acc"), kb.tmp("k")
    K, N = kb.int_param(k, "K"), kb.int_param(b.shape[-1], "N")
    a_base = kb.offset([s * k * a.shape[-2] for s in sa], batch) if batch else "0"
    b_base = kb.offset([s * k * b.shape[-1] for s in sb], batch) if batch else "0"
    kb.emit(f"{a0} = {a_base} + {m} * {K}")
    kb.emit(f"{b0} = {b_base} + {n}")
    less = [
        "" if v is None else f" - i32({kb.tensor(v.name)}[{'0' if v.size == 1 else at}])"
        for v, at in zip(zeros, (m, n))
    ]
    ta, tb = kb.tensor(a.name), kb.tensor(b.name)
    kb.emit(f"{acc} = i32(0)")
    kb.emit(f"for {j} in range({K}):")
    kb.emit(
        f"{acc} += (i32({ta}[{a0} + {j}]){less[0]}) * (i32({tb}[{b0} + {j} * {N}]){less[1]})", 1
    )
    return acc


@lowering("MatMulInteger", form="element")
def matmul_integer_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    zeros = [node.inputs[i] if i < len(node.inputs) else None for i in (2, 3)]
    return _int_dot(kb, node, coords, node.inputs[0], node.inputs[1], zeros)


@lowering("QLinearMatMul", form="element")
def qlinear_matmul_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """The int32 product requantised as ORT does (see ops/quant.py's reference)."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = node.inputs
    acc = _int_dot(kb, node, coords, a, b, [a_zero, b_zero])
    col = "0" if b_scale.size == 1 else coords[-1]
    scale, v, out = kb.tmp("sc"), kb.tmp("rq"), kb.tmp()
    ts = {x: kb.tensor(x.name) for x in (a_scale, b_scale, y_scale, y_zero)}
    kb.emit(f"{scale} = f32(f32({ts[a_scale]}[0] * {ts[b_scale]}[{col}]) / {ts[y_scale]}[0])")
    zero = f"i32({ts[y_zero]}[0])"
    info = np.iinfo(y_zero.dtype)
    lo, hi = f"f32({info.min} - {zero})", f"f32({info.max} - {zero})"
    kb.emit(f"{v} = f64(min(max(f32({acc}) * {scale}, {lo}), {hi}))")
    kb.emit(f"{out} = {type_name(y_zero.dtype)}({_round_half_even(kb, v)} + {zero})")
    return out


@lowering("DynamicQuantizeLinear", form="rows")
def dynamic_quantize_rows(node: Node, kb: KernelBuilder) -> int:
    """The range of the whole tensor comes before any output: one iteration, serial (on cuda
    one thread; correct first, a two-pass parallel form would be faster on large tensors)."""
    x, y = node.inputs[0], node.outputs[0]
    src, dst = kb.tensor(x.name), kb.tensor(y.name)
    lo, hi, j, scale, zero = (kb.tmp(p) for p in ("lo", "hi", "j", "sc", "zp"))
    N = kb.int_param(x.size, "N")
    kb.emit(f"{lo} = f32(0.0)")
    kb.emit(f"{hi} = f32(0.0)")
    kb.emit(f"for {j} in range({N}):")
    kb.emit(f"{lo} = min({lo}, {src}[{j}])", 1)
    kb.emit(f"{hi} = max({hi}, {src}[{j}])", 1)
    kb.emit(f"{scale} = f32(1.0) if {hi} == {lo} else f32(({hi} - {lo}) / f32(255.0))")
    z0 = kb.tmp("z")
    kb.emit(f"{z0} = min(max(f64(f32(0.0) - f32({lo} / {scale})), 0.0), 255.0)")
    kb.emit(f"{zero} = i32({_round_half_even(kb, z0)})")
    part = node.attrs.get("output", 0)
    if part == 1:
        kb.emit(f"{dst}[0] = {scale}")
    elif part == 2:
        kb.emit(f"{dst}[0] = u8({zero})")
    else:
        kb.emit(f"for {j} in range({N}):")
        expr = quantize_expr(kb, f"{src}[{j}]", scale, zero, np.dtype(np.uint8), 1)
        kb.emit(f"{dst}[{j}] = {expr}", 1)
    return 1
