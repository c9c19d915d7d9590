"""Grouped and depthwise convolutions: direct kernels, one output plane per row of the loop.

cpu: once per output plane (image, channel), the input channels of its group are copied into a
zero-padded buffer and the plane summed row by row, the taps unrolled (constant offsets into
row views), so the loop over a row's width has no bounds test and vectorises; the element form
then reads the plane and applies the epilogue. cuda: one thread per output element, summed
with the bounds tested per tap. Either way the bias and activation fuse after it.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOperatorError
from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit
from .geometry import nc_oh_ow, spatial2d, window2d


def grouped(node: Node) -> bool:
    """A grouped (or depthwise) conv: summed directly, since it is no single GEMM."""
    return node.attrs.get("group", 1) != 1


def _cpu(kb: KernelBuilder, line: str, indent: int = 0) -> None:
    kb.lines.append(("    " * indent + line, None))


def _cuda(kb: KernelBuilder, line: str, indent: int = 0) -> None:
    kb.lines.append((None, "    " * indent + line))


@lowering("Conv", form="element", when=grouped, rows=lambda node: 2)
def grouped_conv_element(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if len(x.shape) not in (3, 4):
        what = f"{len(x.shape) - 2}-d grouped convolution (1-d and 2-d only)"
        raise UnsupportedOperatorError(node.op, node.name, node.opset, what)
    kb.row_block = False  # the row-level work is per thread: the plain 2-d launch on cuda
    kb.contract = True  # each tap a fused multiply-add, not a multiply and an add (0.9x the time)
    # float16 is storage only: summed in float32 (a cuda kernel must do no half arithmetic)
    t = "f32" if np.float16 in (x.dtype, w.dtype) else type_name(x.dtype)
    xs, ws = kb.tensor(x.name), kb.tensor(w.name)
    (h, wd), (oh_, _) = spatial2d(x.shape), spatial2d(y.shape)
    cg, og = w.shape[1], w.shape[0] // node.attrs["group"]
    geo = window2d(node)
    n, co, oh, ow = nc_oh_ow(coords)
    H, W, C = kb.int_param(h, "H"), kb.int_param(wd, "W"), kb.int_param(x.shape[1], "C")
    OG = kb.int_param(og, "OG")
    acc, plane = kb.tmp("acc"), kb.tmp("out")
    with kb.at_row():
        dims = (H, W, C, OG, kb.int_param(oh_, "OH"))
        pitch = padded_plane(kb, (xs, ws, t, plane), (n, co), dims, (cg, h, wd), geo)
    _cpu(kb, f"{acc} = {plane}[u64({oh} * {pitch} + {ow})]")  # unsigned: no wrap, it vectorises
    _cuda_sum(kb, (xs, ws, t, acc), (n, co, oh, ow), (H, W, C, OG, cg), geo)
    return acc


def padded_plane(kb: KernelBuilder, names: tuple, at: tuple, dims: tuple, sizes: tuple, geo) -> str:
    """cpu, once per output plane (image, channel): its group's input channels copied into a
    zero-padded buffer, then the plane one loop over every tap, each a constant offset into a
    view of the buffer (no bounds test, no index wrap: it vectorises). The weights ``ws`` None:
    the taps' plain sum (an average pool's, before its division). The buffer holds a
    channel as sh x sw sub-planes (padded row R, column c at sub-plane (R % sh, c % sw), place
    (R // sh, c // sw)): output (q, j) of any tap then reads place (q, j) plus a constant, so
    the plane is one loop at the sub-plane's width (a 7-wide row fills no vector), the few
    columns past the output's computed and never read. Returns the output plane's pitch."""
    (xs, ws, t, out), (n, co), (H, W, C, OG, OH), (cg, h, wd) = names, at, dims, sizes
    (kh, kw), (sh, sw), (dh, dw), pads = geo
    planes = sh * sw
    hq, wq = -(-(h + pads[0] + pads[2]) // sh), -(-(wd + pads[1] + pads[3]) // sw)
    HQ, WQ = kb.int_param(hq, "HQ"), kb.int_param(wq, "WQ")
    buf, c0, ci, r, s, j, wb = (kb.tmp(v) for v in ("pad", "g", "ci", "r", "s", "j", "wb"))
    src, dst = kb.tmp("sx"), kb.tmp("dx")
    # once per thread: every plane rewrites the same interior, so the padding stays zero. The
    # plane's loop runs to a multiple of 16 (no scalar remainder: a 14 x 18 plane's last 60
    # cost a third of its time), so the last tap reads up to (kw - 1) * dw // sw + 15 past the
    # end, for columns never read
    kb.setup += [
        f"{buf} = np.zeros({cg * planes} * {HQ} * {WQ} + {(kw - 1) * dw // sw + 15}, {t})",
        f"{out} = np.empty({OH} * {WQ} + 15, {t})",
    ]
    width = f"({OH} * {WQ} + 15) // 16 * 16"
    _cpu(kb, f"{c0} = ({co} // {OG}) * {cg}")
    _cpu(kb, f"for {ci} in range({cg}):")
    _cpu(kb, f"for {r} in range({H}):", 1)
    _cpu(kb, f"{src} = {xs}[(({n} * {C} + {c0} + {ci}) * {H} + {r}) * {W}:]", 2)
    rows = f"{r} + {pads[0]}"
    sub, place = (
        (f"{ci} * {planes} + ({rows}) % {sh} * {sw}", f"({rows}) // {sh}")
        if sh > 1
        else (f"{ci} * {sw}", rows)
    )
    # every phase's columns in one loop (an interleaved read LLVM vectorises; a strided read per
    # phase it does not), then a phase's one extra column; u64 indices skip the negative wrap
    phases = []  # (destination view, first column (in [0, sw)), count)
    for phase in range(sw):  # the input columns c - pl landing on places [lo, hi) of a phase
        lo, hi = -(-(pads[1] - phase) // sw), -(-(wd + pads[1] - phase) // sw)
        lo = max(lo, 0)
        if hi > lo:
            phases.append((f"{dst}{phase}", lo * sw + phase - pads[1], hi - lo))
            at = f"(({sub} + {phase}) * {HQ} + {place}) * {WQ} + {kb.int_param(lo, 'c')}"
            _cpu(kb, f"{dst}{phase} = {buf}[{at}:]", 2)
    both = min(count for _, _, count in phases)
    shared = kb.int_param(both, "L")
    _cpu(kb, f"for {s} in range({shared}):", 2)
    for view, at, _ in phases:
        _cpu(kb, f"{view}[{s}] = {src}[u64({s} * {sw} + {at})]", 3)
    for view, at, count in phases:
        if count > both:
            _cpu(kb, f"for {s} in range({shared}, {kb.int_param(count, 'L')}):", 2)
            _cpu(kb, f"{view}[{s}] = {src}[u64({s} * {sw} + {at})]", 3)
    if cg > 1:
        _cpu(kb, f"for {j} in range({width}):")
        _cpu(kb, f"{out}[{j}] = {lit(0, t)}", 1)
    _cpu(kb, f"for {ci} in range({cg}):")
    if ws is not None:
        _cpu(kb, f"{wb} = ({co} * {cg} + {ci}) * {kh * kw}", 1)
    wv = [kb.tmp("w") for _ in range(kh * kw)] if ws is not None else []
    for k, v in enumerate(wv):
        _cpu(kb, f"{v} = {ws}[{wb} + {k}]", 1)
    views: dict[tuple[int, int, int], str] = {}  # (sub-plane, row place) -> a view from there
    terms = []
    for ky in range(kh):
        for kx in range(kw):
            (rq, rp), (cq, cp) = divmod(ky * dh, sh), divmod(kx * dw, sw)
            if (rp, cp, rq) not in views:
                views[rp, cp, rq] = a = kb.tmp("a")
                at = f"(({ci} * {planes} + {rp * sw + cp}) * {HQ} + {rq}) * {WQ}"
                _cpu(kb, f"{a} = {buf}[{at}:]", 1)
            tap = f"{views[rp, cp, rq]}[{j} + {cq}]"
            terms.append(tap if ws is None else f"{tap} * {wv[ky * kw + kx]}")
    _cpu(kb, f"for {j} in range({width}):", 1)
    _cpu(kb, f"{out}[{j}] {'+=' if cg > 1 else '='} " + " + ".join(terms), 2)
    return WQ


def _cuda_sum(kb: KernelBuilder, names: tuple, at: tuple, dims: tuple, geo) -> None:
    """cuda: one output element summed over its group's channels and taps, bounds per tap."""
    (xs, ws, t, acc), (n, co, oh, ow), (H, W, C, OG, cg) = names, at, dims
    wide = (lambda v: f"f32({v})") if t == "f32" else (lambda v: v)
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
    _cuda(kb, f"{acc} += {wide(f'{xs}[{x_at}]')} * {wide(f'{ws}[{w_at}]')}", 5)
