"""The GEMM form of each GEMM-anchored op: Gemm, MatMul, Conv (NCHW, im2col when not pointwise)
and ConvNHWC (im2col, strided batched or plain), plus the epilogue as BLAS-library terms."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOperatorError
from ...ir import Node, Value
from ..emit import KernelBuilder, broadcast_strides
from ..program import GemmCall, Program
from ..registry import lowering
from .conv import im2col
from .geometry import spatial2d, window2d
from .nhwc import im2col_nhwc, im2col_nhwc_vector


def ungrouped(node: Node) -> bool:
    return node.attrs.get("group", 1) == 1


@lowering("Gemm", "MatMul", "Conv", "ConvNHWC", form="gemm", when=ungrouped)
def gemm_for(node: Node, prog: Program, d: str) -> GemmCall:
    """The GEMM (with an im2col prologue for non-pointwise convs) computing the anchor into d."""
    call = _gemm_call(node, prog, d)
    call.label = call.label or f"{node.op} {node.name}"
    return call


def _gemm_call(node: Node, prog: Program, d: str) -> GemmCall:
    form = {"Gemm": _gemm, "MatMul": _matmul, "ConvNHWC": _conv_nhwc}.get(node.op, _conv_nchw)
    return form(node, prog, d)


def _gemm(node: Node, prog: Program, d: str) -> GemmCall:
    a, b = node.inputs[0], node.inputs[1]
    at, bt = bool(node.attrs["transA"]), bool(node.attrs["transB"])
    m, k = (a.shape[1], a.shape[0]) if at else a.shape
    n = b.shape[0] if bt else b.shape[1]
    call = GemmCall(prog.add(a), prog.add(b), d, m, n, k, a.shape[1], b.shape[1], n, at, bt)
    call.alpha = node.attrs["alpha"]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = node.inputs[2]
        # the GEMM reads C as a full [M, N] matrix: a broadcasting C is expanded to it first
        name = prog.add(c) if tuple(c.shape) == (m, n) else _expanded(node, prog, c, (m, n))
        call.c, call.ldc, call.beta = name, n, node.attrs["beta"]
    return call


def _matmul(node: Node, prog: Program, d: str) -> GemmCall:
    a, b = node.inputs[0], node.inputs[1]
    sa, sb = a.shape, b.shape
    k = sa[-1]
    n = 1 if len(sb) == 1 else sb[-1]
    ldb = 1 if len(sb) == 1 else n
    if len(sb) <= 2:
        m = int(np.prod(sa[:-1])) if len(sa) > 1 else 1
        return GemmCall(prog.add(a), prog.add(b), d, m, n, k, k, ldb, n)
    m = 1 if len(sa) == 1 else sa[-2]
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    a_name, stride_a = _batch_operand(node, prog, a, batch, m * k)
    b_name, stride_b = _batch_operand(node, prog, b, batch, k * n)
    return GemmCall(
        a_name,
        b_name,
        d,
        m,
        n,
        k,
        k,
        n,
        n,
        batch=int(np.prod(batch)),
        stride_a=stride_a,
        stride_b=stride_b,
        stride_d=m * n,
    )


def _batch_operand(node: Node, prog: Program, v: Value, batch: tuple, size: int):
    """(tensor, batch stride) of one MatMul operand over the output's batch dims: stride 0 when
    it has one matrix, its own when its batch dims are the output's, else a broadcast copy made
    by a kernel run before the GEMM (one strided-batched GEMM has one stride per operand)."""
    own = tuple(v.shape[:-2])
    if int(np.prod(own)) == 1:
        return prog.add(v), 0
    if (1,) * (len(batch) - len(own)) + own == batch:
        return prog.add(v), size
    return _expanded(node, prog, v, (*batch, *v.shape[-2:])), size


def _expanded(node: Node, prog: Program, v: Value, shape: tuple) -> str:
    """A copy of ``v`` broadcast to ``shape``, made by a kernel step run before the GEMM."""
    name = prog.temp(f"{node.outputs[0].name}::{v.name}::expand", shape, v.dtype)
    kb = KernelBuilder(f"Expand {node.name}")
    coords = kb.coords(shape)
    src = kb.offset(broadcast_strides(v.shape, shape), coords)
    kb.emit(f"{kb.tensor(name)}[i] = {kb.tensor(prog.add(v))}[{src}]")
    call = kb.build(int(np.prod(shape)))
    call.writes = [name]
    prog.steps.append(call)  # lowering appends the GEMM call after this
    return name


def _conv_nchw(node: Node, prog: Program, d: str) -> GemmCall:
    """Dense NCHW conv: W[Co, K] @ col[n][K, P] for every image n (no gather when pointwise)."""
    a, b = node.inputs[0], node.inputs[1]
    x, y = a, node.outputs[0]
    if len(x.shape) not in (3, 4):
        raise UnsupportedOperatorError(
            node.op, node.name, node.opset, f"{len(x.shape) - 2}-d convolution"
        )
    co, kk = b.shape[0], int(np.prod(b.shape[1:]))
    p = int(np.prod(y.shape[2:]))
    prologue = None
    pointwise = all(v == 1 for v in node.attrs["kernel_shape"] + node.attrs["strides"]) and not any(
        node.attrs["pads"]
    )
    src = prog.add(x)
    conv = None
    if not pointwise:
        src = prog.temp(f"{y.name}::col", (x.shape[0], kk, p), x.dtype)
        kb = KernelBuilder(f"im2col {node.name}")
        im2col(node, kb, (x.shape[0], kk, p))
        prologue = kb.build(x.shape[0] * kk * p)
        prologue.writes = [src]
        (kh, kw), (sh, sw), (dh, dw), pads = window2d(node)
        (h, w), (oh, ow) = spatial2d(x.shape), spatial2d(y.shape)
        geometry = (x.shape[0], x.shape[1], h, w, kh, kw, sh, sw, pads[0], pads[1], dh, dw, oh, ow)
        conv = {"x": prog.add(x), "col": src, "geometry": [int(v) for v in geometry]}
    return GemmCall(
        prog.add(b),
        src,
        d,
        co,
        p,
        kk,
        kk,
        p,
        p,
        batch=x.shape[0],
        stride_a=0,
        stride_b=kk * p,
        stride_d=co * p,
        label=f"Conv {node.name}",
        prologue=prologue,
        conv=conv,
    )


def nhwc_gemm_form(node: Node) -> str:
    """How a ConvNHWC becomes a GEMM: "matrix" (x already is col), "strided" (a strided batched
    GEMM over rows) or "im2col" (a gather first)."""
    x, y = node.inputs[0], node.outputs[0]
    (kh, kw), (sh, sw) = node.attrs["kernel_shape"], node.attrs["strides"]
    pointwise = kh == kw == 1 and not any(node.attrs["pads"])
    if pointwise and sh == sw == 1:
        return "matrix"
    # stride s: every s-th pixel of every s-th row, no copy; but one small GEMM per output row
    # loses to gather + one GEMM once rows are short (measured on the H200: 33 us at ow=7)
    if pointwise and x.shape[1] == y.shape[1] * sh and y.shape[2] >= 28:
        return "strided"
    return "im2col"


def _conv_nhwc(node: Node, prog: Program, d: str) -> GemmCall:
    """Channels last: D[n*P, Co] = col[n*P, K] @ W[Co, K]^T, K ordered (ky, kx, c)."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    n_, _, wd, c = x.shape
    _, oh, ow, co = y.shape
    (kh, kw), (sh, sw) = node.attrs["kernel_shape"], node.attrs["strides"]
    kk = kh * kw * c
    label = f"Conv {node.name}"
    form = nhwc_gemm_form(node)
    if form == "matrix":  # the activation is already the [P, C] matrix
        return GemmCall(
            prog.add(x), prog.add(w), d, n_ * oh * ow, co, c, c, c, co, trans_b=True, label=label
        )
    if form == "strided":
        return GemmCall(
            prog.add(x),
            prog.add(w),
            d,
            ow,
            co,
            c,
            sw * c,
            c,
            co,
            trans_b=True,
            batch=n_ * oh,
            stride_a=sh * wd * c,
            stride_b=0,
            stride_d=ow * co,
            label=label,
        )
    col = prog.temp(f"{y.name}::col", (n_ * oh * ow, kk), x.dtype)
    kb = KernelBuilder(f"im2col {node.name}")
    size = im2col_nhwc(node, kb)
    prologue = kb.build(size)
    im2col_nhwc_vector(node, prologue)
    prologue.writes = [col]
    return GemmCall(
        col,
        prog.add(w),
        d,
        n_ * oh * ow,
        co,
        kk,
        kk,
        kk,
        co,
        trans_b=True,
        label=label,
        prologue=prologue,
    )


def library_epilogue(anchor: Node, members: list[Node], prog: Program) -> dict | None:
    """bias (+ residual) (+ Relu/Gelu/Relu6) after a GEMM, as {"bias", "bias_axis", "residual",
    "act"}."""
    out = anchor.outputs[0]
    rows_axis = 1 if anchor.op == "Conv" else None  # conv D is [Co, P]: bias per row (m)
    pat: dict = {"bias": None, "bias_axis": None, "residual": None, "act": None}
    cur, rest = out, list(members)

    def other(node: Node) -> Value | None:
        ins = [v for v in node.inputs if v is not None]
        if len(ins) != 2 or cur not in ins:
            return None
        return ins[1] if ins[0] is cur else ins[0]

    if rest and rest[0].op == "Add" and (v := other(rest[0])) is not None and v.const is not None:
        nd = len(out.shape)
        want_m = rows_axis is not None and v.shape == (1, out.shape[1]) + (1,) * (nd - 2)
        last = (1,) * (len(v.shape) - 1) + (out.shape[-1],)
        want_n = rows_axis is None and len(v.shape) <= nd and tuple(v.shape) == last
        if want_m or want_n:
            pat.update(bias=prog.add(v), bias_axis="m" if want_m else "n")
            cur = rest.pop(0).outputs[0]
    if (
        rest
        and rest[0].op == "Add"
        and (v := other(rest[0])) is not None
        and v.const is None
        and v.shape == out.shape
        and v.dtype == out.dtype
    ):
        pat["residual"] = prog.add(v)
        cur = rest.pop(0).outputs[0]
    # cuBLASLt's GELU epilogue is the tanh approximation, so only that Gelu maps onto it
    if (
        rest
        and rest[0].inputs[0] is cur
        and (
            rest[0].op == "Relu"
            or (rest[0].op == "Gelu" and rest[0].attr("approximate", "none") == "tanh")
        )
    ):
        pat["act"] = rest.pop(0).op.lower()
    elif rest and rest[0].inputs[0] is cur and _relu6(rest[0]):
        pat["act"] = "relu6"  # Clip(0, 6): MobileNet's activation
        rest.pop(0)
    return None if rest else pat


def _relu6(node: Node) -> bool:
    return node.op == "Clip" and node.attr("min") == 0 and node.attr("max") == 6
