"""Shape and layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Shape, Cast..."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register


def _static_shape_infer(node: Node):
    return [(tuple(node.attrs["shape"]), node.inputs[0].dtype)]


def _reshape_to(node: Node, xs):
    return [np.reshape(xs[0], node.attrs["shape"])]


# -- Reshape ------------------------------------------------------------------------------------

register(
    "Reshape",
    _reshape_to,
    _static_shape_infer,
    const_inputs=(1,),
    kind="view",
    half="follow",
)

# -- Flatten, Squeeze, Unsqueeze: all become Reshape-like nodes with attrs["shape"] --------------

register("Flatten", _reshape_to, _static_shape_infer, kind="view", half="follow")
register(
    "Squeeze",
    _reshape_to,
    _static_shape_infer,
    const_inputs=(1,),
    kind="view",
    half="follow",
)
register(
    "Unsqueeze",
    _reshape_to,
    _static_shape_infer,
    const_inputs=(1,),
    kind="view",
    half="follow",
)

# -- ContiguousSlice: a Slice whose result is one contiguous run of its input (pass slice_view) -


def _contiguous_slice(node: Node, xs):
    start, shape = node.attrs["start"], node.attrs["shape"]
    return [xs[0].reshape(-1)[start : start + int(np.prod(shape))].reshape(shape)]


register(
    "ContiguousSlice", _contiguous_slice, _static_shape_infer, kind="view", half="follow",
    internal=True,
)  # fmt: skip

# -- Transpose ----------------------------------------------------------------------------------

register(
    "Transpose",
    lambda n, xs: [np.transpose(xs[0], n.attrs["perm"])],
    lambda n: [(tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype)],
    kind="injective",
    epilogue=True,
    half="follow",
)

# -- Concat -------------------------------------------------------------------------------------


def _concat_infer(node: Node):
    a = node.attrs["axis"]
    shape = list(node.inputs[0].shape)
    shape[a] = sum(v.shape[a] for v in node.inputs)
    return [(tuple(shape), node.inputs[0].dtype)]


register(
    "Concat",
    lambda n, xs: [np.concatenate(xs, axis=n.attrs["axis"])],
    _concat_infer,
    kind="injective",
    epilogue=True,
    half="follow",
)

# -- ops that are always folded when shapes are static -------------------------------------------


def _shape_eval(node: Node, xs):
    shape = np.array(np.shape(xs[0]), np.int64)
    start, end = node.attrs["start"], node.attr("end")
    return [shape[start:end]]


def _shape_infer(node: Node):
    rank = len(node.inputs[0].shape)
    kept = range(rank)[node.attrs["start"] : node.attr("end")]
    return [((len(kept),), np.dtype(np.int64))]


register("Shape", _shape_eval, _shape_infer, shape_only=True, kind="opaque")
register(
    "Size",
    lambda n, xs: [np.array(np.size(xs[0]), np.int64)],
    lambda n: [((), np.dtype(np.int64))],
    shape_only=True,
    kind="opaque",
)


def _constant_eval(node: Node, xs):
    return [node.attrs["value"]]


def _constant_infer(node: Node):
    value = np.asarray(node.attrs["value"])
    return [(value.shape, value.dtype)]


register("Constant", _constant_eval, _constant_infer, kind="opaque")


def _gather_eval(node: Node, xs):
    data, idx = xs
    axis = node.attrs["axis"]
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return [np.take(data, idx, axis=axis)]


def _gather_infer(node: Node):
    data, idx = node.inputs
    a = node.attrs["axis"]
    return [((*data.shape[:a], *idx.shape, *data.shape[a + 1 :]), data.dtype)]


register("Gather", _gather_eval, _gather_infer, kind="injective", epilogue=True, reads_half=(0,))


register(
    "CastLike",
    lambda n, xs: [xs[0].astype(n.attrs["to"])],
    lambda n: [(n.inputs[0].shape, n.inputs[1].dtype)],
    kind="elementwise",
)

register(
    "Cast",
    lambda n, xs: [xs[0].astype(n.attrs["to"])],
    lambda n: [(n.inputs[0].shape, np.dtype(n.attrs["to"]))],
    kind="elementwise",
)


def _slice_eval(node: Node, xs):
    x = xs[0]
    starts, ends = node.attrs["starts"], node.attrs["ends"]
    axes = node.attrs.get("axes") or list(range(len(starts)))
    steps = node.attrs.get("steps") or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % x.ndim] = slice(int(s), int(e), int(st))
    return [x[tuple(index)]]


def _slice_infer(node: Node):
    x = node.inputs[0]
    starts, ends = node.attrs["starts"], node.attrs["ends"]
    axes = node.attrs.get("axes") or list(range(len(starts)))
    steps = node.attrs.get("steps") or [1] * len(starts)
    shape = list(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        shape[a % len(shape)] = len(range(shape[a % len(shape)])[int(s) : int(e) : int(st)])
    return [(tuple(shape), x.dtype)]


register(
    "Slice",
    _slice_eval,
    _slice_infer,
    const_inputs=(1, 2, 3, 4),
    kind="injective",
    epilogue=True,
    half="follow",
)
