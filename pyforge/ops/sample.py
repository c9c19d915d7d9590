"""RoiAlign and GridSample, as ORT's cpu kernels compute them: RoiAlign's boxes in float32 (sample
counts are ceilings of float32 quotients), max mode the largest weighted corner; GridSample's
padding applied to each tap, not to the sampled point."""

from __future__ import annotations

import itertools

import numpy as np

from ..ir import Node
from .registry import register

F = np.float32


def roi_box(roi, attrs: dict, axis: int) -> tuple:
    """(start, bin size, samples per bin) along axis 0 (y) or 1 (x) of one box, as ORT."""
    off = F(0.5) if attrs["half"] else F(0)
    scale, bins = F(attrs["scale"]), (attrs["oh"], attrs["ow"])[axis]
    start, end = F(roi[1 - axis]) * scale - off, F(roi[3 - axis]) * scale - off
    size = end - start if attrs["half"] else max(end - start, F(1))
    grid = attrs["ratio"] or int(np.ceil(size / F(bins)))
    return start, size / F(bins), max(grid, 0)


def _roi_axis(start, step, bins: int, grid: int, length: int):
    p = start + np.arange(bins, dtype=F)[:, None] * step
    p = p + (np.arange(grid, dtype=F)[None, :] + F(0.5)) * step / F(grid)
    inside = (p >= -1) & (p <= length)
    low = np.floor(np.maximum(p, 0)).astype(np.int64)
    edge = low >= length - 1
    frac = np.where(edge, 0, np.maximum(p, 0) - low).astype(F)
    low = np.minimum(low, length - 1)
    return low, np.where(edge, low, low + 1), (1 - frac) * inside, frac * inside


def _roi_align_eval(node: Node, xs):
    (x, rois, batch), a = xs, node.attrs
    out = np.zeros((len(rois), x.shape[1], a["oh"], a["ow"]), x.dtype)
    for r, roi in enumerate(rois):
        (y0, sy, gy), (x0, sx, gx) = roi_box(roi, a, 0), roi_box(roi, a, 1)
        if not gy * gx:
            continue
        ys = _roi_axis(y0, sy, a["oh"], gy, x.shape[2])
        xs_ = _roi_axis(x0, sx, a["ow"], gx, x.shape[3])
        corners = [  # (C, oh, samples, ow, samples) per corner: low/high y x low/high x
            wy[None, :, :, None, None] * wx * x[batch[r]][:, iy[:, :, None, None], ix]
            for iy, wy in (ys[0::2], ys[1::2])
            for ix, wx in (xs_[0::2], xs_[1::2])
        ]
        if a["mode"] == "max":
            out[r] = np.max(np.maximum.reduce(corners), axis=(2, 4))
        else:
            out[r] = np.sum(sum(corners), axis=(2, 4)) / F(gy * gx)
    return [out]


def _roi_align_infer(node: Node):
    x, rois = node.inputs[0], node.inputs[1]
    return [((rois.shape[0], x.shape[1], node.attrs["oh"], node.attrs["ow"]), x.dtype)]


register("RoiAlign", _roi_align_eval, _roi_align_infer, kind="window", epilogue=True)


def reflect(i, size: int, align: int):
    """Integer taps folded back into the image by ORT's reflection about its border (the pixel
    edges, or the corner pixels' centres under align_corners): a triangle wave of period p."""
    p = max(2 * size - 2 * align, 1)
    return np.where(i % p < size, i % p, p - 1 + align - i % p)


def cubic_weight(s):
    """Keys' cubic convolution weight at distance s (0 <= s <= 2), a = -0.75."""
    a = -0.75
    return np.where(
        s <= 1, ((a + 2) * s - (a + 3)) * s * s + 1, ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    )


def _taps(node: Node, g, size: int):
    """Per output point of one spatial axis: its taps' indices and weights (tap axis last)."""
    mode, pad, align = node.attrs["mode"], node.attrs["padding"], node.attrs["align"]
    v = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
    v = np.rint(v) if mode == "nearest" else v
    first = np.floor(v) - (mode == "cubic")
    t = np.arange({"nearest": 1, "linear": 2, "cubic": 4}[mode])
    idx, f = first[..., None] + t, (v - np.floor(v))[..., None]
    if mode == "nearest":
        w = np.ones_like(idx)
    elif mode == "linear":
        w = np.where(t == 0, 1 - f, f)
    else:
        w = cubic_weight(np.abs(f + 1 - t))
    if pad == "zeros":
        w = w * ((idx >= 0) & (idx < size))
    elif pad == "reflection":
        idx = reflect(idx.astype(np.int64), size, align)
    return np.clip(idx, 0, size - 1).astype(np.int64), w  # border padding: the clip


def _grid_sample_eval(node: Node, xs):
    x, grid, dims = xs[0], xs[1].astype(np.float64), xs[0].shape[2:]
    taps = [_taps(node, grid[..., len(dims) - 1 - d], size) for d, size in enumerate(dims)]
    n = np.arange(x.shape[0]).reshape((-1,) + (1,) * len(dims))
    y = 0.0
    for pick in itertools.product(*(range(w.shape[-1]) for _, w in taps)):
        w = np.prod([tw[..., k] for (_, tw), k in zip(taps, pick)], axis=0)
        v = x[(n, slice(None), *(ti[..., k] for (ti, _), k in zip(taps, pick)))]
        y = y + np.moveaxis(v, -1, 1) * w[:, None]
    return [np.asarray(y).astype(x.dtype)]


def _grid_sample_infer(node: Node):
    x, grid = node.inputs[0], node.inputs[1]
    return [((*x.shape[:2], *grid.shape[1:-1]), x.dtype)]


register("GridSample", _grid_sample_eval, _grid_sample_infer, kind="injective", epilogue=True)
