"""Index-map and row ops: shape-like inputs (shape, repeats, pads, split, k, depth, axis...) made
attributes, axes made non-negative; Dropout becomes Identity.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import Node
from ...ops.registry import bad_attr, fail, norm_axis
from .common import const_input, normalizes


@normalizes("Expand")
def _expand_normalize(node: Node) -> None:
    shape = [int(d) for d in const_input(node, 1, "shape")]
    node.inputs = node.inputs[:1]
    x = node.inputs[0].shape
    try:
        out = np.broadcast_shapes(tuple(x), tuple(shape))
    except ValueError:
        bad_attr(node, f"cannot expand {x} to {shape}")
    node.attrs = {"shape": [int(d) for d in out]}


@normalizes("Tile")
def _tile_normalize(node: Node) -> None:
    node.attrs = {"repeats": [int(d) for d in const_input(node, 1, "repeats")]}
    node.inputs = node.inputs[:1]
    if len(node.attrs["repeats"]) != len(node.inputs[0].shape):
        bad_attr(node, "repeats length differs from the input rank")


@normalizes("Pad")
def _pad_normalize(node: Node) -> None:
    x = node.inputs[0]
    rank = len(x.shape)
    if node.opset >= 11:
        pads = [int(p) for p in const_input(node, 1, "pads")]
        value = const_input(node, 2, "constant_value", required=False)
        axes = const_input(node, 3, "axes", required=False)
    else:
        pads, value, axes = list(node.attr("pads")), node.attr("value", 0.0), None
    axes = list(range(rank)) if axes is None else [norm_axis(node, int(a), rank) for a in axes]
    full = [0] * (2 * rank)
    for i, a in enumerate(axes):
        full[a], full[a + rank] = pads[i], pads[i + len(axes)]
    mode = node.attrs["mode"]
    if mode not in ("constant", "reflect", "edge", "wrap"):
        bad_attr(node, f"mode {mode!r}")
    if any(p < 0 for p in full):
        fail(node, "negative pads (cropping)")
    # constant_value is optional: torch leaves it out for reflect and edge pads
    value = np.ravel(np.asarray(0.0 if value is None else value))
    node.attrs = {"pads": full, "mode": mode, "value": float(value[0]) if value.size else 0.0}
    node.inputs = node.inputs[:1]


@normalizes("Split")
def _split_normalize(node: Node) -> None:
    x = node.inputs[0]
    axis = norm_axis(node, int(node.attrs["axis"]), len(x.shape))
    split = node.attr("split")
    if node.opset >= 13:
        arr = const_input(node, 1, "split", required=False)
        split = None if arr is None else [int(s) for s in arr]
    n_out = node.attr("num_outputs") or node.attr("n_outputs")
    if split is None:
        n = int(n_out) if n_out else None
        if n is None:
            bad_attr(node, "Split needs split sizes or num_outputs")
        size = -(-x.shape[axis] // n)
        split = [size] * (n - 1) + [x.shape[axis] - size * (n - 1)]
    if sum(split) != x.shape[axis] or any(s < 0 for s in split):
        bad_attr(node, f"split {split} does not cover axis {axis} of {x.shape}")
    node.attrs = {"axis": axis, "split": split}
    node.inputs = node.inputs[:1]


@normalizes("DepthToSpace", "SpaceToDepth")
def _d2s_normalize(node: Node) -> None:
    if len(node.inputs[0].shape) != 4:
        fail(node, "input rank other than 4")
    mode = node.attrs["mode"]
    if mode not in ("DCR", "CRD"):
        bad_attr(node, f"mode {mode!r}")
    b, (_, c, h, w) = int(node.attr("blocksize")), node.inputs[0].shape
    if (node.op == "DepthToSpace" and c % (b * b)) or (
        node.op == "SpaceToDepth" and (h % b or w % b)
    ):
        raise ShapeError(
            node.op, node.name, f"blocksize {b} does not divide {node.inputs[0].shape}"
        )
    node.attrs = {"blocksize": b, "mode": mode}


@normalizes("Trilu")
def _trilu_normalize(node: Node) -> None:
    k = const_input(node, 1, "k", required=False)
    node.attrs = {"k": 0 if k is None else int(np.ravel(k)[0]), "upper": int(node.attrs["upper"])}
    node.inputs = node.inputs[:1]


@normalizes("OneHot")
def _onehot_normalize(node: Node) -> None:
    depth = int(np.ravel(const_input(node, 1, "depth"))[0])
    values = const_input(node, 2, "values")
    rank = len(node.inputs[0].shape) + 1
    node.attrs = {
        "axis": norm_axis(node, int(node.attrs["axis"]), rank),
        "depth": depth,
        "off": values[0].item(),
        "on": values[1].item(),
        "dtype": np.dtype(values.dtype),
    }
    node.inputs = node.inputs[:1]


@normalizes("CumSum")
def _cumsum_normalize(node: Node) -> None:
    axis = int(np.ravel(const_input(node, 1, "axis"))[0])
    node.attrs = {
        "axis": norm_axis(node, axis, len(node.inputs[0].shape)),
        "exclusive": int(node.attrs["exclusive"]),
        "reverse": int(node.attrs["reverse"]),
    }
    node.inputs = node.inputs[:1]


@normalizes("TopK")
def _topk_normalize(node: Node) -> None:
    x = node.inputs[0]
    k = int(np.ravel(const_input(node, 1, "k"))[0]) if node.opset >= 10 else int(node.attr("k"))
    axis = norm_axis(node, int(node.attrs["axis"]), len(x.shape))
    if not 0 <= k <= x.shape[axis]:
        bad_attr(node, f"k={k} out of range for axis {axis} of {x.shape}")
    largest, ordered = int(node.attrs["largest"]), int(node.attrs["sorted"])
    node.attrs = {"k": k, "axis": axis, "largest": largest, "sorted": ordered}
    node.inputs = node.inputs[:1]


@normalizes("Hardmax")
def _hardmax_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    if node.opset < 13:
        fail(node, "opset < 13 (2-d coercion)")
    node.attrs = {"axis": norm_axis(node, int(node.attrs["axis"]), rank)}


@normalizes("Dropout")
def _dropout_normalize(node: Node) -> None:
    training = const_input(node, 2, "training_mode", required=False)
    # before opset 7 an is_test=0 flag asked for training; inference is the identity either way,
    # as ORT runs it
    if training is not None and bool(np.ravel(training)[0]):
        fail(node, "training_mode=1 (random masks)")
    node.inputs = node.inputs[:1]
    node.attrs = {}
    node.op = "Identity"
