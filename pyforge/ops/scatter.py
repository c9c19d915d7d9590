"""ScatterElements, ScatterND (and the older Scatter): the output is a copy of data with the
updates written, or combined by a reduction, at the places the indices name."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register, same_as_input

# reduction -> the numpy ufunc combining an update into the output (None: the update replaces)
REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _write(node: Node, out: np.ndarray, where: tuple, updates: np.ndarray) -> np.ndarray:
    ufunc = REDUCTIONS[node.attrs["reduction"]]
    if ufunc is None:
        out[where] = updates  # repeated indices: ONNX leaves the winner open, numpy takes the last
    else:
        ufunc.at(out, where, updates)  # unbuffered: every repeated index is combined in
    return out


def _scatter_elements_eval(node: Node, xs):
    data, idx, upd = xs
    a = node.attrs["axis"]
    idx = np.where(idx < 0, idx + data.shape[a], idx)
    where = list(np.indices(idx.shape, sparse=True))
    where[a] = idx
    return [_write(node, data.copy(), tuple(where), upd)]


def _scatter_nd_eval(node: Node, xs):
    data, idx, upd = xs
    k = idx.shape[-1]
    idx = np.where(idx < 0, idx + np.array(data.shape[:k], np.int64), idx)
    where = tuple(idx[..., c] for c in range(k))
    return [_write(node, data.copy(), where, upd)]


# not one output element at a time: a whole-output kernel (copy, then the updates in order)
for _op in ("ScatterElements", "Scatter"):
    register(_op, _scatter_elements_eval, same_as_input(), kind="opaque")
register("ScatterND", _scatter_nd_eval, same_as_input(), kind="opaque", reads_half=(2,))
