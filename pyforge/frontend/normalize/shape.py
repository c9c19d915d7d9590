"""Shape and layout ops: Reshape's shape, Squeeze's and Unsqueeze's axes, Slice's starts... made
attributes; Flatten, Squeeze and Unsqueeze become a target shape; CastLike becomes Cast.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import Node
from ...ops.registry import bad_attr, norm_axis
from .common import const_input, normalizes, take_const_inputs


@normalizes("Reshape")
def _reshape_normalize(node: Node) -> None:
    x = node.inputs[0]
    target = list(node.attr("shape") or []) if node.opset < 5 else None
    if target is None:
        target = [int(d) for d in const_input(node, 1, "shape")]
        node.inputs = node.inputs[:1]
    allowzero = node.attrs.pop("allowzero", 0)
    shape = [x.shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(target)]
    if shape.count(-1) > 1:
        bad_attr(node, f"more than one -1 in shape {target}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        if known == 0 or x.size % known:
            raise ShapeError(node.op, node.name, f"cannot reshape {x.shape} to {target}")
        shape[shape.index(-1)] = x.size // known
    if int(np.prod(shape)) != x.size:
        raise ShapeError(node.op, node.name, f"cannot reshape {x.shape} to {target}")
    node.attrs = {"shape": shape}


@normalizes("Flatten")
def _flatten_normalize(node: Node) -> None:
    x = node.inputs[0]
    axis = int(node.attr("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    if not 0 <= axis <= len(x.shape):
        bad_attr(node, f"axis {axis} out of range for rank {len(x.shape)}")
    node.attrs = {"shape": [int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))]}


def _axes(node: Node) -> list[int] | None:
    if node.opset >= 13 and len(node.inputs) > 1:
        arr = const_input(node, 1, "axes", required=False)
        node.inputs = node.inputs[:1]
        return None if arr is None else [int(a) for a in np.ravel(arr)]
    axes = node.attr("axes")
    return None if axes is None else list(axes)


@normalizes("Squeeze")
def _squeeze_normalize(node: Node) -> None:
    x = node.inputs[0]
    axes = _axes(node)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = [norm_axis(node, a, len(x.shape)) for a in axes]
    if any(x.shape[a] != 1 for a in axes):
        raise ShapeError(node.op, node.name, f"cannot squeeze axes {axes} of {x.shape}")
    node.attrs = {"shape": [d for i, d in enumerate(x.shape) if i not in axes]}


@normalizes("Unsqueeze")
def _unsqueeze_normalize(node: Node) -> None:
    x = node.inputs[0]
    axes = _axes(node)
    if axes is None:
        bad_attr(node, "Unsqueeze needs axes")
    rank = len(x.shape) + len(axes)
    axes = sorted(norm_axis(node, a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    node.attrs = {"shape": shape}


@normalizes("Transpose")
def _transpose_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    perm = node.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [norm_axis(node, p, rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        bad_attr(node, f"perm {perm} is not a permutation of {rank} axes")
    node.attrs = {"perm": perm}


@normalizes("Concat")
def _concat_normalize(node: Node) -> None:
    xs = [v for v in node.inputs if v is not None]
    rank = len(xs[0].shape)
    axis = norm_axis(node, int(node.attr("axis", 0 if node.opset < 4 else None) or 0), rank)
    for v in xs[1:]:
        if len(v.shape) != rank or any(
            a != b for i, (a, b) in enumerate(zip(v.shape, xs[0].shape)) if i != axis
        ):
            raise ShapeError(node.op, node.name, f"cannot concatenate {xs[0].shape} and {v.shape}")
    node.inputs = xs
    node.attrs = {"axis": axis}


@normalizes("Cast")
def _cast_normalize(node: Node) -> None:
    node.attrs = {"to": np.dtype(node.attrs["to"])}


@normalizes("CastLike")
def _castlike_normalize(node: Node) -> None:
    node.attrs = {"to": np.dtype(node.inputs[1].dtype)}
    node.inputs = node.inputs[:1]
    node.op = "Cast"


@normalizes("Slice")
def _slice_normalize(node: Node) -> None:
    if node.opset >= 10:
        take_const_inputs(node, ["starts", "ends", "axes", "steps"])
