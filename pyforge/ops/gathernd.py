"""GatherND: slices of data picked by index tuples, after ``batch_dims`` shared leading dims."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import bad_attr, check_const_indices, register


def _gathernd_normalize(node: Node) -> None:
    data, ind = node.inputs
    b = int(node.attrs["batch_dims"])
    r = ind.shape[-1] if ind.shape else 0
    if not ind.shape or b + r > len(data.shape) or tuple(ind.shape[:b]) != tuple(data.shape[:b]):
        bad_attr(node, f"indices {ind.shape} do not fit data {data.shape} with batch_dims={b}")
    check_const_indices(node, 1, data.shape[b : b + r])
    node.attrs = {"batch_dims": b}


def _gathernd_infer(node: Node):
    data, ind = node.inputs
    b = node.attrs["batch_dims"]
    return [(tuple(ind.shape[:-1]) + tuple(data.shape[b + ind.shape[-1] :]), data.dtype)]


def _gathernd_eval(node: Node, xs):
    data, ind = xs
    b = node.attrs["batch_dims"]
    r = ind.shape[-1]
    lead = int(np.prod(data.shape[:b]))
    d = data.reshape(lead, *data.shape[b:])
    i = ind.reshape(lead, -1, r)
    i = np.where(i < 0, i + np.array(data.shape[b : b + r]), i)
    out = np.stack([d[k][tuple(i[k].T)] for k in range(lead)])
    return [out.reshape(_gathernd_infer(node)[0][0])]


register(
    "GatherND",
    _gathernd_eval,
    _gathernd_infer,
    _gathernd_normalize,
    kind="injective",
    epilogue=True,
)
