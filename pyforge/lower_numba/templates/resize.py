"""Resize/Upsample: each output element sums its taps over the resized axes' tables."""

from __future__ import annotations

from ...ir import Node
from ..emit import KernelBuilder, contiguous_strides, type_name
from ..registry import lowering
from ..scalar import lit


@lowering("Resize", "Upsample", form="element")
def resize_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    strides = contiguous_strides(x.shape)
    resized = node.attrs["resized"]
    axes = {a for a, _ in resized}
    kept = [(s, c) for ax, (s, c) in enumerate(zip(strides, coords)) if ax not in axes]
    base, y = kb.tmp("rb"), kb.tmp("y")
    kb.emit(f"{base} = {kb.offset([s for s, _ in kept], [c for _, c in kept])}")
    src = kb.tensor(x.name)
    tables = [node.inputs[1 + 3 * k : 4 + 3 * k] for k in range(len(resized))]
    if node.attrs["nearest"]:
        terms = [base]
        for (a, _), (idx, _, _) in zip(resized, tables):
            terms.append(f"{kb.tensor(idx.name)}[{coords[a]}] * {kb.int_param(strides[a], 's')}")
        kb.emit(f"{y} = {src}[{' + '.join(terms)}]")
    else:
        kb.emit(f"{y} = {lit(0, t)}")
        depth, off, weight = 0, base, None
        for (a, taps), (idx, w, _) in zip(resized, tables):
            tap, pos, wv = kb.tmp("tp"), kb.tmp("ps"), kb.tmp("wt")
            T = kb.int_param(taps, "T")
            kb.emit(f"for {tap} in range({T}):", depth)
            kb.emit(f"{pos} = {coords[a]} * {T} + {tap}", depth + 1)
            w_here = f"{kb.tensor(w.name)}[{pos}]"
            kb.emit(
                f"{wv} = {w_here}" if weight is None else f"{wv} = {weight} * {w_here}", depth + 1
            )
            s = kb.int_param(strides[a], "s")
            off = f"{off} + {kb.tensor(idx.name)}[{pos}] * {s}"
            depth, weight = depth + 1, wv
        # no resized axis (every size kept): the element itself
        kb.emit(f"{y} += {weight or lit(1, t)} * {src}[{off}]", depth)
    if node.attrs["extrapolate"]:
        flags = " + ".join(
            f"{kb.tensor(mask.name)}[{coords[a]}]" for (a, _), (_, _, mask) in zip(resized, tables)
        )
        kb.emit(f"if {flags or '0'} > 0:")
        kb.emit(f"{y} = {lit(node.attrs['extrapolation'], t)}", 1)
    return y
