"""Index-map and row ops: Expand, Tile, Pad, GatherElements, Split, DepthToSpace, SpaceToDepth,
Trilu, OneHot, CumSum, TopK, Hardmax, Dropout; and ops folded from constants (Range,
ConstantOfShape, EyeLike). Shape-like inputs (repeats, pads, k, axis...) must be constants.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataDependentError, ShapeError
from ..ir import Node
from .registry import fail, register, same_as_input

# -- folded from constant inputs ----------------------------------------------------------------


def _constant_of_shape_eval(node: Node, xs):
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full([int(d) for d in xs[0]], value[0], value.dtype)]


def _const_operands(node: Node) -> list[np.ndarray]:
    """Its inputs' values: its output shape depends on them, so run-time ones are refused."""
    late = [v.name for v in node.inputs if v is not None and v.const is None]
    if late or any(v is None for v in node.inputs):
        detail = "a run-time input sets the output shape"
        raise DataDependentError(node.op, node.name, node.opset, detail, late)
    return [v.const for v in node.inputs]


def _constant_of_shape_infer(node: Node):
    (shape,) = _const_operands(node)
    value = node.attr("value")
    dtype = np.float32 if value is None else np.asarray(value).dtype
    return [(tuple(int(d) for d in shape), np.dtype(dtype))]


def _range(node: Node, start, limit, delta) -> np.ndarray:
    """The spec's ceil((limit - start) / delta) elements start + i * delta, reckoned in double
    as ORT and onnx.reference do (float32 rounding of limit - start can drop the last one)."""
    start, limit, delta = (np.asarray(a).item() for a in (start, limit, delta))
    if not delta:
        raise ShapeError(node.op, node.name, "delta is 0: the range never reaches its limit")
    return start + np.arange(max(int(np.ceil((limit - start) / delta)), 0)) * delta


def _range_infer(node: Node):
    return [(_range(node, *_const_operands(node)).shape, node.inputs[0].dtype)]


register(
    "ConstantOfShape",
    _constant_of_shape_eval,
    _constant_of_shape_infer,
    const_inputs=(0,),
    kind="opaque",
)
register(
    "Range",
    lambda n, xs: [_range(n, *xs).astype(np.result_type(xs[0]))],
    _range_infer,
    const_inputs=(0, 1, 2),
    kind="opaque",
)


def _eyelike_eval(node: Node, xs):
    x = xs[0]
    dtype = node.attr("dtype") if node.attr("dtype") is not None else x.dtype
    return [np.eye(x.shape[0], x.shape[1], k=int(node.attrs["k"]), dtype=dtype)]


def _eyelike_infer(node: Node):
    x = node.inputs[0]
    dtype = node.attr("dtype") if node.attr("dtype") is not None else x.dtype
    return [(x.shape, np.dtype(dtype))]


register("EyeLike", _eyelike_eval, _eyelike_infer, shape_only=True, kind="opaque")

# -- Expand, Tile -------------------------------------------------------------------------------

register(
    "Expand",
    lambda n, xs: [np.broadcast_to(xs[0], n.attrs["shape"]).copy()],
    lambda n: [(tuple(n.attrs["shape"]), n.inputs[0].dtype)],
    const_inputs=(1,),
    kind="injective",
    epilogue=True,
)


register(
    "Tile",
    lambda n, xs: [np.tile(xs[0], n.attrs["repeats"])],
    lambda n: [
        (
            tuple(d * r for d, r in zip(n.inputs[0].shape, n.attrs["repeats"])),
            n.inputs[0].dtype,
        )
    ],
    const_inputs=(1,),
    kind="injective",
    epilogue=True,
)

# -- Pad ----------------------------------------------------------------------------------------


def _pad_eval(node: Node, xs):
    x = xs[0]
    p = node.attrs["pads"]
    widths = [(p[i], p[i + x.ndim]) for i in range(x.ndim)]
    mode = node.attrs["mode"]
    if mode == "constant":
        return [np.pad(x, widths, constant_values=x.dtype.type(node.attrs["value"]))]
    return [np.pad(x, widths, mode=mode)]


def _pad_infer(node: Node):
    x = node.inputs[0]
    p, r = node.attrs["pads"], len(x.shape)
    return [(tuple(d + p[i] + p[i + r] for i, d in enumerate(x.shape)), x.dtype)]


register(
    "Pad",
    _pad_eval,
    _pad_infer,
    const_inputs=(1, 2, 3),
    kind="injective",
    epilogue=True,
)

# -- GatherElements -----------------------------------------------------------------------------


def _gather_elements_eval(node: Node, xs):
    data, idx = xs
    axis = node.attrs["axis"]
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= data.shape[axis]):
        fail(node, f"an index outside [{-data.shape[axis]}, {data.shape[axis]}) on axis {axis}")
    # the indices may be shorter than the data on the other axes: those read its leading part
    data = data[tuple(slice(None) if a == axis else slice(d) for a, d in enumerate(idx.shape))]
    return [np.take_along_axis(data, idx, axis=axis)]


register(
    "GatherElements",
    _gather_elements_eval,
    lambda n: [(n.inputs[1].shape, n.inputs[0].dtype)],
    kind="injective",
    epilogue=True,
)

# -- Split --------------------------------------------------------------------------------------


def _split_eval(node: Node, xs):
    cuts = np.cumsum(node.attrs["split"])[:-1]
    parts = [np.ascontiguousarray(p) for p in np.split(xs[0], cuts, axis=node.attrs["axis"])]
    return parts if "output" not in node.attrs else [parts[node.attrs["output"]]]


def _split_infer(node: Node):
    x, axis = node.inputs[0], node.attrs["axis"]
    outs = [
        (tuple(s if i == axis else d for i, d in enumerate(x.shape)), x.dtype)
        for s in node.attrs["split"]
    ]
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


register(
    "Split",
    _split_eval,
    _split_infer,
    const_inputs=(1,),
    split_outputs=True,
    kind="injective",
    epilogue=True,
)

# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------


def _d2s_eval(node: Node, xs):
    x = xs[0]
    b = node.attrs["blocksize"]
    n, c, h, w = x.shape
    if node.op == "SpaceToDepth":
        y = x.reshape(n, c, h // b, b, w // b, b)
        # DCR: out channel (by, bx, c); CRD: out channel (c, by, bx)
        y = (
            y.transpose(0, 1, 3, 5, 2, 4)
            if node.attrs["mode"] == "CRD"
            else y.transpose(0, 3, 5, 1, 2, 4)
        )
        return [y.reshape(n, c * b * b, h // b, w // b)]
    if node.attrs["mode"] == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


def _d2s_infer(node: Node):
    x, b = node.inputs[0], node.attrs["blocksize"]
    n, c, h, w = x.shape
    if node.op == "SpaceToDepth":
        return [((n, c * b * b, h // b, w // b), x.dtype)]
    return [((n, c // (b * b), h * b, w * b), x.dtype)]


register("DepthToSpace", _d2s_eval, _d2s_infer, kind="injective", epilogue=True)
register("SpaceToDepth", _d2s_eval, _d2s_infer, kind="injective", epilogue=True)

# -- Trilu, OneHot ------------------------------------------------------------------------------


def _trilu_eval(node: Node, xs):
    fn = np.triu if node.attrs["upper"] else np.tril
    return [fn(xs[0], node.attrs["k"])]


register(
    "Trilu",
    _trilu_eval,
    lambda n: [(n.inputs[0].shape, n.inputs[0].dtype)],
    const_inputs=(1,),
    kind="injective",
    epilogue=True,
)


def _onehot_eval(node: Node, xs):
    idx, depth = xs[0].astype(np.int64), node.attrs["depth"]
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.moveaxis(idx[..., None] == np.arange(depth), -1, node.attrs["axis"])
    a = node.attrs
    return [np.where(hot, a["on"], a["off"]).astype(a["dtype"])]


def _onehot_infer(node: Node):
    shape = list(node.inputs[0].shape)
    shape.insert(node.attrs["axis"], node.attrs["depth"])
    return [(tuple(shape), node.attrs["dtype"])]


register(
    "OneHot",
    _onehot_eval,
    _onehot_infer,
    const_inputs=(1, 2),
    kind="injective",
    epilogue=True,
)

# -- CumSum, TopK, Hardmax: one row along an axis per kernel iteration ---------------------------


def _cumsum_eval(node: Node, xs):
    x, a = xs[0], node.attrs["axis"]
    if node.attrs["reverse"]:
        x = np.flip(x, a)
    y = np.cumsum(x, axis=a, dtype=x.dtype)
    if node.attrs["exclusive"]:
        y = np.concatenate([np.zeros_like(np.take(y, [0], a)), np.delete(y, -1, a)], axis=a)
    return [np.flip(y, a) if node.attrs["reverse"] else y]


register(
    "CumSum",
    _cumsum_eval,
    lambda n: [(n.inputs[0].shape, n.inputs[0].dtype)],
    const_inputs=(1,),
    kind="reduce",
    epilogue=True,
)


def _topk_eval(node: Node, xs):
    x, a, k = xs[0], node.attrs["axis"], node.attrs["k"]
    key = -x if node.attrs["largest"] else x
    idx = np.argsort(key, axis=a, kind="stable")  # NaN last
    if node.attrs["largest"] and x.dtype.kind == "f":  # NaN first: it ranks above +inf
        nan_first = np.argsort(~np.isnan(np.take_along_axis(x, idx, a)), axis=a, kind="stable")
        idx = np.take_along_axis(idx, nan_first, a)
    idx = np.take(idx, np.arange(k), axis=a)
    return [np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)]


def _topk_infer(node: Node):
    x, a = node.inputs[0], node.attrs["axis"]
    shape = tuple(node.attrs["k"] if i == a else d for i, d in enumerate(x.shape))
    return [(shape, x.dtype), (shape, np.dtype(np.int64))]


def _topk_part_eval(node: Node, xs):
    outs = _topk_eval(node, xs)
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


def _topk_part_infer(node: Node):
    outs = _topk_infer(node)
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


register(
    "TopK",
    _topk_part_eval,
    _topk_part_infer,
    const_inputs=(1,),
    split_outputs=True,
    kind="reduce",
    epilogue=True,
)


def _hardmax_eval(node: Node, xs):
    x, a = xs[0], node.attrs["axis"]
    idx = np.expand_dims(np.argmax(x, axis=a), a)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis=a)
    return [y]


register(
    "Hardmax",
    _hardmax_eval,
    lambda n: [(n.inputs[0].shape, n.inputs[0].dtype)],
    kind="rows",
    epilogue=True,
)

# -- Dropout: the identity at inference ----------------------------------------------------------

register("Dropout", lambda n, xs: [xs[0]], same_as_input(), const_inputs=(1, 2), kind="view")
