"""RoiAlign and GridSample: attributes made one form across opsets, input shapes checked."""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import Node
from ...ops.registry import bad_attr, fail
from .common import normalizes


def _check(node: Node, ok: bool, what: str) -> None:
    if not ok:
        shapes = [v.shape for v in node.inputs if v is not None]
        raise ShapeError(node.op, node.name, f"{what}; input shapes {shapes}")


@normalizes("RoiAlign")
def _roi_align_normalize(node: Node) -> None:
    x, rois, batch = node.inputs
    ok = len(x.shape) == 4 and len(rois.shape) == 2 and rois.shape[1] == 4
    _check(node, ok and tuple(batch.shape) == rois.shape[:1], "want X (N, C, H, W), rois (R, 4)")
    if x.dtype.kind != "f" or np.dtype(batch.dtype).kind not in "iu":
        fail(node, f"X of type {x.dtype}, batch_indices of type {batch.dtype}")
    a = node.attrs
    coord = a.get("coordinate_transformation_mode", "half_pixel") if node.opset >= 16 else ""
    if a["mode"] not in ("avg", "max") or coord not in ("", "half_pixel", "output_half_pixel"):
        bad_attr(node, f"mode {a['mode']!r}, coordinate_transformation_mode {coord!r}")
    oh, ow, ratio = (int(a[k]) for k in ("output_height", "output_width", "sampling_ratio"))
    if min(oh, ow) < 1 or ratio < 0:
        bad_attr(node, f"output size {oh} x {ow}, sampling_ratio {ratio}")
    half, scale = coord == "half_pixel", float(a["spatial_scale"])
    node.attrs = dict(oh=oh, ow=ow, ratio=ratio, mode=a["mode"], half=half, scale=scale)


_MODES = dict(bilinear="linear", bicubic="cubic", nearest="nearest", linear="linear", cubic="cubic")


@normalizes("GridSample")
def _grid_sample_normalize(node: Node) -> None:
    (x, grid), rank = node.inputs, len(node.inputs[0].shape)
    _check(node, rank >= 3 and (rank == 4 or node.opset >= 20), "X must be 4-d (N-d from opset 20)")
    want = (x.shape[0], *grid.shape[1:-1], rank - 2)
    _check(node, len(grid.shape) == rank and tuple(grid.shape) == want, "grid must be (N, ..., r)")
    if x.dtype.kind != "f" or grid.dtype.kind != "f":
        fail(node, f"X of type {x.dtype}, grid of type {grid.dtype}")
    a = node.attrs
    mode = _MODES.get(a["mode"])
    if mode is None or a["padding_mode"] not in ("zeros", "border", "reflection"):
        bad_attr(node, f"mode {a['mode']!r}, padding_mode {a['padding_mode']!r}")
    if mode == "cubic" and rank != 4:
        fail(node, "cubic mode on a volumetric input (ORT refuses it too)")
    node.attrs = {"mode": mode, "padding": a["padding_mode"], "align": int(a["align_corners"])}
