"""GatherND: batch_dims checked against the shapes, constant index tuples checked."""

from __future__ import annotations

from ...ir import Node
from ...ops.registry import bad_attr
from .common import check_const_indices, normalizes


@normalizes("GatherND")
def _gathernd_normalize(node: Node) -> None:
    data, ind = node.inputs
    b = int(node.attrs["batch_dims"])
    r = ind.shape[-1] if ind.shape else 0
    if not ind.shape or b + r > len(data.shape) or tuple(ind.shape[:b]) != tuple(data.shape[:b]):
        bad_attr(node, f"indices {ind.shape} do not fit data {data.shape} with batch_dims={b}")
    check_const_indices(node, 1, data.shape[b : b + r])
    node.attrs = {"batch_dims": b}
