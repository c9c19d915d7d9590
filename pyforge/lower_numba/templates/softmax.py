"""Softmax and LogSoftmax: per row its max and sum of exp, once, then the row is written."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import exp, lit


@lowering("Softmax", "LogSoftmax", form="rows")
def softmax_rows(node: Node, kb: KernelBuilder) -> int:
    """A contiguous row (the softmax axis last, or flattened): a rows x row loop, one cuda block
    per row; a strided one (axis not last): one iteration per row, one cuda thread each."""
    x, y = node.inputs[0], node.outputs[0]
    t = type_name(x.dtype)
    axis = node.attrs["axis"]
    if node.attrs["flatten"]:
        outer, length, inner = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])), 1
    else:
        outer, length = int(np.prod(x.shape[:axis])), x.shape[axis]
        inner = int(np.prod(x.shape[axis + 1 :]))
    if inner == 1:
        return _contiguous_rows(node, kb, axis, length)
    src, dst = kb.tensor(x.name), kb.tensor(y.name)
    L, IN = kb.int_param(length, "L"), kb.int_param(inner, "IN")
    base, m, s, j = kb.tmp("b"), kb.tmp("m"), kb.tmp("s"), kb.tmp("j")
    kb.emit(f"{base} = (i // {IN}) * {L} * {IN} + i % {IN}")
    kb.emit(f"{m} = {src}[{base}]")
    kb.emit(f"for {j} in range(1, {L}):")
    kb.emit(f"{m} = max({m}, {src}[{base} + {j} * {IN}])", 1)
    kb.emit(f"{s} = {lit(0, t)}")
    kb.emit(f"for {j} in range({L}):")
    kb.emit(f"{s} += {exp(f'{src}[{base} + {j} * {IN}] - {m}', t)}", 1)
    kb.emit(f"for {j} in range({L}):")
    if node.op == "LogSoftmax":
        kb.emit(f"{dst}[{base} + {j} * {IN}] = {src}[{base} + {j} * {IN}] - {m} - math.log({s})", 1)
    else:
        e = exp(f"{src}[{base} + {j} * {IN}] - {m}", t)
        kb.emit(f"{dst}[{base} + {j} * {IN}] = {e} / {s}", 1)
    return outer * inner


def _contiguous_rows(node: Node, kb: KernelBuilder, axis: int, length: int) -> int:
    x, y = node.inputs[0], node.outputs[0]
    acc = "f64" if x.dtype == np.float64 else "f32"  # float16 is stored, summed in float32
    src, dst = kb.tensor(x.name), kb.tensor(y.name)
    kb.coords(tuple(y.shape), split=axis)
    L = kb.int_param(length, "L")
    base, m, s = kb.tmp("b"), kb.tmp("m"), kb.tmp("s")
    row, out = f"{base}v", f"{base}o"
    with kb.at_row():
        kb.emit(f"{base} = o * {L}")
        # cpu: the row as views (row_reduce indexes them from 0: no negative-index wrap, so the
        # passes vectorise)
        kb.lines.append((f"{row} = {src}[{base}:]", None))
        kb.lines.append((f"{out} = {dst}[{base}:]", None))
    at = f"{src}[{base} + "
    red = dict(t=acc, at_cpu=f"{row}[")
    kb.row_reduce(m, lit(-np.inf, acc), "max({a}, {v})", f"{acc}({{v}})", L, at, **red)
    ex = exp(f"{acc}({{v}}) - {m}", acc, flush=True)  # float32: fexpz, which vectorises
    if node.op == "LogSoftmax":
        kb.row_reduce(s, lit(0, acc), "{a} + {v}", ex, L, at, **red)
        with kb.at_row():
            kb.emit(f"{s} = {m} + math.log({s})")
        kb.emit(f"{dst}[i] = {acc}({src}[i]) - {s}")
    elif x.dtype != np.float16:  # each exp kept in the output, then scaled: one exp an element
        keep = dict(keep=f"{dst}[{base} + ", keep_cpu=f"{out}[")
        kb.row_reduce(s, lit(0, acc), "{a} + {v}", ex, L, at, **red, **keep)
        kb.emit(f"{dst}[i] = {dst}[i] / {s}")
    else:
        kb.row_reduce(s, lit(0, acc), "{a} + {v}", ex, L, at, **red)
        kb.emit(f"{dst}[i] = {exp(f'{acc}({src}[i]) - {m}', acc, flush=True)} / {s}")
    return int(np.prod(y.shape))
