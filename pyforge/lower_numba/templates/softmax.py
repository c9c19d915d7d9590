"""Softmax and LogSoftmax: one row per iteration (max, sum of exp, then the row is written)."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit


@lowering("Softmax", "LogSoftmax", form="rows")
def softmax_rows(node: Node, kb: KernelBuilder) -> int:
    """One row per iteration: max, sum of exp, then write (Softmax and LogSoftmax)."""
    x, y = node.inputs[0], node.outputs[0]
    t = type_name(x.dtype)
    axis = node.attrs["axis"]
    if node.attrs["flatten"]:
        outer, length, inner = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])), 1
    else:
        outer, length = int(np.prod(x.shape[:axis])), x.shape[axis]
        inner = int(np.prod(x.shape[axis + 1 :]))
    src, dst = kb.tensor(x.name), kb.tensor(y.name)
    L, IN = kb.int_param(length, "L"), kb.int_param(inner, "IN")
    base, m, s, j = kb.tmp("b"), kb.tmp("m"), kb.tmp("s"), kb.tmp("j")
    kb.emit(f"{base} = (i // {IN}) * {L} * {IN} + i % {IN}")
    kb.emit(f"{m} = {src}[{base}]")
    kb.emit(f"for {j} in range(1, {L}):")
    kb.emit(f"{m} = max({m}, {src}[{base} + {j} * {IN}])", 1)
    kb.emit(f"{s} = {lit(0, t)}")
    kb.emit(f"for {j} in range({L}):")
    kb.emit(f"{s} += math.exp({src}[{base} + {j} * {IN}] - {m})", 1)
    kb.emit(f"for {j} in range({L}):")
    if node.op == "LogSoftmax":
        kb.emit(f"{dst}[{base} + {j} * {IN}] = {src}[{base} + {j} * {IN}] - {m} - math.log({s})", 1)
    else:
        kb.emit(f"{dst}[{base} + {j} * {IN}] = math.exp({src}[{base} + {j} * {IN}] - {m}) / {s}", 1)
    return outer * inner
