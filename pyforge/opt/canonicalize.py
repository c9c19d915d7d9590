"""Canonical forms the later passes rely on: BN folded or split, biases split off GEMM anchors."""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from .passes import register_pass


def _single_consumer(graph: Graph, v: Value, users: dict[int, list[Node]] | None = None) -> bool:
    users = (graph.consumers() if users is None else users).get(id(v), [])
    return len(users) == 1 and all(o is not v for o in graph.outputs)


@register_pass("bn_fold")
def bn_fold(graph: Graph) -> Graph:
    """Fold inference BatchNormalization into the preceding Conv; otherwise make it Mul + Add.
    One with a run-time scale, bias, mean or var stays (lower_numba/templates/norm.py)."""
    kept: list[Node] = []
    users = graph.consumers()  # kept up to date below: one walk of the graph, not one per BN
    for node in graph.nodes:
        if node.op != "BatchNormalization":
            kept.append(node)
            continue
        x, scale, bias, mean, var = node.inputs
        if any(v.const is None for v in (scale, bias, mean, var)):
            kept.append(node)  # statistics known only at run time: its own element template
            continue
        stats = (scale.const, bias.const, mean.const, var.const)
        dtype = np.dtype(x.dtype)
        k, shift = graph.cache.fold(_bn_scale_shift, (node.attrs["epsilon"], dtype), stats)
        conv = x.producer
        if (
            conv is not None
            and conv.op == "Conv"
            and conv.inputs[1].const is not None
            and (len(conv.inputs) < 3 or conv.inputs[2] is None or conv.inputs[2].const is not None)
            and _single_consumer(graph, x, users)
        ):
            wb = [v.const for v in conv.inputs[1:] if v is not None]  # weight, maybe a bias
            new_w, new_b = graph.cache.fold(_bn_into_conv, (dtype,), (k, shift, *wb))
            conv.inputs = [conv.inputs[0], graph.constant(new_w, "w"), graph.constant(new_b, "b")]
            graph.replace_uses(node.outputs[0], x)
            users[id(x)] = users.pop(id(node.outputs[0]), [])  # x's one reader was this BN
            x.name, node.outputs[0].name = node.outputs[0].name, x.name  # keep the user's name
            continue
        shape = (1, -1) + (1,) * (len(x.shape) - 2)
        mid = Value(graph.fresh_name(node.name + "_scaled"), x.shape, x.dtype)
        mul = Node("Mul", [x, graph.constant(k.reshape(shape))], [mid], {}, node.name + "/mul", 14)
        add = Node(
            "Add", [mid, graph.constant(shift.reshape(shape))], node.outputs, {}, node.name, 14
        )
        mid.producer, node.outputs[0].producer = mul, add
        kept += [mul, add]
    graph.nodes = kept
    return graph


def _bn_scale_shift(eps: float, dtype: np.dtype, scale, bias, mean, var) -> tuple:
    k = (scale / np.sqrt(var + eps)).astype(dtype)
    return k, (bias - mean * k).astype(dtype)


def _bn_into_conv(dtype: np.dtype, k, shift, w, b=0) -> tuple:
    new_w = (w * k.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
    return new_w, (b * k + shift).astype(dtype)


@register_pass("split_bias")
def split_bias(graph: Graph) -> Graph:
    """Conv/Gemm biases become an explicit Add, so fusion treats them like any epilogue op."""
    out: list[Node] = []
    for node in graph.nodes:
        out.append(node)
        if node.op == "Conv" and len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = node.inputs[2]
            shape = (1, bias.shape[0]) + (1,) * (len(node.outputs[0].shape) - 2)
            if bias.const is not None:
                bias_b = graph.constant(bias.const.reshape(shape), "bias")
            else:  # a run-time bias: a free reshape (a view) lines it up with the channels
                bias_b = Value(graph.fresh_name(bias.name + "_nc11"), shape, bias.dtype)
                view = Node(
                    "Reshape",
                    [bias],
                    [bias_b],
                    {"shape": list(shape)},
                    node.name + "/bias_view",
                    14,
                )
                bias_b.producer = view
                out.insert(len(out) - 1, view)
        elif node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
            c = node.inputs[2]
            beta = node.attrs["beta"]
            if beta == 0:
                node.inputs = node.inputs[:2]
                continue
            if beta != 1 and c.const is not None:
                bias_b = graph.constant((c.const * beta).astype(c.dtype), "gemm_c")
            elif beta == 1:
                bias_b = c
            else:
                continue  # run-time C with beta != 1 stays inside the Gemm node
            node.attrs["beta"] = 1.0
        else:
            continue
        y = node.outputs[0]
        mid = Value(graph.fresh_name(node.name + "_nobias"), y.shape, y.dtype)
        node.inputs = node.inputs[:2]
        node.outputs = [mid]
        mid.producer = node
        add = Node("Add", [mid, bias_b], [y], {}, node.name + "/bias", 14)
        y.producer = add
        out.append(add)
    graph.nodes = out
    return graph


@register_pass("conv_dead_taps")
def conv_dead_taps(graph: Graph) -> Graph:
    """A Conv's kernel rows and columns that read only zero padding at every output position
    are cut from its weight, the pads shrunk to match (same output, fewer FLOPs): an atrous
    conv of dilation 36 on a 14x14 map (DeepLabV3's ASPP) reads the image with its centre tap
    alone and becomes a 1x1. Taps are cut only when surely dead (the output's span of input
    positions misses the image) and only where the new pads stay ≥ 0."""
    for node in graph.nodes:
        if node.op != "Conv" or node.inputs[1].const is None:
            continue
        x, w = node.inputs[0], node.inputs[1].const
        a = node.attrs
        nd, spatial = len(a["kernel_shape"]), x.shape[2:]
        if not all(isinstance(n, int) for n in (*spatial, *node.outputs[0].shape[2:])):
            continue
        live = [_live_taps(spatial[i], node.outputs[0].shape[2 + i], a["kernel_shape"][i],
                           a["strides"][i], a["dilations"][i], a["pads"][i]) for i in range(nd)]  # fmt: skip
        if None in live or all(k1 - k0 + 1 == k for (k0, k1), k in zip(live, a["kernel_shape"])):
            continue  # no tap meets the image (left whole), or every tap does
        pads = list(a["pads"])
        for i, ((k0, k1), k) in enumerate(zip(live, a["kernel_shape"])):
            pads[i] -= k0 * a["dilations"][i]
            pads[nd + i] -= (k - 1 - k1) * a["dilations"][i]
        if min(pads) < 0:
            continue
        cut = w[(slice(None), slice(None), *(slice(k0, k1 + 1) for k0, k1 in live))]
        node.inputs = [x, graph.constant(np.ascontiguousarray(cut), "w"), *node.inputs[2:]]
        a["kernel_shape"] = [k1 - k0 + 1 for k0, k1 in live]
        a["dilations"] = [1 if k == 1 else d for k, d in zip(a["kernel_shape"], a["dilations"])]
        a["pads"] = pads
    return graph


def _live_taps(size: int, out: int, k: int, stride: int, dilation: int, begin: int):
    """(first, last) tap along one axis whose input positions, over every output position,
    meet the image [0, size), or None where none does."""
    taps = [t for t in range(k) if t * dilation - begin <= size - 1
            and (out - 1) * stride - begin + t * dilation >= 0]  # fmt: skip
    return (taps[0], taps[-1]) if taps else None
