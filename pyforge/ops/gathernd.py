"""GatherND: slices of data picked by index tuples, after ``batch_dims`` shared leading dims."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register


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
    kind="injective",
    epilogue=True,
)
