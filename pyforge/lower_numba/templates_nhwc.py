"""Channels-last (NHWC) kernel templates: im2col for ConvNHWC and the NHWC pools."""

from __future__ import annotations

import hashlib

import numpy as np

from ..ir import Node
from .emit import _HEADER, KernelBuilder, KernelCall, type_name
from .scalar import lit
from .templates import ELEMENT_TEMPLATES, _window2d, gather_window, window_pool


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


_IM2COL_WARP = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, t0, t1):
    # each thread moves {per} elements 32 apart: every load and store of a warp touches 32
    # consecutive column elements, and a thread has all {per} loads in flight before it stores
    w = cuda.grid(1)
    e = (w // 32) * {chunk} + w % 32
    while e < {total}:
{loads}
{stores}
        e += (cuda.gridsize(1) // 32) * {chunk}
"""

_IM2COL_LOAD = """\
        e{k} = e + {off}
        a{k} = {zero}
        if e{k} < {total}:
            c{k} = e{k} % {c}
            r{k} = e{k} // {c}
            kx{k} = r{k} % {kw}
            r{k} = r{k} // {kw}
            ky{k} = r{k} % {kh}
            p{k} = r{k} // {kh}
            ow{k} = p{k} % {ow}
            r{k} = p{k} // {ow}
            oh{k} = r{k} % {oh}
            b{k} = r{k} // {oh}
            ih{k} = oh{k} * {sh} - {ph} + ky{k} * {dh}
            iw{k} = ow{k} * {sw} - {pw} + kx{k} * {dw}
            if ih{k} >= 0 and ih{k} < {h} and iw{k} >= 0 and iw{k} < {w}:
                a{k} = t0[((b{k} * {h} + ih{k}) * {w} + iw{k}) * {c} + c{k}]"""


def im2col_nhwc_warp(node: Node, call: KernelCall, per_thread: int = 8) -> None:
    """Give an im2col call (shapes specialised) a cuda kernel moving ``per_thread`` elements per
    thread, warp-coalesced. The generic kernel moves one element per thread, its load then its
    store, in blocks that finish at once: latency-bound (ResNet-50 layer1 on the H200: 22 us to
    write 7 MB). Here loads are issued together, so more memory requests are in flight."""
    x, y = node.inputs[0], node.outputs[0]
    if [a[0] for a in call.args] != ["t", "t"]:  # run-time shape params: keep the generic one
        return
    (kh, kw), (sh, sw), (dh, dw), pads = _window2d(node)
    total = call.n
    zero = lit(0, type_name(x.dtype))
    geometry = dict(
        total=total,
        c=x.shape[3],
        kw=kw,
        kh=kh,
        ow=y.shape[2],
        oh=y.shape[1],
        sh=sh,
        sw=sw,
        ph=pads[0],
        pw=pads[1],
        dh=dh,
        dw=dw,
        h=x.shape[1],
        w=x.shape[2],
        zero=zero,
    )
    loads = [_IM2COL_LOAD.format(k=k, off=32 * k, **geometry) for k in range(per_thread)]
    stores = [f"        if e{k} < {total}:\n            t1[e{k}] = a{k}" for k in range(per_thread)]
    src = (
        _HEADER
        + "\n"
        + _IM2COL_WARP.format(
            per=per_thread,
            chunk=32 * per_thread,
            total=total,
            loads="\n".join(loads),
            stores="\n".join(stores),
        )
    )
    threads = -(-total // per_thread)
    call.source_cuda = src
    call.key = hashlib.sha1(call.source_cpu.encode() + src.encode()).hexdigest()[:16]
    call.inner = 0
    call.launch = ((max(1, min(-(-threads // 256), 132 * 32)),), 256)


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
