"""Channels-last (NHWC) kernel templates: im2col for ConvNHWC and the NHWC pools."""

from __future__ import annotations

import hashlib

import numpy as np

from ...ir import Node
from ..emit import HEADER, KernelBuilder, KernelCall
from ..registry import lowering
from .conv import gather_window
from .depthwise_cuda import block_pool
from .geometry import window2d
from .window import global_reduce, window_pool


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


_IM2COL_VECTOR = """\
from numba import cuda


@cuda.jit(cache=True)
def kernel(n, t0, t1):
    # one thread per (pixel, tap, run of {v} elements): its loads all in flight before it stores
    w = cuda.grid(1)
    total = n // {per}  # n: the column matrix's elements (not a literal: every batch shares it)
    while w < total:
        g = w % {groups}
        t = w // {groups}
        kx = t % {kw}
        t = t // {kw}
        ky = t % {kh}
        p = t // {kh}
        ow = p % {ow}
        t = p // {ow}
        oh = t % {oh}
        b = t // {oh}
        ih = oh * {sh} - {ph} + ky * {dh}
        iw = ow * {sw} - {pw} + kx * {dw}
        d = w * {v}
        if ih >= 0 and ih < {h} and iw >= 0 and iw < {w}:
            s = ((b * {h} + ih) * {w} + iw) * {c} + g * {v}
{loads}
{stores}
        else:
{zeros}
        w += cuda.gridsize(1)
"""


def im2col_nhwc_vector(node: Node, call: KernelCall) -> None:
    """Give an im2col call (shapes specialised) a cuda kernel copying channel runs of 8/4/2.

    The generic kernel moves one element per thread: one load, then its store, in blocks that
    finish at once, so it is latency-bound (ResNet-50 layer1 on the H200: 22 us to write 7 MB).
    Channels are contiguous in both the input and the column matrix, so a thread can copy a
    run of them, issuing all its loads before its stores."""
    x, y = node.inputs[0], node.outputs[0]
    c_ = x.shape[3]
    # a few odd channels (the 3-channel stem): one tap's channels per thread; one thread per
    # window row (21 loads in flight) measured slower on the H200 (26.3 against 21.2 us)
    v = next((v for v in (8, 4, 2) if c_ % v == 0), c_ if c_ <= 8 else 0)
    if [a[0] for a in call.args] != ["t", "t"]:  # run-time shape params: keep the generic one
        return
    if not v:
        return
    (kh, kw), (sh, sw), (dh, dw), pads = window2d(node)
    total = y.shape[0] * y.shape[1] * y.shape[2] * kh * kw * (c_ // v)
    # runs of 16 bytes (4 float32, 8 float16): the cuda runtime passes both tensors as 16-byte
    # (complex128) views (arg kind "w"), so each load and store moves them in one instruction
    unit, zero = 1, "0"
    per16 = 16 // x.dtype.itemsize
    if x.dtype in (np.float32, np.float16) and v % per16 == 0:
        unit, zero = per16, "0j"
        call.args = [("w", name) for _, name in call.args]
    pad = " " * 12
    src = (
        HEADER
        + "\n"
        + _IM2COL_VECTOR.format(
            v=v // unit,
            per=v,
            groups=c_ // v,
            kh=kh,
            kw=kw,
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
            c=c_ // unit,
            loads="\n".join(f"{pad}a{k} = t0[s + {k}]" for k in range(v // unit)),
            stores="\n".join(f"{pad}t1[d + {k}] = a{k}" for k in range(v // unit)),
            zeros="\n".join(f"{pad}t1[d + {k}] = {zero}" for k in range(v // unit)),
        )
    )
    call.source_cuda = src
    call.key = hashlib.sha1(call.source_cpu.encode() + src.encode()).hexdigest()[:16]
    call.inner = 0
    call.launch = ((max(1, min(-(-total // 256), 132 * 32)),), 256)


@lowering("MaxPoolNHWC", "AveragePoolNHWC", form="element")
def pool_nhwc(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    _, h, w, c_ = node.inputs[0].shape
    n, oh, ow, c = coords
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(c_, "C")
    return window_pool(
        node, kb, oh, ow, H, W, lambda ih, iw: f"(({n} * {H} + {ih}) * {W} + {iw}) * {C} + {c}"
    )


@lowering(
    "GlobalAveragePoolNHWC", "GlobalMaxPoolNHWC", form="element", when=lambda n: not block_pool(n)
)  # fmt: skip
def global_pool_nhwc(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x = node.inputs[0]
    src = kb.tensor(x.name)
    _, h, w, c_ = x.shape
    HW, C = kb.int_param(h * w, "HW"), kb.int_param(c_, "C")
    at = lambda j: f"{src}[({coords[0]} * {HW} + {j}) * {C} + {coords[3]}]"
    return global_reduce(node, kb, HW, at)
