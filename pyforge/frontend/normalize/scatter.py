"""ScatterElements, Scatter, ScatterND: axis made non-negative, the reduction checked, the
shapes of indices and updates checked against data, constant indices range-checked."""

from __future__ import annotations

from ...errors import ShapeError
from ...ir import Node
from ...ops.registry import bad_attr
from ...ops.scatter import REDUCTIONS
from .common import check_const_indices, normalize_axis_attr, normalizes


def _reduction(node: Node) -> str:
    red = node.attrs.get("reduction", "none")  # Scatter and ScatterElements-11 have none
    if red not in REDUCTIONS:
        bad_attr(node, f"reduction {red!r}")
    return red


@normalizes("ScatterElements", "Scatter")
def _scatter_elements_normalize(node: Node) -> None:
    data, idx, upd = node.inputs
    normalize_axis_attr(node)
    a = node.attrs["axis"]
    fits = len(idx.shape) == len(data.shape) and all(
        i <= d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != a
    )
    if idx.shape != upd.shape or not fits:
        raise ShapeError(
            node.op, node.name, f"indices {idx.shape}, updates {upd.shape} for data {data.shape}"
        )
    check_const_indices(node, 1, data.shape[a])
    node.attrs = {"axis": a, "reduction": _reduction(node)}


@normalizes("ScatterND")
def _scatter_nd_normalize(node: Node) -> None:
    data, idx, upd = node.inputs
    k = idx.shape[-1] if idx.shape else 0
    want = (*idx.shape[:-1], *data.shape[k:])
    if not idx.shape or not 1 <= k <= len(data.shape) or tuple(upd.shape) != want:
        raise ShapeError(
            node.op, node.name, f"indices {idx.shape}, updates {upd.shape} for data {data.shape}"
        )
    check_const_indices(node, 1, data.shape[:k])
    node.attrs = {"reduction": _reduction(node)}
