"""Lower a fused graph to a Program: tensors plus an ordered list of kernel and GEMM calls."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOperatorError
from ..ir import Graph, Node, Value
from ..ops.registry import kind_of
from . import templates  # noqa: F401  (registers every op's lowering)
from .emit import SPECIALIZE, KernelBuilder, KernelCall, broadcast_strides, type_name
from .implicit_conv import Tile, implicit_conv, workspace_floats
from .program import GemmCall, Program, TensorInfo
from .registry import lowering_for
from .scalar import lit
from .templates.gemm import library_epilogue, nhwc_gemm_form

__all__ = ["GemmCall", "Program", "TensorInfo", "lower_graph"]


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
            value = v.const.reshape(()).item()
            if SPECIALIZE.on or not _layer_specific(v.dtype, value):
                return lit(value, type_name(v.dtype))
            return self.kb.scalar(self.prog.add(v))
        p = self.kb.tensor(self.prog.add(v))
        if v.size == 1:
            at = f"{p}[0]"
        elif tuple(v.shape) == tuple(self.shape):
            self.pointwise.append(v.name)
            at = f"{p}[i]"
        else:  # a read at coordinates (never negative): on the cpu through an unsigned index,
            # as [i] is, or Numba's negative-index wrap keeps LLVM from vectorising the loop
            off = self.kb.offset(broadcast_strides(v.shape, self.shape), self.coords())
            at = self.kb.tmp("b")
            self.kb.emit(f"{at} = {p}[u64({off})]", cuda=f"{at} = {p}[{off}]")
        # float16 is a storage type: widened at the load, rounded once at the store
        return f"f32({at})" if v.dtype == np.float16 else at

    def member(self, node: Node) -> None:
        expr = lowering_for(node, ("scalar",)).emit
        args = [self.load(v) for v in node.inputs if v is not None]
        var = self.kb.tmp()
        self.kb.emit(f"{var} = {expr(node, args, type_name(node.outputs[0].dtype))}")
        self.env[id(node.outputs[0])] = var

    def store(self, outputs: list[Value]) -> None:
        for o in outputs:
            self.kb.emit(f"{self.kb.tensor(self.prog.add(o))}[i] = {self.env[id(o)]}")


def _layer_specific(dtype: np.dtype, value: float) -> bool:
    """Whether a scalar constant is likely one layer's own (a trained scale or shift) rather
    than one of the small round numbers ops are written with (3 and 6 of HardSwish, 2 of a
    square, 0.5): those stay literals, which LLVM can fold (x ** 2 into x * x)."""
    if np.dtype(dtype) not in (np.float32, np.float64) or not np.isfinite(value):
        return False
    if value == int(value) and abs(value) <= 1024:
        return False
    return not (value != 0 and np.log2(abs(value)) == int(np.log2(abs(value))))


def _implicit_conv_step(
    anchor: Node, epilogue: list[Node], in_place: bool, d: str, prog: Program, conv: tuple
) -> KernelCall | None:
    """The conv group as one implicit-GEMM kernel, when asked for and its epilogue is bias /
    residual / Relu (else None: im2col + GEMM)."""
    mode, tile = conv
    y = anchor.outputs[0]
    if mode == "im2col" or anchor.op != "ConvNHWC" or nhwc_gemm_form(anchor) != "im2col":
        return None
    if y.dtype != np.float32 or anchor.inputs[1].const is None:
        return None
    pat = None
    if epilogue:
        pat = library_epilogue(anchor, epilogue, prog) if in_place else None
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
    members: list[Node] = node.group.members
    anchor: Node | None = node.group.anchor
    outs = node.outputs
    epilogue = members[1:] if anchor is not None else members
    shape = members[-1].outputs[0].shape
    label = "+".join(m.op for m in members) + f" {node.name}"
    for v in anchor.inputs if anchor is not None else []:
        if v is not None:
            prog.add(v)  # templates read these by name

    low = lowering_for(anchor, ("element", "rows", "gemm")) if anchor is not None else None
    if low is not None and low.form == "rows":
        kb = KernelBuilder(label)
        n = low.emit(anchor, kb)  # an iteration count, or a whole call (tiled kernels)
        for m in members[1:]:  # fusion's siblings (scatters sharing indices): the same count
            for v in m.inputs:
                if v is not None:
                    prog.add(v)
            if low.emit(m, kb) != n:
                raise ValueError(f"{label}: sibling {m.name!r} iterates differently")
        prog.steps.append(n if isinstance(n, KernelCall) else kb.build(n))
        if prog.steps[-1].workspace:
            ws = prog.temp(f"{anchor.outputs[0].name}::ws", (prog.steps[-1].workspace,), np.float32)
            prog.steps[-1].args.append(("t", ws))
        prog.steps[-1].writes = [prog.add(o) for m in members for o in m.outputs]
        return

    gemm = low is not None and low.form == "gemm"
    kb = KernelBuilder(label)
    ew = _Elementwise(kb, prog, shape)
    stored = outs
    if gemm:
        a_out = anchor.outputs[0]
        in_place = (
            len(epilogue) > 0
            and a_out not in outs
            and len(outs) == 1
            and (outs[0].shape == a_out.shape and outs[0].dtype == a_out.dtype)
            and len(a_out.shape) > 0  # the library epilogue's bias and rows need an axis
        )
        # the GEMM writes its own output; the epilogue kernel stores only what follows it
        stored = [o for o in outs if o is not a_out]
        d = prog.add(outs[0]) if in_place else prog.add(a_out)
        implicit = _implicit_conv_step(anchor, epilogue, in_place, d, prog, conv)
        if implicit is not None:
            prog.steps.append(implicit)
            return
        gemm_call = low.emit(anchor, prog, d)
        prog.steps.append(gemm_call)
        if not epilogue:
            return
        if in_place:
            gemm_call.pattern = library_epilogue(anchor, epilogue, prog)
        if in_place:
            ew.env[id(a_out)] = kb.tmp()
            kb.emit(f"{ew.env[id(a_out)]} = {kb.tensor(d)}[i]")
    elif anchor is not None:
        split = low.rows(anchor) if low.rows else None  # rows form: statistics once per row
        coords = kb.coords(anchor.outputs[0].shape, split=split)
        ew = _Elementwise(kb, prog, shape, coords)
        ew.env[id(anchor.outputs[0])] = low.emit(anchor, kb, coords)
    for m in epilogue:
        ew.member(m)
    ew.store(stored)
    call = kb.build(int(np.prod(shape)))
    call.writes = [o.name for o in stored]
    if gemm:
        gemm_call.epilogue = call  # no in-place reuse: the GEMM writes D before C is read
        return
    call.pointwise_reads = [] if anchor is not None else ew.pointwise
    prog.steps.append(call)


def lower_graph(
    graph: Graph,
    specialize: bool = False,
    conv: str = "im2col",
    conv_tile: str | None = None,
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
        if kind_of(node.op) == "view":
            src = prog.add(node.inputs[0])
            out = node.outputs[0]
            dt = np.dtype(out.dtype)
            at = node.attrs["start"] * dt.itemsize if node.op == "ContiguousSlice" else 0
            prog.tensors[out.name] = TensorInfo(out.shape, dt, alias=src, offset=at)
        elif node.op == "Fused":
            _lower_group(node, prog, conv)
        else:
            raise UnsupportedOperatorError(node.op, node.name, node.opset, "not lowered")
    for v in graph.outputs:
        prog.outputs.append(prog.add(v))
    return prog
