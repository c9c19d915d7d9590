"""Cleanup passes: constant folding, dead-code elimination, identity removal."""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import OPS
from ..ops.registry import kind_of
from .passes import register_pass


@register_pass("const_fold")
def const_fold(graph: Graph) -> Graph:
    """Evaluate, with the op's numpy reference, every node whose inputs are all constant."""
    kept = []
    for node in graph.nodes:
        live = [v for v in node.inputs if v is not None]
        evaluate = OPS[node.op].evaluate if node.op in OPS else None
        if live and evaluate and all(v.const is not None for v in live):
            results = evaluate(node, [None if v is None else v.const for v in node.inputs])
            for out, arr in zip(node.outputs, results):
                out.const = np.asarray(arr, dtype=out.dtype, order="C").reshape(out.shape)
                out.producer = None
            continue
        kept.append(node)
    graph.nodes = kept
    return graph


@register_pass("dce")
def dce(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output."""
    needed = {id(v) for v in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if any(id(o) in needed for o in node.outputs):
            kept.append(node)
            needed.update(id(v) for v in node.inputs if v is not None)
    graph.nodes = kept[::-1]
    return graph


@register_pass("drop_identity")
def drop_identity(graph: Graph) -> Graph:
    """Identity (and reshapes to the same shape) just forward their input."""
    outputs = {id(v) for v in graph.outputs}
    kept = []
    for node in graph.nodes:
        x = node.inputs[0] if node.inputs else None
        same = x is not None and node.outputs[0].shape == x.shape
        forwardable = node.op == "Identity" or (kind_of(node.op) == "view" and same)
        if forwardable and id(node.outputs[0]) not in outputs:
            graph.replace_uses(node.outputs[0], x)
            continue
        kept.append(node)
    graph.nodes = kept
    return graph


@register_pass("unit_transpose")
def unit_transpose(graph: Graph) -> Graph:
    """A Transpose that moves only size-1 dims keeps the element order: it becomes a Reshape,
    a view, so no kernel copies it (a decode step's (1, 1, heads, hd) -> (1, heads, 1, hd))."""
    outputs = {id(v) for v in graph.outputs}
    for node in graph.nodes:
        if node.op != "Transpose" or id(node.outputs[0]) in outputs:
            continue
        shape = node.inputs[0].shape
        moved = [p for p in node.attrs["perm"] if shape[p] != 1]
        if moved == sorted(moved):
            node.op, node.attrs = "Reshape", {"shape": list(node.outputs[0].shape)}
    return graph


GEMM_ALIGN = 256  # bytes: the cuda GEMM's pointers are aligned so (exec/cuda/cublaslt.py)


def _contiguous_start(shape: tuple[int, ...], node: Node) -> int | None:
    """The element where a Slice's result starts in its input when that result is one run of
    the input's elements (the dims before the last narrowed one of size 1, steps of 1)."""
    ranges = [range(d) for d in shape]
    axes = node.attrs.get("axes") or list(range(len(node.attrs["starts"])))
    steps = node.attrs.get("steps") or [1] * len(axes)
    for s, e, a, st in zip(node.attrs["starts"], node.attrs["ends"], axes, steps):
        ranges[a % len(shape)] = ranges[a % len(shape)][int(s) : int(e) : int(st)]
    narrowed = [i for i, (r, d) in enumerate(zip(ranges, shape)) if len(r) != d]
    last = narrowed[-1] if narrowed else 0
    if any(len(r) == 0 for r in ranges) or any(len(r) != 1 for r in ranges[:last]):
        return None
    if any(len(r) > 1 and r.step != 1 for r in ranges):  # a whole dim reversed is no run either
        return None
    start, stride = 0, 1
    for r, d in zip(ranges[::-1], shape[::-1]):
        start, stride = start + r.start * stride, stride * d
    return start


def _gemm_reads(users: dict[int, list[Node]], v: Value) -> bool:
    """Whether a GEMM reads ``v`` or a view of it."""
    for u in users.get(id(v), []):
        if kind_of(u.op) == "gemm" or (
            kind_of(u.op) == "view" and _gemm_reads(users, u.outputs[0])
        ):
            return True
    return False


def _viewable(users, v: Value, start: int) -> bool:
    """A view starting at element ``start`` keeps every GEMM operand aligned."""
    return (start * np.dtype(v.dtype).itemsize) % GEMM_ALIGN == 0 or not _gemm_reads(users, v)


@register_pass("slice_view")
def slice_view(graph: Graph) -> Graph:
    """A Slice whose result is a contiguous run of its input is a view at an offset, no kernel
    (the last row of a one-row sequence, a column range of one row)."""
    users, outputs = graph.consumers(), {id(v) for v in graph.outputs}
    for node in graph.nodes:
        if node.op != "Slice" or id(node.outputs[0]) in outputs:
            continue
        start = _contiguous_start(node.inputs[0].shape, node)
        if start is not None and _viewable(users, node.outputs[0], start):
            node.op, node.inputs = "ContiguousSlice", node.inputs[:1]
            node.attrs = {"start": start, "shape": list(node.outputs[0].shape)}
    return graph


@register_pass("merge_matmuls")
def merge_matmuls(graph: Graph) -> Graph:
    """MatMuls of one row by constant matrices of one dtype become one MatMul over the matrices
    side by side, each result a view of a column range (a decode step's q, k and v). Its cost:
    the merged matrices are weights the model's many-row plans lack, so a model with both holds
    two weight arrays; Gemma 3's decoder stores them merged instead (generate/gemma3.py)."""
    users, outputs = graph.consumers(), {id(v) for v in graph.outputs}
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        a, b = (node.inputs + [None, None])[:2] if node.op == "MatMul" else (None, None)
        if b is None or b.const is None or len(b.shape) != 2 or int(np.prod(a.shape[:-1])) != 1:
            continue
        if id(node.outputs[0]) not in outputs:
            groups.setdefault(
                (id(a), np.dtype(b.dtype), np.dtype(node.outputs[0].dtype)), []
            ).append(node)
    for nodes in (g for g in groups.values() if len(g) > 1):
        cuts = np.cumsum([0] + [n.inputs[1].shape[1] for n in nodes])
        if not all(_viewable(users, n.outputs[0], int(c)) for n, c in zip(nodes, cuts)):
            continue
        first, a = nodes[0], nodes[0].inputs[0]
        w = graph.constant(np.concatenate([n.inputs[1].const for n in nodes], 1), "merged_w")
        out = Value(
            graph.fresh_name("merged"), (*a.shape[:-1], int(cuts[-1])), first.outputs[0].dtype
        )
        new = [Node("MatMul", [a, w], [out], {}, first.name, first.opset)]
        new += [Node("ContiguousSlice", [out], n.outputs, {"start": int(c), "shape": list(n.outputs[0].shape)},
                     n.name, n.opset) for n, c in zip(nodes, cuts)]  # fmt: skip
        at, gone = graph.nodes.index(first), {id(n) for n in nodes}
        graph.nodes = [n for n in graph.nodes[:at] if id(n) not in gone] + new + [
            n for n in graph.nodes[at:] if id(n) not in gone]  # fmt: skip
        for n in new:
            n.outputs[0].producer = n
    return graph
