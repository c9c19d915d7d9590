"""fp16 storage for ``precision="fp16"``: float32 activations and weights become float16 where
the op is known to keep its accuracy in half precision, with casts at the borders.

Why: a half-precision tensor is half the bytes to move, and cuBLASLt then runs its fp16 tensor
core kernels (accumulating in float32). Kernels still compute in float32: a float16 load is
widened and the result rounded once at the store (see scalar.TYPE_NAMES), so only storage
loses precision.

Which ops: GEMM-like ops run half (their float32 inputs are cast); ops that are safe at any
precision follow their inputs (half when one non-constant input is half); every other op, and
every graph input and output, stays float32, with a Cast wherever a value crosses the border
(but into an op's ``reads_half`` inputs, which its kernel widens at the load).
A constant that does not fit float16 keeps its node in float32. A float32 constant that a half
op reads as well (a tied embedding: the Gather's table is the logits GEMM's weights) is read in
its float16 copy by the ``reads_half`` inputs too, so the weights are held once.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOperatorError
from ..ir import Graph, Node, Value
from ..ops.registry import flag
from .passes import register_pass

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
HALF_MAX = float(np.finfo(np.float16).max)


def _fits_half(arr: np.ndarray) -> bool:
    finite = arr[np.isfinite(arr)]
    return not finite.size or float(np.abs(finite).max()) <= HALF_MAX


class _Casts:
    """Cast nodes made once per (value, dtype), inserted before the first node that needs one."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.made: dict[tuple[int, str], Value] = {}
        self.consts: dict[int, Value] = {}
        self.pending: list[Node] = []  # casts to insert before the node being visited

    def get(self, v: Value, dtype: np.dtype) -> Value:
        if v.const is not None:
            if id(v) not in self.consts:
                self.consts[id(v)] = self.graph.constant(v.const.astype(dtype), f"{v.name}_h")
            return self.consts[id(v)]
        key = (id(v), dtype.str)
        if key not in self.made:
            out = Value(self.graph.fresh_name(f"{v.name}_{dtype.name}"), v.shape, dtype)
            node = Node("Cast", [v], [out], {"to": dtype}, f"cast_{out.name}")
            out.producer = node
            self.pending.append(node)
            self.made[key] = out
        return self.made[key]


def _wants_half(node: Node) -> bool:
    floats = [v for v in node.inputs if v is not None and v.dtype in (F32, F16)]
    if not floats or any(v.const is not None and not _fits_half(v.const) for v in floats):
        return False
    half = flag(node.op, "half")
    if half == "compute":
        return all(v.dtype == F32 for v in node.outputs)
    # every float16 value is one this pass made (a float16 model is refused first)
    return half == "follow" and any(v.dtype == F16 for v in floats)


def _refuse_half_models(graph: Graph) -> None:
    """A model with float16 tensors of its own is refused: its kernels would do float16
    arithmetic, which the cuda kernels do not (see lower._refuse_float16)."""
    for node in graph.nodes:
        for v in node.inputs + node.outputs:
            if v is not None and v.dtype == F16:
                raise UnsupportedOperatorError(
                    node.op,
                    node.name,
                    node.opset,
                    f"float16 tensor {v.name!r} in the model: precision='fp16' converts "
                    "float32 models only",
                )


@register_pass("fp16")
def to_fp16(graph: Graph) -> Graph:
    _refuse_half_models(graph)
    casts = _Casts(graph)
    nodes: list[Node] = []
    for node in graph.nodes:
        half = _wants_half(node)
        for k, v in enumerate(node.inputs):
            if v is None or node.op == "Cast":  # a Cast reads any dtype
                continue
            if half and v.dtype == F32:
                node.inputs[k] = casts.get(v, F16)
            elif not half and v.dtype == F16 and k not in (flag(node.op, "reads_half") or ()):
                node.inputs[k] = casts.get(v, F32)
        if half:
            for out in node.outputs:
                if out.dtype == F32:
                    out.dtype = F16
        nodes += casts.pending + [node]
        casts.pending = []
    graph.nodes = nodes
    for node in nodes:  # the float32 original of a constant with a half copy goes dead (dce)
        for k in flag(node.op, "reads_half") or ():
            v = node.inputs[k] if k < len(node.inputs) else None
            if v is not None and v.dtype == F32 and id(v) in casts.consts:
                node.inputs[k] = casts.consts[id(v)]
    # outputs keep their names and float32: the half value is renamed, the cast takes the name
    for k, v in enumerate(graph.outputs):
        if v.dtype == F16:
            name = v.name
            v.name = graph.fresh_name(f"{name}_f16")
            made = casts.made.get((id(v), F32.str))
            if made is not None:  # a float32 consumer's cast already gives it: take its name
                made.name, graph.outputs[k] = name, made
                continue
            out = Value(name, v.shape, F32)
            node = Node("Cast", [v], [out], {"to": F32}, f"cast_{name}")
            graph.add_node(node)
            graph.outputs[k] = out
    return graph
