"""Cleanup passes: constant folding, dead-code elimination, identity removal."""

from __future__ import annotations

import numpy as np

from ..ir import Graph
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
