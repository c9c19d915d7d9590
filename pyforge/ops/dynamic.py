"""Ops whose output shape depends on their input data: NonZero, Unique, Compress,
NonMaxSuppression. They fold when their inputs are constants; on run-time inputs the shape rule
raises DataDependentError, and ``compile`` runs the model in stages around the node
(``pyforge/staged.py``), evaluating it on the host with the reference below.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataDependentError
from ..ir import Node
from .registry import register


def _on_host(node: Node):
    detail = "its output shape depends on its input data"
    raise DataDependentError(node.op, node.name, node.opset, detail)


def _nonzero(node: Node, xs):
    return [np.array(np.nonzero(np.atleast_1d(xs[0])), dtype=np.int64)]


def _compress(node: Node, xs):
    x, cond = xs
    axis = node.attrs.get("axis")
    return [np.compress(np.asarray(cond, bool).reshape(-1), x, axis=axis)]


def _unique(node: Node, xs):
    x = xs[0]
    axis = node.attrs.get("axis")
    if axis is None:
        x = x.reshape(-1)
    y, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    if not node.attrs.get("sorted", 1):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        y, first, counts = (
            np.take(y, order, axis=0 if axis is None else axis),
            first[order],
            counts[order],
        )
        inverse = np.argsort(order)[inverse.reshape(-1)]
    i64 = np.int64
    return [y, first.astype(i64), inverse.reshape(-1).astype(i64), counts.astype(i64)]


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(y0, x0, y1, x1) with y0 <= y1 and x0 <= x1, from either of ONNX's two box forms."""
    if center:  # (x_center, y_center, width, height)
        x, y, w, h = boxes.T
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=1)
    y0, x0, y1, x1 = boxes.T
    return np.stack(
        [np.minimum(y0, y1), np.minimum(x0, x1), np.maximum(y0, y1), np.maximum(x0, x1)], 1
    )


def _iou(c: np.ndarray, area: np.ndarray, i, j) -> np.ndarray:
    h = np.minimum(c[i, 2], c[j, 2]) - np.maximum(c[i, 0], c[j, 0])
    w = np.minimum(c[i, 3], c[j, 3]) - np.maximum(c[i, 1], c[j, 1])
    inter = np.where((h > 0) & (w > 0), h * w, 0.0)
    union = area[i] + area[j] - inter
    valid = (inter > 0) & (area[i] > 0) & (area[j] > 0) & (union > 0)
    return np.divide(inter, union, out=np.zeros_like(inter), where=valid)


def _greedy(c, area, keep, max_out: int, iou_max: float, chunk: int = 1 << 20) -> list[int]:
    """Of the boxes ``keep`` (best first), each that no better chosen one overlaps by more than
    ``iou_max``. Only pairs whose y ranges meet can overlap: those are found by sorting on y0
    (in pieces of ``chunk`` pairs), so the loop over ``keep`` reads short lists."""
    c, area, m = c[keep], area[keep], len(keep)
    by_y = np.argsort(c[:, 0], kind="stable")
    ends = np.searchsorted(c[by_y, 0], c[by_y, 2], side="right")
    counts = np.maximum(ends - np.arange(m) - 1, 0)
    firsts = np.cumsum(counts) - counts
    later, better = [], []
    start = 0
    while start < m:
        stop = max(start + 1, int(np.searchsorted(firsts, firsts[start] + chunk)))
        n = counts[start:stop]
        a = np.repeat(np.arange(start, stop), n)
        offsets = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
        i, j = by_y[a], by_y[a + 1 + offsets]  # ranks in keep (0 = best) of each pair
        hit = _iou(c, area, i, j) > iou_max
        later.append(np.maximum(i, j)[hit])
        better.append(np.minimum(i, j)[hit])
        start = stop
    later, better = np.concatenate(later or [[]]), np.concatenate(better or [[]])
    order = np.argsort(later, kind="stable")
    bounds = np.searchsorted(later[order], np.arange(m + 1)).tolist()
    better = better[order].astype(np.int64)
    taken = np.zeros(m, bool)
    chosen: list[int] = []
    for r in range(m):
        if len(chosen) >= max_out:
            break
        lo, hi = bounds[r], bounds[r + 1]
        if lo == hi or not taken[better[lo:hi]].any():
            taken[r] = True
            chosen.append(int(keep[r]))
    return chosen


def _nms(node: Node, xs):
    boxes, scores = xs[0], xs[1]
    rest = [None if a is None or np.size(a) == 0 else np.asarray(a).reshape(-1)[0] for a in xs[2:5]]
    rest += [None] * (3 - len(rest))
    max_out = int(rest[0]) if rest[0] is not None else 0
    iou_max = float(rest[1]) if rest[1] is not None else 0.0
    found = []
    for b in range(scores.shape[0]):
        c = _corners(boxes[b].astype(np.float64), bool(node.attrs.get("center_point_box", 0)))
        area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
        for k in range(scores.shape[1]):
            s = scores[b, k]
            keep = np.arange(len(s)) if rest[2] is None else np.flatnonzero(s > rest[2])
            keep = keep[np.argsort(-s[keep], kind="stable")]  # best first, ties by index
            chosen = _greedy(c, area, keep, max_out, iou_max)
            found += [(b, k, i) for i in chosen]
    return [np.array(found, dtype=np.int64).reshape(-1, 3)]


# every input is needed before a plan exists: they never reach lowering
register("NonZero", _nonzero, _on_host, const_inputs=(0,))
register("Compress", _compress, _on_host, const_inputs=(0, 1))
register("Unique", _unique, _on_host, const_inputs=(0,))
register("NonMaxSuppression", _nms, _on_host, const_inputs=(0, 1, 2, 3, 4))
