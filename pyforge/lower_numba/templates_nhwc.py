"""Channels-last (NHWC) kernel templates: im2col for ConvNHWC and the NHWC pools."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .emit import KernelBuilder, type_name
from .scalar import lit
from .templates import ELEMENT_TEMPLATES, gather_window, window_pool


def im2col_nhwc(node: Node, kb: KernelBuilder) -> int:
    """col[n, (oh, ow), (ky, kx, c)] = x[n, ih, iw, c], zero in the padding; returns its size."""
    x, y = node.inputs[0], node.outputs[0]
    kh, kw = node.attrs["kernel_shape"]
    n_, h, w, c_ = x.shape
    _, oh_, ow_, _ = y.shape
    n, oh, ow, ky, kx, c = kb.coords((n_, oh_, ow_, kh, kw, c_))
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    address = lambda ih, iw: f"(({n} * {H} + {ih}) * {W} + {iw}) * {C} + {c}"
    gather_window(node, kb, (oh, ow, ky, kx), (H, W), address)
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
