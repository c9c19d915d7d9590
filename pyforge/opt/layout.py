"""NHWC layout for convolution networks: channels-last activations between convs.

Why: with channels last, a conv is col[P, K] @ W[Co, K]^T, so its bias, residual Add and Relu
are per output column, which cuBLASLt folds into the GEMM (it has no per-row bias); a 1x1
stride-s conv needs no im2col at all (a strided batched GEMM). NCHW values are kept where an op
outside the region needs them, through a Transpose, or a free Reshape when H = W = 1.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from ..ops.registry import flag, kind_of
from .passes import register_pass

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _nhwc_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[p] for p in TO_NHWC)


def _const_nhwc(graph: Graph, v: Value) -> Value | None:
    """A constant operand broadcast against NCHW, re-laid for NHWC (None if it cannot be)."""
    if v.const is None:
        return None
    arr = v.const
    if arr.ndim < 4:
        if arr.size == 1:
            return v
        arr = arr.reshape((1,) * (4 - arr.ndim) + arr.shape)
    if arr.ndim != 4:
        return None
    return graph.constant(np.ascontiguousarray(arr.transpose(TO_NHWC)), "nhwc")


def _to_nhwc(w: np.ndarray) -> tuple[np.ndarray]:
    """A conv weight channels last; a fold, so each new input shape of a model takes the
    arrays its first compile made (ResNet-50: 0.09 s of copies each on a 2-core machine)."""
    return (np.ascontiguousarray(w.transpose(TO_NHWC)),)


@register_pass("nhwc_layout")
def nhwc_layout(graph: Graph) -> Graph:
    twin: dict[int, Value] = {}  # id(NCHW value) -> its NHWC twin
    produced: set[int] = {id(v) for v in graph.inputs}
    out: list[Node] = []

    def to_nhwc(v: Value) -> Value:
        if id(v) not in twin:
            t = Value(graph.fresh_name(v.name + "_nhwc"), _nhwc_shape(v.shape), v.dtype)
            out.append(_node("Transpose", [v], t, {"perm": TO_NHWC}, v.name + "/to_nhwc"))
            twin[id(v)] = t
        return twin[id(v)]

    def need_nchw(v: Value | None) -> None:
        if v is None or v.const is not None or id(v) in produced:
            return
        t = twin[id(v)]
        if v.shape[2:] == (1, 1):  # same bytes in both layouts
            out.append(_node("Reshape", [t], v, {"shape": list(v.shape)}, v.name + "/to_nchw"))
        else:
            out.append(_node("Transpose", [t], v, {"perm": TO_NCHW}, v.name + "/to_nchw"))
        produced.add(id(v))

    for node in graph.nodes:
        x = node.inputs[0] if node.inputs else None
        rank4 = x is not None and len(x.shape) == 4
        if (
            node.op == "Conv"
            and rank4
            and node.attrs.get("group", 1) == 1
            and node.inputs[1].const is not None
            and len(node.inputs) == 2
        ):
            w = node.inputs[1]
            w_nhwc = graph.constant(graph.cache.fold(_to_nhwc, (), (w.const,))[0], "w_nhwc")
            y = node.outputs[0]
            y_t = Value(graph.fresh_name(y.name + "_nhwc"), _nhwc_shape(y.shape), y.dtype)
            out.append(
                _node(flag("Conv", "nhwc"), [to_nhwc(x), w_nhwc], y_t, dict(node.attrs), node.name)
            )
            twin[id(y)] = y_t
            continue
        twin_op = flag(node.op, "nhwc")
        if twin_op and node.op != "Conv" and rank4 and id(x) in twin:
            y = node.outputs[0]
            y_t = Value(graph.fresh_name(y.name + "_nhwc"), _nhwc_shape(y.shape), y.dtype)
            out.append(_node(twin_op, [twin[id(x)]], y_t, dict(node.attrs), node.name))
            twin[id(y)] = y_t
            continue
        if kind_of(node.op) == "elementwise" and len(node.outputs[0].shape) == 4:
            live = [v for v in node.inputs if v is not None and v.const is None]
            if live and all(id(v) in twin for v in live):
                ins = [
                    twin[id(v)] if v.const is None else _const_nhwc(graph, v) for v in node.inputs
                ]
                if all(v is not None for v in ins):
                    y = node.outputs[0]
                    y_t = Value(graph.fresh_name(y.name + "_nhwc"), _nhwc_shape(y.shape), y.dtype)
                    out.append(_node(node.op, ins, y_t, dict(node.attrs), node.name, node.opset))
                    twin[id(y)] = y_t
                    continue
        for v in node.inputs:
            need_nchw(v)
        out.append(node)
        produced.update(id(o) for o in node.outputs)
    for v in graph.outputs:
        need_nchw(v)
    graph.nodes = out
    return graph


def _node(
    op: str, inputs: list[Value], output: Value, attrs: dict, name: str, opset: int = 0
) -> Node:
    node = Node(op, inputs, [output], attrs, name, opset)
    output.producer = node
    return node
