"""Grouped and depthwise convolutions: direct kernels, one output row per row of the loop.

cpu: once per output row, the KH input rows of each channel of its group are copied into a
zero-padded buffer and the row's weights read into locals; each output element is then one
branch-free sum over the taps, unrolled (constant offsets), so the loop over the row's width
has no bounds test and vectorises. cuda: one thread per output element, summed with the bounds
tested per tap. Either way the element form lets the bias and activation fuse after it.
"""

from __future__ import annotations

from ...errors import UnsupportedOperatorError
from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit
from .geometry import nc_oh_ow, spatial2d, window2d

UNROLL_TAPS = 81  # up to this many taps per output (CG * KH * KW) are written out one by one


def grouped(node: Node) -> bool:
    """A grouped (or depthwise) conv: summed directly, since it is no single GEMM."""
    return node.attrs.get("group", 1) != 1


def _last_axis(node: Node) -> int:
    return len(node.outputs[0].shape) - 1


def _cpu(kb: KernelBuilder, line: str, indent: int = 0) -> None:
    kb.lines.append(("    " * indent + line, None))


def _cuda(kb: KernelBuilder, line: str, indent: int = 0) -> None:
    kb.lines.append((None, "    " * indent + line))


@lowering("Conv", form="element", when=grouped, rows=_last_axis)
def grouped_conv_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x, w = node.inputs[0], node.inputs[1]
    if len(x.shape) not in (3, 4):
        what = f"{len(x.shape) - 2}-d grouped convolution (1-d and 2-d only)"
        raise UnsupportedOperatorError(node.op, node.name, node.opset, what)
    kb.row_block = False  # row-level work is per thread: the plain 2-d launch on cuda
    t = type_name(x.dtype)
    xs, ws = kb.tensor(x.name), kb.tensor(w.name)
    (h, wd), (cg, og) = spatial2d(x.shape), (w.shape[1], w.shape[0] // node.attrs["group"])
    geo = window2d(node)
    (kh, kw), (_, sw), (_, dw), pads = geo
    n, co, oh, ow = nc_oh_ow(coords)
    H, W, C = kb.int_param(h, "H"), kb.int_param(wd, "W"), kb.int_param(x.shape[1], "C")
    OG = kb.int_param(og, "OG")
    acc = kb.tmp("acc")
    with kb.at_row():
        rows, r = _pad_rows(
            kb, xs, t, (n, co, oh), (H, W, C, OG), (cg, wd + pads[1] + pads[3]), geo
        )
    taps = [(ci, ky, kx) for ci in range(cg) for ky in range(kh) for kx in range(kw)]
    p = kb.tmp("p")
    _cpu(kb, f"{p} = {ow} * {sw}")
    if len(taps) <= UNROLL_TAPS:
        wv = [kb.tmp("w") for _ in taps]
        with kb.at_row():
            wb = kb.tmp("wb")
            _cpu(kb, f"{wb} = {co} * {len(taps)}")
            for k, v in enumerate(wv):
                _cpu(kb, f"{v} = {ws}[{wb} + {k}]")
        terms = [
            f"{rows}[{p} + {r}{ci * kh + ky} + {kx * dw}] * {v}"
            for (ci, ky, kx), v in zip(taps, wv)
        ]
        _cpu(kb, f"{acc} = " + " + ".join(terms))
    else:
        ci, b, wb = kb.tmp("ci"), kb.tmp("b"), kb.tmp("wb")
        _cpu(kb, f"{acc} = {lit(0, t)}")
        _cpu(kb, f"for {ci} in range({cg}):")
        _cpu(kb, f"{b} = {p} + {ci} * {r}{kh}", 1)
        _cpu(kb, f"{wb} = ({co} * {cg} + {ci}) * {kh * kw}", 1)
        terms = [
            f"{rows}[{b} + {r}{ky} + {kx * dw}] * {ws}[{wb} + {ky * kw + kx}]"
            for ky in range(kh)
            for kx in range(kw)
        ]
        _cpu(kb, f"{acc} += " + " + ".join(terms), 1)
    _cuda_sum(kb, (xs, ws, t, acc), (n, co, oh, ow), (H, W, C, OG, cg), geo)
    return acc


def _pad_rows(kb: KernelBuilder, xs: str, t: str, at: tuple, dims: tuple, sizes: tuple, geo):
    """cpu, once per output row: the KH input rows of each group channel, zero-padded to WP
    columns, and the prefix of the names r{j} holding where row j starts (j < CG * KH; r{KH}:
    the length of one channel's rows)."""
    (n, co, oh), (H, W, C, OG), (cg, wp) = at, dims, sizes
    (kh, _), (sh, _), (dh, _), pads = geo
    WP = kb.int_param(wp, "WP")
    buf, c0, ci, ky, ih, src, dst, s = (
        kb.tmp(q) for q in ("rows", "g", "ci", "ky", "ih", "sx", "d", "s")
    )
    _cpu(kb, f"{buf} = np.zeros({cg * kh} * {WP}, {t})")
    _cpu(kb, f"{c0} = ({co} // {OG}) * {cg}")
    _cpu(kb, f"for {ci} in range({cg}):")
    _cpu(kb, f"for {ky} in range({kh}):", 1)
    _cpu(kb, f"{ih} = {oh} * {sh} - {pads[0]} + {ky} * {dh}", 2)
    _cpu(kb, f"if {ih} >= 0 and {ih} < {H}:", 2)
    _cpu(kb, f"{src} = (({n} * {C} + {c0} + {ci}) * {H} + {ih}) * {W}", 3)
    _cpu(kb, f"{dst} = ({ci} * {kh} + {ky}) * {WP} + {pads[1]}", 3)
    _cpu(kb, f"for {s} in range({W}):", 3)
    _cpu(kb, f"{buf}[{dst} + {s}] = {xs}[{src} + {s}]", 4)
    r = kb.tmp("row") + "_"
    for j in sorted({*range(cg * kh), kh}):
        _cpu(kb, f"{r}{j} = {j} * {WP}")
    return buf, r


def _cuda_sum(kb: KernelBuilder, names: tuple, at: tuple, dims: tuple, geo) -> None:
    """cuda: one output element summed over its group's channels and taps, bounds per tap."""
    (xs, ws, t, acc), (n, co, oh, ow), (H, W, C, OG, cg) = names, at, dims
    (kh, kw), (sh, sw), (dh, dw), pads = geo
    ci, ky, kx, ih, iw, c0 = (kb.tmp(p) for p in ("ci", "ky", "kx", "ih", "iw", "g"))
    _cuda(kb, f"{acc} = {lit(0, t)}")
    _cuda(kb, f"{c0} = ({co} // {OG}) * {cg}")
    _cuda(kb, f"for {ci} in range({cg}):")
    _cuda(kb, f"for {ky} in range({kh}):", 1)
    _cuda(kb, f"{ih} = {oh} * {sh} - {pads[0]} + {ky} * {dh}", 2)
    _cuda(kb, f"if {ih} >= 0 and {ih} < {H}:", 2)
    _cuda(kb, f"for {kx} in range({kw}):", 3)
    _cuda(kb, f"{iw} = {ow} * {sw} - {pads[1]} + {kx} * {dw}", 4)
    _cuda(kb, f"if {iw} >= 0 and {iw} < {W}:", 4)
    x_at = f"(({n} * {C} + {c0} + {ci}) * {H} + {ih}) * {W} + {iw}"
    w_at = f"(({co} * {cg} + {ci}) * {kh} + {ky}) * {kw} + {kx}"
    _cuda(kb, f"{acc} += {xs}[{x_at}] * {ws}[{w_at}]", 5)
