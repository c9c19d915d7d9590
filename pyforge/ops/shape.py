"""Shape and layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Shape, Cast..."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir import Node
from .registry import (
    bad_attr,
    const_input,
    norm_axis,
    normalize_gather,
    register,
    take_const_inputs,
)


def _static_shape_infer(node: Node):
    return [(tuple(node.attrs["shape"]), node.inputs[0].dtype)]


def _reshape_to(node: Node, xs):
    return [np.reshape(xs[0], node.attrs["shape"])]


# -- Reshape ------------------------------------------------------------------------------------


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


register(
    "Reshape",
    _reshape_to,
    _static_shape_infer,
    _reshape_normalize,
    const_inputs=(1,),
    kind="view",
    half="follow",
)

# -- Flatten, Squeeze, Unsqueeze: all become Reshape-like nodes with attrs["shape"] --------------


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


def _squeeze_normalize(node: Node) -> None:
    x = node.inputs[0]
    axes = _axes(node)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = [norm_axis(node, a, len(x.shape)) for a in axes]
    if any(x.shape[a] != 1 for a in axes):
        raise ShapeError(node.op, node.name, f"cannot squeeze axes {axes} of {x.shape}")
    node.attrs = {"shape": [d for i, d in enumerate(x.shape) if i not in axes]}


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


register(
    "Flatten", _reshape_to, _static_shape_infer, _flatten_normalize, kind="view", half="follow"
)
register(
    "Squeeze",
    _reshape_to,
    _static_shape_infer,
    _squeeze_normalize,
    const_inputs=(1,),
    kind="view",
    half="follow",
)
register(
    "Unsqueeze",
    _reshape_to,
    _static_shape_infer,
    _unsqueeze_normalize,
    const_inputs=(1,),
    kind="view",
    half="follow",
)

# -- Transpose ----------------------------------------------------------------------------------


def _transpose_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    perm = node.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [norm_axis(node, p, rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        bad_attr(node, f"perm {perm} is not a permutation of {rank} axes")
    node.attrs = {"perm": perm}


register(
    "Transpose",
    lambda n, xs: [np.transpose(xs[0], n.attrs["perm"])],
    lambda n: [(tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype)],
    _transpose_normalize,
    kind="injective",
    epilogue=True,
    half="follow",
)

# -- Concat -------------------------------------------------------------------------------------


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


def _concat_infer(node: Node):
    a = node.attrs["axis"]
    shape = list(node.inputs[0].shape)
    shape[a] = sum(v.shape[a] for v in node.inputs)
    return [(tuple(shape), node.inputs[0].dtype)]


register(
    "Concat",
    lambda n, xs: [np.concatenate(xs, axis=n.attrs["axis"])],
    _concat_infer,
    _concat_normalize,
    kind="injective",
    epilogue=True,
    half="follow",
)

# -- ops that are always folded when shapes are static -------------------------------------------


def _shape_eval(node: Node, xs):
    shape = np.array(np.shape(xs[0]), np.int64)
    start, end = node.attrs["start"], node.attr("end")
    return [shape[start:end]]


register("Shape", _shape_eval, shape_only=True, kind="opaque")
register("Size", lambda n, xs: [np.array(np.size(xs[0]), np.int64)], shape_only=True, kind="opaque")


def _constant_eval(node: Node, xs):
    return [node.attrs["value"]]


register("Constant", _constant_eval, kind="opaque")


def _gather_eval(node: Node, xs):
    data, idx = xs
    axis = node.attrs["axis"]
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return [np.take(data, idx, axis=axis)]


register("Gather", _gather_eval, None, normalize_gather, kind="injective", epilogue=True)


def _cast_normalize(node: Node) -> None:
    node.attrs = {"to": np.dtype(node.attrs["to"])}


def _castlike_normalize(node: Node) -> None:
    node.attrs = {"to": np.dtype(node.inputs[1].dtype)}
    node.inputs = node.inputs[:1]
    node.op = "Cast"


register(
    "CastLike",
    lambda n, xs: [xs[0].astype(n.attrs["to"])],
    None,
    _castlike_normalize,
    kind="elementwise",
)

register(
    "Cast",
    lambda n, xs: [xs[0].astype(n.attrs["to"])],
    lambda n: [(n.inputs[0].shape, np.dtype(n.attrs["to"]))],
    _cast_normalize,
    kind="elementwise",
)


def _slice_normalize(node: Node) -> None:
    if node.opset >= 10:
        take_const_inputs(node, ["starts", "ends", "axes", "steps"])


def _slice_eval(node: Node, xs):
    x = xs[0]
    starts, ends = node.attrs["starts"], node.attrs["ends"]
    axes = node.attrs.get("axes") or list(range(len(starts)))
    steps = node.attrs.get("steps") or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % x.ndim] = slice(int(s), int(e), int(st))
    return [x[tuple(index)]]


register(
    "Slice",
    _slice_eval,
    None,
    _slice_normalize,
    const_inputs=(1, 2, 3, 4),
    kind="injective",
    epilogue=True,
)
