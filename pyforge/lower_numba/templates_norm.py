"""Row normalizations: each output element recomputes its row's statistics (one loop each)."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .emit import KernelBuilder, broadcast_strides, contiguous_strides, type_name
from .scalar import lit
from .templates import ELEMENT_TEMPLATES


def norm_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    a, part = node.attrs["axis"], node.attrs.get("output", 0)
    t = type_name(x.dtype)
    length = int(np.prod(x.shape[a:]))
    src = kb.tensor(x.name)
    L = kb.int_param(length, "L")
    base, j, s, m, inv = (kb.tmp(p) for p in ("rb", "j", "ssq", "mu", "rstd"))
    lead = kb.offset(contiguous_strides(x.shape[:a]), coords[:a]) if a else "0"
    kb.emit(f"{base} = ({lead}) * {L}")
    kb.emit(f"{m} = {lit(0, 'f32')}")
    if node.op == "LayerNormalization":
        kb.emit(f"for {j} in range({L}):")
        kb.emit(f"{m} += {src}[{base} + {j}]", 1)
        kb.emit(f"{m} = {m} / f32({L})")
    kb.emit(f"{s} = {lit(0, 'f32')}")
    kb.emit(f"for {j} in range({L}):")
    kb.emit(f"{s} += ({src}[{base} + {j}] - {m}) * ({src}[{base} + {j}] - {m})", 1)
    eps = lit(node.attrs["epsilon"], "f32")
    kb.emit(f"{inv} = {lit(1, 'f32')} / math.sqrt({s} / f32({L}) + {eps})")
    if part == 1:
        return m
    if part == 2:
        return inv
    inner = coords[a:]
    off = kb.offset(contiguous_strides(x.shape[a:]), inner)
    y = kb.tmp("y")
    scale = node.inputs[1]
    soff = kb.offset(broadcast_strides(scale.shape, x.shape[a:]), inner)
    kb.emit(f"{y} = {t}(({src}[{base} + {off}] - {m}) * {inv}) * {kb.tensor(scale.name)}[{soff}]")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        b = node.inputs[2]
        boff = kb.offset(broadcast_strides(b.shape, x.shape[a:]), inner)
        kb.emit(f"{y} = {y} + {kb.tensor(b.name)}[{boff}]")
    return y


ELEMENT_TEMPLATES["LayerNormalization"] = norm_element
ELEMENT_TEMPLATES["RMSNormalization"] = norm_element
