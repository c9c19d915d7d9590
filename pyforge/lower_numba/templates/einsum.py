"""Einsum: each output element loops over the summed letters and multiplies the operands."""

from __future__ import annotations

from ...ir import Node
from ..emit import KernelBuilder, contiguous_strides, type_name
from ..registry import lowering
from ..scalar import lit


@lowering("Einsum", form="element")
def einsum_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    a = node.attrs
    t = type_name(node.outputs[0].dtype)
    var = dict(zip(a["output"], coords))
    summed = sorted({c for term in a["inputs"] for c in term} - set(a["output"]))
    acc = kb.tmp("acc")
    kb.emit(f"{acc} = {lit(0, t)}")
    for depth, ch in enumerate(summed):
        var[ch] = kb.tmp("e")
        kb.emit(f"for {var[ch]} in range({kb.int_param(a['dims'][ch], 'D')}):", depth)
    factors = []
    for term, v in zip(a["inputs"], node.inputs):
        strides = contiguous_strides(v.shape)
        off = kb.offset(strides, [var[c] for c in term]) if term else "0"
        factors.append(f"{kb.tensor(v.name)}[{off}]")
    kb.emit(f"{acc} += {' * '.join(factors)}", len(summed))
    return acc
