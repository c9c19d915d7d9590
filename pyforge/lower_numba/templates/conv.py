"""Convolutions that are not one GEMM (grouped, depthwise, transposed) and the im2col gathers
that turn the others into one."""

from __future__ import annotations

from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit
from .geometry import nc_oh_ow, spatial2d, window2d


@lowering("ConvTranspose", form="element")
def conv_transpose_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    """One output of a transposed conv: every (input channel, tap) whose stride lands on it."""
    x, w = node.inputs[0], node.inputs[1]
    t = type_name(x.dtype)
    xs, ws = kb.tensor(x.name), kb.tensor(w.name)
    h, wd = spatial2d(x.shape)
    k, s, d, p = (list(node.attrs[a]) for a in ("kernel_shape", "strides", "dilations", "pads"))
    if len(k) == 1:
        k, s, d, p = [1] + k, [1] + s, [1] + d, [0, p[0], 0, p[1]]
    n, co, oh, ow = nc_oh_ow(coords)
    cig, cog = x.shape[1] // node.attrs["group"], w.shape[1]
    H, W, C = kb.int_param(h, "H"), kb.int_param(wd, "W"), kb.int_param(x.shape[1], "C")
    CG, OG = kb.int_param(cig, "CG"), kb.int_param(cog, "OG")
    KH, KW = kb.int_param(k[0], "KH"), kb.int_param(k[1], "KW")
    SH, SW = kb.int_param(s[0], "s"), kb.int_param(s[1], "s")
    names = ("acc", "ci", "ky", "kx", "th", "tw", "g", "col")
    acc, ci, ky, kx, th, tw, c0, oc = (kb.tmp(q) for q in names)
    kb.emit(f"{acc} = {lit(0, t)}")
    kb.emit(f"{c0} = ({co} // {OG}) * {CG}")
    kb.emit(f"{oc} = {co} % {OG}")
    kb.emit(f"for {ci} in range({CG}):")
    kb.emit(f"for {ky} in range({KH}):", 1)
    kb.emit(f"{th} = {oh} + {kb.int_param(p[0], 'p')} - {ky} * {kb.int_param(d[0], 'd')}", 2)
    kb.emit(f"if {th} >= 0 and {th} % {SH} == 0 and {th} // {SH} < {H}:", 2)
    kb.emit(f"for {kx} in range({KW}):", 3)
    kb.emit(f"{tw} = {ow} + {kb.int_param(p[1], 'p')} - {kx} * {kb.int_param(d[1], 'd')}", 4)
    kb.emit(f"if {tw} >= 0 and {tw} % {SW} == 0 and {tw} // {SW} < {W}:", 4)
    kb.emit(
        f"{acc} += {xs}[(({n} * {C} + {c0} + {ci}) * {H} + {th} // {SH}) * {W} + {tw} // {SW}]"
        f" * {ws}[((({c0} + {ci}) * {OG} + {oc}) * {KH} + {ky}) * {KW} + {kx}]",
        5,
    )
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        kb.emit(f"{acc} += {kb.tensor(node.inputs[2].name)}[{co}]")
    return acc


def im2col(node: Node, kb: KernelBuilder, col_shape: tuple[int, int, int]) -> None:
    """col[n, (c, ky, kx), (oh, ow)] = padded x at the window position; zero outside."""
    x, y = node.inputs[0], node.outputs[0]
    (h, w), (oh_, ow_) = spatial2d(x.shape), spatial2d(y.shape)
    kh, kw = window2d(node)[0]
    n, c, ky, kx, oh, ow = kb.coords((x.shape[0], x.shape[1], kh, kw, oh_, ow_))
    H, W, C = kb.int_param(h, "H"), kb.int_param(w, "W"), kb.int_param(x.shape[1], "C")
    address = lambda ih, iw: f"(({n} * {C} + {c}) * {H} + {ih}) * {W} + {iw}"
    gather_window(node, kb, (oh, ow, ky, kx), (H, W), address)


def gather_window(node: Node, kb: KernelBuilder, at: tuple, hw: tuple, addr) -> None:
    """col[i] = the input at window tap (ky, kx) of output pixel (oh, ow), zero in the padding;
    ``addr(ih, iw)`` indexes the input in its layout (im2col for both NCHW and NHWC)."""
    x, y = node.inputs[0], node.outputs[0]
    (oh, ow, ky, kx), (H, W) = at, hw
    (_, _), (sh, sw), (dh, dw), pads = window2d(node)
    s = [
        kb.int_param(v, k)
        for v, k in ((sh, "s"), (pads[0], "p"), (dh, "d"), (sw, "s"), (pads[1], "p"), (dw, "d"))
    ]
    ih, iw = kb.tmp("ih"), kb.tmp("iw")
    kb.emit(f"{ih} = {oh} * {s[0]} - {s[1]} + {ky} * {s[2]}")
    kb.emit(f"{iw} = {ow} * {s[3]} - {s[4]} + {kx} * {s[5]}")
    src, dst = kb.tensor(x.name), kb.tensor(f"{y.name}::col")
    kb.emit(f"if {ih} >= 0 and {ih} < {H} and {iw} >= 0 and {iw} < {W}:")
    kb.emit(f"{dst}[i] = {src}[{addr(ih, iw)}]", 1)
    kb.emit("else:")
    kb.emit(f"{dst}[i] = {lit(0, type_name(x.dtype))}", 1)
