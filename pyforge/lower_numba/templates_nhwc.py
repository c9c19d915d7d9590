"""Channels-last (NHWC) kernel templates: im2col for ConvNHWC and the NHWC pools."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .emit import KernelBuilder, type_name
from .scalar import lit
from .templates import ELEMENT_TEMPLATES, window_pool


def im2col_nhwc(node: Node, kb: KernelBuilder) -> int:
    """col[n, (oh, ow), (ky, kx, c)] = x[n, ih, iw, c], zero in the padding; returns its size."""
    x, y = node.inputs[0], node.outputs[0]
    (kh, kw), (sh, sw), (dh, dw) = (node.attrs[a] for a in ("kernel_shape", "strides", "dilations"))
    pads = node.attrs["pads"]
    n_, h, w, c_ = x.shape
    _, oh_, ow_, _ = y.shape
    t = type_name(x.dtype)
    n, oh, ow, ky, kx, c = kb.coords((n_, oh_, ow_, kh, kw, c_))
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    ih, iw = kb.tmp("ih"), kb.tmp("iw")
    kb.emit(
        f"{ih} = {oh} * {kb.int_param(sh, 's')} - {kb.int_param(pads[0], 'p')} + {ky} * {kb.int_param(dh, 'd')}"
    )
    kb.emit(
        f"{iw} = {ow} * {kb.int_param(sw, 's')} - {kb.int_param(pads[1], 'p')} + {kx} * {kb.int_param(dw, 'd')}"
    )
    src, dst = kb.tensor(x.name), kb.tensor(f"{y.name}::col")
    kb.emit(f"if {ih} >= 0 and {ih} < {H} and {iw} >= 0 and {iw} < {W}:")
    kb.emit(f"{dst}[i] = {src}[(({n} * {H} + {ih}) * {W} + {iw}) * {C} + {c}]", 1)
    kb.emit("else:")
    kb.emit(f"{dst}[i] = {lit(0, t)}", 1)
    return n_ * oh_ * ow_ * kh * kw * c_


def pool_nhwc(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    _, h, w, c_ = node.inputs[0].shape
    n, oh, ow, c = coords
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    return window_pool(
        node, kb, oh, ow, H, W, lambda ih, iw: f"(({n} * {H} + {ih}) * {W} + {iw}) * {C} + {c}"
    )


def global_pool_nhwc(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    t = type_name(x.dtype)
    src = kb.tensor(x.name)
    _, h, w, c_ = x.shape
    HW, C = kb.int_param(h * w, "HW"), kb.int_param(c_, "C")
    acc, j = kb.tmp("acc"), kb.tmp("j")
    is_max = node.op == "GlobalMaxPoolNHWC"
    kb.emit(f"{acc} = {lit(-np.inf, t) if is_max else lit(0, t)}")
    kb.emit(f"for {j} in range({HW}):")
    v = f"{src}[({coords[0]} * {HW} + {j}) * {C} + {coords[3]}]"
    kb.emit(f"{acc} = max({acc}, {v})" if is_max else f"{acc} += {v}", 1)
    if not is_max:
        kb.emit(f"{acc} = {acc} / {t}({HW})")
    return acc


ELEMENT_TEMPLATES.update(
    MaxPoolNHWC=pool_nhwc,
    AveragePoolNHWC=pool_nhwc,
    GlobalAveragePoolNHWC=global_pool_nhwc,
    GlobalMaxPoolNHWC=global_pool_nhwc,
)
