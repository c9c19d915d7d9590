"""Lower a fused graph to a Program: tensors plus an ordered list of kernel and GEMM calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedOperatorError
from ..frontend.ops_shape import VIEW_OPS
from ..ir import Graph, Node, Value
from .emit import SPECIALIZE, KernelBuilder, KernelCall, broadcast_strides, type_name
from .implicit_conv import Tile, implicit_conv, workspace_floats
from .scalar import SCALAR, lit
from .templates import ELEMENT_TEMPLATES, ROW_TEMPLATES, _spatial2d, _window2d, im2col
from .templates_nhwc import im2col_nhwc, im2col_nhwc_vector

GEMM_OPS = {"Gemm", "MatMul", "Conv", "ConvNHWC"}


@dataclass
class GemmCall:
    """Row-major strided-batched D[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]."""

    a: str
    b: str
    d: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_d: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    c: str | None = None
    ldc: int = 0
    stride_c: int = 0
    label: str = ""
    prologue: KernelCall | None = None  # im2col, run before the GEMM
    epilogue: KernelCall | None = None  # the fused elementwise epilogue, in place on D
    # the epilogue as BLAS-library terms (bias vector, residual C, activation) when it is exactly
    # expressible so; a target whose GEMM library has such epilogues may skip the kernel
    pattern: dict | None = None
    # a dense NCHW conv's geometry (im2col "x" -> "col"): lets a target run its own im2col in
    # place of the generic prologue kernel (the cpu target's row-copy im2col)
    conv: dict | None = None


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    const: np.ndarray | None = None
    alias: str | None = None  # a view: same bytes as this tensor


@dataclass
class Program:
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    steps: list[KernelCall | GemmCall] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def add(self, v: Value) -> str:
        if v.name not in self.tensors:
            self.tensors[v.name] = TensorInfo(v.shape, np.dtype(v.dtype), v.const)
        return v.name

    def temp(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> str:
        self.tensors[name] = TensorInfo(tuple(shape), np.dtype(dtype))
        return name


class _Elementwise:
    """Emits member expressions into a KernelBuilder, loading inputs at output coordinates."""

    def __init__(self, kb: KernelBuilder, prog: Program, shape: tuple[int, ...], coords=None):
        self.kb, self.prog, self.shape = kb, prog, shape
        self.env: dict[int, str] = {}
        self.pointwise: list[str] = []
        self._coords = coords

    def coords(self) -> list[str]:
        if self._coords is None:
            self._coords = self.kb.coords(self.shape)
        return self._coords

    def load(self, v: Value) -> str:
        if id(v) in self.env:
            return self.env[id(v)]
        if v.const is not None and v.size == 1:
            return lit(v.const.reshape(()).item(), type_name(v.dtype))
        p = self.kb.tensor(self.prog.add(v))
        if v.size == 1:
            return f"{p}[0]"
        if tuple(v.shape) == tuple(self.shape):
            self.pointwise.append(v.name)
            return f"{p}[i]"
        return f"{p}[{self.kb.offset(broadcast_strides(v.shape, self.shape), self.coords())}]"

    def member(self, node: Node) -> None:
        if node.op not in SCALAR:
            raise UnsupportedOperatorError(node.op, node.name, node.opset, "no scalar lowering")
        args = [self.load(v) for v in node.inputs if v is not None]
        var = self.kb.tmp()
        self.kb.emit(f"{var} = {SCALAR[node.op](node, args, type_name(node.outputs[0].dtype))}")
        self.env[id(node.outputs[0])] = var

    def store(self, outputs: list[Value]) -> None:
        for o in outputs:
            self.kb.emit(f"{self.kb.tensor(self.prog.add(o))}[i] = {self.env[id(o)]}")


def _gemm_for(node: Node, prog: Program, d: str) -> GemmCall:
    """The GEMM (with an im2col prologue for non-pointwise convs) computing the anchor into d."""
    call = _gemm_call(node, prog, d)
    call.label = call.label or f"{node.op} {node.name}"
    return call


def _gemm_call(node: Node, prog: Program, d: str) -> GemmCall:
    a, b = node.inputs[0], node.inputs[1]
    if node.op == "Gemm":
        at, bt = bool(node.attrs["transA"]), bool(node.attrs["transB"])
        m, k = (a.shape[1], a.shape[0]) if at else a.shape
        n = b.shape[0] if bt else b.shape[1]
        call = GemmCall(prog.add(a), prog.add(b), d, m, n, k, a.shape[1], b.shape[1], n, at, bt)
        call.alpha = node.attrs["alpha"]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            c = node.inputs[2]
            if tuple(c.shape) != (m, n):
                raise UnsupportedOperatorError(
                    node.op, node.name, node.opset, "run-time C needing broadcast"
                )
            call.c, call.ldc, call.beta = prog.add(c), n, node.attrs["beta"]
        return call
    if node.op == "MatMul":
        sa, sb = a.shape, b.shape
        k = sa[-1]
        n = 1 if len(sb) == 1 else sb[-1]
        ldb = 1 if len(sb) == 1 else n
        if len(sb) <= 2:
            m = int(np.prod(sa[:-1])) if len(sa) > 1 else 1
            return GemmCall(prog.add(a), prog.add(b), d, m, n, k, k, ldb, n)
        m = 1 if len(sa) == 1 else sa[-2]
        batch = int(np.prod(sb[:-2]))
        if len(sa) <= 2:
            stride_a = 0
        elif tuple(sa[:-2]) == tuple(sb[:-2]):
            stride_a = m * k
        else:
            raise UnsupportedOperatorError(
                node.op, node.name, node.opset, f"batch broadcast {sa} x {sb}"
            )
        return GemmCall(
            prog.add(a),
            prog.add(b),
            d,
            m,
            n,
            k,
            k,
            n,
            n,
            batch=batch,
            stride_a=stride_a,
            stride_b=k * n,
            stride_d=m * n,
        )
    if node.op == "ConvNHWC":
        return _conv_nhwc(node, prog, d)
    # dense Conv: W[Co, K] @ col[n][K, P] for every image n
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
        (kh, kw), (sh, sw), (dh, dw), pads = _window2d(node)
        (h, w), (oh, ow) = _spatial2d(x.shape), _spatial2d(y.shape)
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


def _nhwc_gemm_form(node: Node) -> str:
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
    form = _nhwc_gemm_form(node)
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


def _library_epilogue(anchor: Node, members: list[Node], prog: Program) -> dict | None:
    """bias (+ residual) (+ Relu/Gelu) after a GEMM, as {"bias", "bias_axis", "residual", "act"}."""
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
    return None if rest else pat


def _implicit_conv_step(
    anchor: Node, epilogue: list[Node], in_place: bool, d: str, prog: Program, conv: tuple
) -> KernelCall | None:
    """The conv group as one implicit-GEMM kernel, when asked for and its epilogue is bias /
    residual / Relu (else None: im2col + GEMM)."""
    mode, tile = conv
    y = anchor.outputs[0]
    if mode == "im2col" or anchor.op != "ConvNHWC" or _nhwc_gemm_form(anchor) != "im2col":
        return None
    if y.dtype != np.float32 or anchor.inputs[1].const is None:
        return None
    pat = None
    if epilogue:
        pat = _library_epilogue(anchor, epilogue, prog) if in_place else None
        if pat is None or pat["act"] not in (None, "relu"):
            return None
    x, w = prog.add(anchor.inputs[0]), prog.add(anchor.inputs[1])
    call = implicit_conv(anchor, x, w, d, pat, Tile.parse(tile) if tile else None)
    floats = workspace_floats(call)
    if floats:
        (gx, gy, _), _ = call.launch
        ws = prog.temp(f"{d}::ws", (floats,), np.float32)
        cnt = f"{d}::count"
        prog.tensors[cnt] = TensorInfo((gx * gy,), np.dtype(np.int32), np.zeros(gx * gy, np.int32))
        call.args += [("t", ws), ("t", cnt)]
    return call


def _lower_group(node: Node, prog: Program, conv: tuple = ("im2col", None)) -> None:
    members: list[Node] = node.attrs["members"]
    anchor: Node | None = node.attrs["anchor"]
    outs = node.outputs
    epilogue = members[1:] if anchor is not None else members
    shape = members[-1].outputs[0].shape
    label = "+".join(m.op for m in members) + f" {node.name}"
    for v in anchor.inputs if anchor is not None else []:
        if v is not None:
            prog.add(v)  # templates read these by name

    if anchor is not None and anchor.op in ROW_TEMPLATES:
        kb = KernelBuilder(label)
        n = ROW_TEMPLATES[anchor.op](anchor, kb)
        prog.steps.append(kb.build(n))
        prog.steps[-1].writes = [prog.add(anchor.outputs[0])]
        return

    gemm = anchor is not None and anchor.op in GEMM_OPS and anchor.attrs.get("group", 1) == 1
    kb = KernelBuilder(label)
    ew = _Elementwise(kb, prog, shape)
    if gemm:
        a_out = anchor.outputs[0]
        in_place = (
            len(epilogue) > 0
            and a_out not in outs
            and len(outs) == 1
            and (outs[0].shape == a_out.shape and outs[0].dtype == a_out.dtype)
        )
        d = prog.add(outs[0]) if in_place else prog.add(a_out)
        implicit = _implicit_conv_step(anchor, epilogue, in_place, d, prog, conv)
        if implicit is not None:
            prog.steps.append(implicit)
            return
        gemm_call = _gemm_for(anchor, prog, d)
        prog.steps.append(gemm_call)
        if not epilogue:
            return
        if in_place:
            gemm_call.pattern = _library_epilogue(anchor, epilogue, prog)
        if in_place:
            ew.env[id(a_out)] = kb.tmp()
            kb.emit(f"{ew.env[id(a_out)]} = {kb.tensor(d)}[i]")
    elif anchor is not None:
        if anchor.op not in ELEMENT_TEMPLATES:
            raise UnsupportedOperatorError(
                anchor.op, anchor.name, anchor.opset, "no kernel template"
            )
        coords = kb.coords(anchor.outputs[0].shape)
        ew = _Elementwise(kb, prog, shape, coords)
        ew.env[id(anchor.outputs[0])] = ELEMENT_TEMPLATES[anchor.op](anchor, kb, coords)
    for m in epilogue:
        ew.member(m)
    ew.store(outs)
    call = kb.build(int(np.prod(shape)))
    call.writes = [o.name for o in outs]
    if gemm:
        gemm_call.epilogue = call  # no in-place reuse: the GEMM writes D before C is read
        return
    call.pointwise_reads = [] if anchor is not None else ew.pointwise
    prog.steps.append(call)


def lower_graph(
    graph: Graph, specialize: bool = False, conv: str = "im2col", conv_tile: str | None = None
) -> Program:
    """Fused graph -> Program. Every non-view node must be a Fused group by now.

    ``specialize`` bakes shapes into the kernel sources (see emit.SPECIALIZE). ``conv``:
    "im2col" (gather + GEMM) or "implicit" (one implicit-GEMM kernel per channels-last conv
    group that would need the gather; ``conv_tile`` forces its tile, as Tile.parse reads)."""
    if conv not in ("im2col", "implicit"):
        raise ValueError(f"conv={conv!r}: use 'im2col' or 'implicit'")
    with SPECIALIZE(specialize):
        return _lower_graph(graph, (conv, conv_tile))


def _lower_graph(graph: Graph, conv: tuple) -> Program:
    prog = Program()
    for v in graph.inputs:
        prog.inputs.append(prog.add(v))
    for node in graph.nodes:
        if node.op in VIEW_OPS:
            src = prog.add(node.inputs[0])
            out = node.outputs[0]
            prog.tensors[out.name] = TensorInfo(out.shape, np.dtype(out.dtype), alias=src)
        elif node.op == "Fused":
            _lower_group(node, prog, conv)
        else:
            raise UnsupportedOperatorError(node.op, node.name, node.opset, "not lowered")
    for v in graph.outputs:
        prog.outputs.append(prog.add(v))
    _refuse_float16(prog)
    return prog


def _refuse_float16(prog: Program) -> None:
    """Numba has no float16 on cpu (and cuda fp16 is not implemented): refuse now, not at run."""
    for step in prog.steps:
        calls = [step] if isinstance(step, KernelCall) else [step.prologue, step.epilogue]
        for call in calls:
            if call is None:
                continue
            for kind, name in call.args:
                if kind in ("t", "w") and prog.tensors[name].dtype == np.float16:
                    op, _, where = call.label.partition(" ")
                    raise UnsupportedOperatorError(
                        op, where, None, f"float16 tensor {name!r}: no float16 kernels"
                    )
