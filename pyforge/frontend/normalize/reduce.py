"""Reductions: ``axes`` from the attribute or, from the opset that made it an input, from a constant
input; sorted and non-negative (every axis when none is given), with ``keepdims``.
"""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ...ops.reduce import REDUCE
from ...ops.registry import norm_axis
from .common import const_input, normalizes


@normalizes(*REDUCE)
def _reduce_normalize(node: Node) -> None:
    x = node.inputs[0]
    rank = len(x.shape)
    if node.opset >= REDUCE[node.op][1]:
        arr = const_input(node, 1, "axes", required=False)
        axes = None if arr is None or arr.size == 0 else [int(a) for a in np.ravel(arr)]
        node.inputs = node.inputs[:1]
    else:
        axes = node.attr("axes")
    if axes is None or len(axes) == 0:
        axes = [] if node.attrs["noop_with_empty_axes"] else list(range(rank))
    axes = sorted({norm_axis(node, int(a), rank) for a in axes})
    node.attrs = {"axes": axes, "keepdims": int(node.attrs["keepdims"])}


@normalizes("ArgMax", "ArgMin")
def _arg_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    node.attrs = {
        "axes": [norm_axis(node, int(node.attrs["axis"]), rank)],
        "keepdims": int(node.attrs["keepdims"]),
        "select_last_index": int(node.attrs["select_last_index"]),
    }
