"""Resize and Upsample: ONNX's modes, scales or sizes and roi turned into per-axis tap tables.

Every resized axis becomes a table of source indices and weights per output position (one tap for
nearest, two for linear, four for cubic, more for antialiased downsampling), added to the node as
constant inputs, so one kernel and one numpy reference (``pyforge/ops/resize.py``) serve every
mode.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Node, Value
from ...ops.registry import bad_attr, fail
from .common import const_input, normalizes

_COORD_MODES = {
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
}


_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


def _text(node: Node, key: str, default: str) -> str:
    v = node.attr(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _source_coords(cfg: dict, y: np.ndarray, scale: float, n_in: int, n_out: int, roi):
    """Output positions -> source coordinates (and, for tf_crop_and_resize, the outside mask)."""
    mode, width = cfg["coord"], scale * n_in
    outside = None
    if mode == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        if width == 1:
            x = np.full(n_out, (roi[1] - roi[0]) * (n_in - 1) / 2, np.float64)
        else:
            x = y * (roi[1] - roi[0]) * (n_in - 1) / (width - 1)
        x = x + roi[0] * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        x = n_in / 2 * (1 - n_out / width) + (y + 0.5) / scale - 0.5
    return x, outside


def _nearest_table(cfg: dict, x: np.ndarray, n_in: int):
    """One tap per position, picked as onnx.reference picks it: from the two-pixel window of
    the linear mode (placed from x + 1, so x = 7.000000000000001 may place it as x = 7 does),
    the right pixel at an exact hit, else by nearest_mode."""
    lo = np.floor(x)
    ratio = np.where(x == lo, 1.0, x - lo)
    nm = cfg["nearest"]
    if nm == "legacy":  # opset < 11: floor when upsampling, ceil when downsampling
        idx = np.clip(lo + ((x - lo > 0) & cfg["down"]), 0, n_in - 1).astype(np.int64)
        return idx[:, None], np.ones((len(x), 1))
    up = {
        "round_prefer_floor": ratio > 0.5,
        "round_prefer_ceil": ratio >= 0.5,
        "floor": np.zeros_like(ratio, dtype=bool),
        "ceil": np.ones_like(ratio, dtype=bool),
    }[nm]
    up = up | (ratio == 1.0)
    xp = x + 1
    left = np.floor(xp) - np.where(xp == np.floor(xp), 1, 0) - 1
    idx = np.clip(left + up, 0, n_in - 1).astype(np.int64)
    return idx[:, None], np.ones((len(x), 1))


def _kernel_coeffs(cfg: dict, ratio: np.ndarray, scale: float) -> np.ndarray:
    """(positions, taps) weights of the linear or cubic kernel at fractional offsets ``ratio``."""
    a = cfg["cubic_a"]
    if cfg["antialias"]:
        s = min(scale, 1.0)
        reach = 1 if cfg["mode"] == "linear" else 2
        start = int(np.floor(-reach / s) + 1)
        d = np.abs((np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s)
        if cfg["mode"] == "linear":
            w = np.clip(1 - d, 0, 1)
        else:
            w = np.where(
                d <= 1,
                (a + 2) * d**3 - (a + 3) * d**2 + 1,
                np.where(d < 2, a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a, 0.0),
            )
        return w / w.sum(axis=1, keepdims=True)
    if cfg["mode"] == "linear":
        return np.stack([1 - ratio, ratio], axis=1)
    r, q = ratio, 1 - ratio
    return np.stack(
        [
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * q - (a + 3)) * q * q + 1,
            ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a,
        ],
        axis=1,
    )


def _axis_table(cfg: dict, n_in: int, n_out: int, scale: float, roi):
    """(indices [n_out, taps], weights [n_out, taps], outside mask or None) of one axis."""
    x, outside = _source_coords(cfg, np.arange(n_out, dtype=np.float64), scale, n_in, n_out, roi)
    if cfg["mode"] == "nearest":
        idx, w = _nearest_table(cfg, x, n_in)
        return idx, w, outside
    lo = np.floor(x)
    ratio = np.where(x == lo, 1.0, x - lo)  # an exact hit takes the left neighbour's far tap
    w = _kernel_coeffs(cfg, ratio, scale)
    taps = w.shape[1]
    pad = -(-taps // 2)
    xp = x + pad
    pp = np.floor(xp)
    frac = xp - pp
    start = pp + np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    idx = (start[:, None] + np.arange(taps)[None, :] - pad).astype(np.int64)
    if cfg["exclude_outside"]:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w, outside


def _config(node: Node) -> dict:
    legacy = node.op == "Upsample" or node.opset < 11
    cfg = {
        "mode": _text(node, "mode", "nearest"),
        "coord": "asymmetric"
        if legacy
        else _text(node, "coordinate_transformation_mode", "half_pixel"),
        "nearest": "legacy" if legacy else _text(node, "nearest_mode", "round_prefer_floor"),
        "cubic_a": float(node.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": int(node.attr("exclude_outside", 0)),
        "antialias": int(node.attr("antialias", 0)),
        "extrapolation": float(node.attr("extrapolation_value", 0.0)),
        "policy": _text(node, "keep_aspect_ratio_policy", "stretch"),
    }
    if cfg["mode"] == "bilinear":  # Upsample-7's spelling
        cfg["mode"] = "linear"
    if cfg["mode"] not in ("nearest", "linear", "cubic"):
        fail(node, f"mode={cfg['mode']!r}")
    if cfg["coord"] not in _COORD_MODES:
        fail(node, f"coordinate_transformation_mode={cfg['coord']!r}")
    if not legacy and cfg["nearest"] not in _NEAREST_MODES:
        fail(node, f"nearest_mode={cfg['nearest']!r}")
    if cfg["policy"] not in ("stretch", "not_larger", "not_smaller"):
        fail(node, f"keep_aspect_ratio_policy={cfg['policy']!r}")
    if cfg["antialias"] and cfg["mode"] == "nearest":
        bad_attr(node, "antialias with mode nearest")
    return cfg


def _geometry(node: Node, cfg: dict, shape: tuple[int, ...]):
    """Per-axis (scale, output size, roi pair) over the full rank."""
    r = len(shape)
    if node.op == "Upsample" or node.opset < 11:
        scales = node.attr("scales")
        if scales is None:
            scales = const_input(node, 1, "scales")
        roi, sizes, axes = None, None, None
    else:
        roi = const_input(node, 1, "roi", required=False)
        scales = const_input(node, 2, "scales", required=False)
        sizes = const_input(node, 3, "sizes", required=False)
        axes = node.attr("axes")
    if scales is not None and np.size(scales) == 0:
        scales = None
    if roi is not None and np.size(roi) == 0:
        roi = None
    if (scales is None) == (sizes is None):
        bad_attr(node, "exactly one of scales and sizes must be given")
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    full_roi = [(0.0, 1.0)] * r
    if roi is not None:
        # kept in its own type: ORT and onnx.reference take roi[1] - roi[0] in float32, and an
        # exact source coordinate (1.0, not 1.00000001) decides nearest_mode=ceil
        roi = np.asarray(roi).ravel()
        k = len(axes)
        for i, a in enumerate(axes):
            full_roi[a] = (roi[i], roi[k + i])
    out = list(shape)
    scale = [1.0] * r
    if scales is not None:
        for a, s in zip(axes, np.asarray(scales, np.float32).ravel()):
            scale[a] = float(s)
            out[a] = int(float(s) * shape[a])
    else:
        sz = [int(v) for v in np.asarray(sizes).ravel()]
        for a, s in zip(axes, sz):
            scale[a], out[a] = s / shape[a], s
        if cfg["policy"] != "stretch":
            pick = min if cfg["policy"] == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a], out[a] = s, int(s * shape[a] + 0.5)
    if any(o <= 0 for o in out):
        bad_attr(node, f"empty output shape {out}")
    return axes, scale, out, full_roi


@normalizes("Resize", "Upsample")
def _resize_normalize(node: Node) -> None:
    x = node.inputs[0]
    cfg = _config(node)
    if cfg["mode"] != "nearest" and np.dtype(x.dtype).kind != "f":
        fail(node, f"{cfg['mode']} resize of {np.dtype(x.dtype)}")
    axes, scale, out, roi = _geometry(node, cfg, x.shape)
    tables, resized = [], []
    for a in axes:
        n_in = x.shape[a]
        trivial = math.isclose(scale[a], 1.0) and out[a] == n_in and tuple(roi[a]) == (0, 1)
        if trivial and cfg["coord"] != "tf_crop_and_resize":
            continue
        cfg["down"] = scale[a] < 1
        idx, w, outside = _axis_table(cfg, n_in, out[a], scale[a], roi[a])
        if w.shape[1] == 1 and outside is None and np.array_equal(idx[:, 0], np.arange(n_in)):
            continue
        mask = np.zeros(out[a], np.int64) if outside is None else outside.astype(np.int64)
        base = f"{node.name}::resize{a}"
        wdt = np.float64 if np.dtype(x.dtype) == np.float64 else np.float32
        for part, arr in (("idx", idx), ("w", w.astype(wdt)), ("out", mask)):
            arr = np.asarray(arr, order="C")  # ascontiguousarray would make 0-d arrays 1-d
            tables.append(Value(f"{base}_{part}", arr.shape, arr.dtype, const=arr))
        resized.append((a, int(w.shape[1])))
    node.inputs = [x, *tables]
    node.attrs = {
        "out_shape": out,
        "resized": resized,
        "nearest": int(cfg["mode"] == "nearest"),
        "extrapolate": int(cfg["coord"] == "tf_crop_and_resize"),
        "extrapolation": cfg["extrapolation"],
    }
