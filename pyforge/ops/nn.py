"""Neural-network ops: Conv, BatchNormalization, pooling, Gemm, MatMul, Softmax."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir import Node
from .registry import broadcast_shapes, register, same_as_input

# -- window geometry shared by Conv and the pools -----------------------------------------------


def window_out_shape(node: Node, spatial: tuple[int, ...]) -> tuple[int, ...]:
    k, s, d, p = (node.attrs[a] for a in ("kernel_shape", "strides", "dilations", "pads"))
    nd, pool = len(k), "Pool" in node.op
    out = []
    for i in range(nd):
        span = spatial[i] + p[i] + p[i + nd] - ((k[i] - 1) * d[i] + 1)
        if node.attrs.get("ceil_mode"):  # pools only: a Conv has no ceil mode
            o = -(-span // s[i]) + 1
            if (o - 1) * s[i] >= spatial[i] + p[i]:  # the last window must start inside
                o -= 1
        elif pool:  # ORT's count, C's division: one window where it overhangs by under a stride
            o = int(span / s[i]) + 1
        else:
            o = span // s[i] + 1
        if o < 0 or o == 0 and not pool:  # a pool may be empty, as in ORT
            raise ShapeError(node.op, node.name, f"window larger than padded input {spatial}")
        out.append(o)
    return tuple(out)


def _patches(node: Node, x: np.ndarray, pad_value: float) -> np.ndarray:
    """(N, C, *out, *kernel) view of the padded input, for the numpy references."""
    k, s, d, p = (node.attrs[a] for a in ("kernel_shape", "strides", "dilations", "pads"))
    nd = len(k)
    out = window_out_shape(node, x.shape[2:])
    if 0 in out:  # an empty pool (as ORT gives it): no window to view
        return np.empty((*x.shape[:2], *out, *k), x.dtype)
    extra = [
        max(0, (out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - x.shape[2 + i] - p[i])
        for i in range(nd)
    ]
    widths = [(0, 0), (0, 0)] + [(p[i], max(p[i + nd], extra[i])) for i in range(nd)]
    xp = np.pad(x, widths, constant_values=pad_value)
    win = np.lib.stride_tricks.sliding_window_view(
        xp, [(k[i] - 1) * d[i] + 1 for i in range(nd)], axis=tuple(range(2, 2 + nd))
    )
    sl = (slice(None), slice(None))
    sl += tuple(slice(0, out[i] * s[i], s[i]) for i in range(nd))
    sl += tuple(slice(None, None, d[i]) for i in range(nd))
    return win[sl]


# -- Conv ---------------------------------------------------------------------------------------


def _conv_infer(node: Node):
    x, w = node.inputs[0], node.inputs[1]
    return [((x.shape[0], w.shape[0], *window_out_shape(node, x.shape[2:])), x.dtype)]


def _conv_eval(node: Node, xs):
    x, w = xs[0], xs[1]
    g = node.attrs["group"]
    pat = _patches(node, x, 0.0)  # N, C, *out, *k
    nd = x.ndim - 2
    n, c = x.shape[:2]
    out_sp = pat.shape[2 : 2 + nd]
    pat = pat.reshape(n, g, c // g, *out_sp, *pat.shape[2 + nd :])
    wg = w.reshape(g, w.shape[0] // g, *w.shape[1:])
    sp = "".join("hwdxyz"[:nd])
    ks = "".join("klmopq"[:nd])
    y = np.einsum(f"ngc{sp}{ks},gf c{ks}->ngf{sp}".replace(" ", ""), pat, wg, optimize=True)
    y = y.reshape(n, w.shape[0], *out_sp)
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2].reshape(1, -1, *[1] * nd)
    return [y.astype(x.dtype)]


register(
    "Conv",
    _conv_eval,
    _conv_infer,
    kind="gemm",
    epilogue=True,
    half="compute",
    nhwc="ConvNHWC",
)

# -- pools --------------------------------------------------------------------------------------


def _pool_infer(node: Node):
    x = node.inputs[0]
    return [((*x.shape[:2], *window_out_shape(node, x.shape[2:])), x.dtype)]


def _maxpool_eval(node: Node, xs):
    """NaN as the kernel takes it: dropped unless every tap is NaN, or (stride or dilation
    above 1) the first tap is; ORT and the reference agree on that."""
    x, nd = xs[0], xs[0].ndim - 2
    pat = _patches(node, x, np.nan)
    if pat.size == 0:  # an empty pool
        return [np.empty(pat.shape[: 2 + nd], x.dtype)]
    y = np.fmax.reduce(pat.reshape(*pat.shape[: 2 + nd], -1), axis=-1)
    if any(v != 1 for a in ("strides", "dilations") for v in node.attrs[a]):
        taps = _patches(node, np.ones_like(x, dtype=bool), False)
        taps = taps.reshape(*pat.shape[: 2 + nd], -1)
        first = np.take_along_axis(pat.reshape(taps.shape), taps.argmax(-1)[..., None], -1)
        y = np.where(np.isnan(first[..., 0]), first[..., 0], y)
    return [y.astype(x.dtype)]


def _avgpool_eval(node: Node, xs):
    x = xs[0]
    nd = x.ndim - 2
    axes = tuple(range(-nd, 0))
    s = _patches(node, x, 0.0).sum(axis=axes)
    ones = np.ones((1, 1, *x.shape[2:]), x.dtype)
    if node.attrs["count_include_pad"] and not node.attrs.get("ceil_mode"):
        # every tap counts, also where ORT's one overhanging window (an input shorter than the
        # kernel) reaches past the pads: ORT divides by the kernel size there (fuzzer seed 33533)
        return [(s / np.prod(node.attrs["kernel_shape"])).astype(x.dtype)]
    if node.attrs["count_include_pad"]:
        # explicit pads count, the ceil-mode overhang past them does not
        p = node.attrs["pads"]
        ones = np.pad(
            ones, [(0, 0), (0, 0)] + [(p[i], p[i + nd]) for i in range(nd)], constant_values=1
        )
        node = Node(node.op, [], [], dict(node.attrs, pads=[0] * (2 * nd)), node.name)
    cnt = _patches(node, ones, 0.0).sum(axis=axes)
    return [(s / cnt).astype(x.dtype)]


register(
    "MaxPool",
    _maxpool_eval,
    _pool_infer,
    kind="window",
    epilogue=True,
    half="follow",
    nhwc="MaxPoolNHWC",
)
register(
    "AveragePool",
    _avgpool_eval,
    _pool_infer,
    kind="window",
    epilogue=True,
    half="follow",
    nhwc="AveragePoolNHWC",
)


def _global_infer(node: Node):
    x = node.inputs[0]
    return [((*x.shape[:2], *[1] * (len(x.shape) - 2)), x.dtype)]


register(
    "GlobalAveragePool",
    lambda n, xs: [xs[0].mean(axis=tuple(range(2, xs[0].ndim)), keepdims=True)],
    _global_infer,
    kind="window",
    epilogue=True,
    half="follow",
    nhwc="GlobalAveragePoolNHWC",
)
register(
    "GlobalMaxPool",
    lambda n, xs: [xs[0].max(axis=tuple(range(2, xs[0].ndim)), keepdims=True)],
    _global_infer,
    kind="window",
    epilogue=True,
    half="follow",
    nhwc="GlobalMaxPoolNHWC",
)

# -- BatchNormalization -------------------------------------------------------------------------


def _bn_eval(node: Node, xs):
    x, scale, bias, mean, var = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    k = scale / np.sqrt(var + node.attrs["epsilon"])
    return [(x * k.reshape(shape) + (bias - mean * k).reshape(shape)).astype(x.dtype)]


# per-channel statistics index the channel axis, not numpy's trailing broadcast: an element
# template reads them at each output's channel (constant statistics fold into a Conv first)
register("BatchNormalization", _bn_eval, same_as_input(), kind="injective", epilogue=True)

# -- Gemm and MatMul ----------------------------------------------------------------------------


def _gemm_dims(node: Node) -> tuple[int, int, int]:
    a, b = node.inputs[0], node.inputs[1]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(node.op, node.name, f"Gemm needs 2-d inputs, got {a.shape} and {b.shape}")
    m, ka = a.shape[::-1] if node.attrs["transA"] else a.shape
    kb, n = b.shape[::-1] if node.attrs["transB"] else b.shape
    if ka != kb:
        raise ShapeError(node.op, node.name, f"inner dimensions differ: {a.shape} x {b.shape}")
    return m, n, ka


def _gemm_infer(node: Node):
    m, n, _ = _gemm_dims(node)
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None and broadcast_shapes(node, c.shape, (m, n)) != (m, n):
        raise ShapeError(node.op, node.name, f"C of shape {c.shape} does not broadcast to {(m, n)}")
    return [((m, n), node.inputs[0].dtype)]


def _gemm_eval(node: Node, xs):
    a, b = xs[0], xs[1]
    a = a.T if node.attrs["transA"] else a
    b = b.T if node.attrs["transB"] else b
    y = node.attrs["alpha"] * (a @ b)
    if len(xs) > 2 and xs[2] is not None:
        y = y + node.attrs["beta"] * xs[2]
    return [y.astype(xs[0].dtype)]


register("Gemm", _gemm_eval, _gemm_infer, kind="gemm", epilogue=True, half="compute")


def matmul_shape(node: Node) -> tuple[int, ...]:
    """numpy.matmul's output shape of the first two inputs, or a ShapeError."""
    a, b = node.inputs[:2]
    sa, sb = a.shape, b.shape
    ra = (1,) + sa if len(sa) == 1 else sa
    rb = sb + (1,) if len(sb) == 1 else sb
    if ra[-1] != rb[-2]:
        raise ShapeError(node.op, node.name, f"cannot multiply {sa} by {sb}")
    try:
        batch = np.broadcast_shapes(ra[:-2], rb[:-2])
    except ValueError:
        raise ShapeError(
            node.op, node.name, f"batch dims of {sa} and {sb} do not broadcast"
        ) from None
    out = tuple(batch) + (ra[-2], rb[-1])
    if len(sa) == 1:
        out = out[:-2] + out[-1:]
    if len(sb) == 1:
        out = out[:-1]
    return tuple(int(d) for d in out)


register(
    "MatMul",
    lambda n, xs: [np.matmul(xs[0], xs[1])],
    lambda n: [(matmul_shape(n), n.inputs[0].dtype)],
    kind="gemm",
    epilogue=True,
    half="compute",
)

# -- Softmax family -----------------------------------------------------------------------------


def _softmax_axes(node: Node, ndim: int) -> tuple[int, ...]:
    a = node.attrs["axis"]
    return tuple(range(a, ndim)) if node.attrs["flatten"] else (a,)


def _softmax_eval(node: Node, xs):
    x = xs[0]
    axes = _softmax_axes(node, x.ndim)
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    y = e / e.sum(axis=axes, keepdims=True)
    if node.op == "LogSoftmax":
        y = (x - x.max(axis=axes, keepdims=True)) - np.log(e.sum(axis=axes, keepdims=True))
    return [y.astype(x.dtype)]


register("Softmax", _softmax_eval, same_as_input(), kind="rows")
register("LogSoftmax", _softmax_eval, same_as_input(), kind="rows")

# -- LpPool and ConvTranspose -------------------------------------------------------------------


def _lppool_eval(node: Node, xs):
    x = xs[0]
    nd = x.ndim - 2
    s = (np.abs(_patches(node, x, 0.0)) ** node.attrs["p"]).sum(axis=tuple(range(-nd, 0)))
    return [(s ** (1.0 / node.attrs["p"])).astype(x.dtype)]


register("LpPool", _lppool_eval, _pool_infer, kind="window", epilogue=True)


def _convt_infer(node: Node):
    x, w = node.inputs[0], node.inputs[1]
    co = w.shape[1] * node.attrs["group"]
    return [((x.shape[0], co, *node.attrs["out_shape"]), x.dtype)]


def _convt_eval(node: Node, xs):
    x, w = xs[0], xs[1]
    a = node.attrs
    nd, g = x.ndim - 2, a["group"]
    cig, cog = x.shape[1] // g, w.shape[1]
    out = a["out_shape"]
    y = np.zeros((x.shape[0], cog * g, *out), np.float64)
    for pos in np.ndindex(*x.shape[2:]):
        for kpos in np.ndindex(*w.shape[2:]):
            o = [
                pos[i] * a["strides"][i] + kpos[i] * a["dilations"][i] - a["pads"][i]
                for i in range(nd)
            ]
            if all(0 <= o[i] < out[i] for i in range(nd)):
                for gi in range(g):
                    xs_g = x[(slice(None), slice(gi * cig, (gi + 1) * cig), *pos)]
                    wk = w[(slice(gi * cig, (gi + 1) * cig), slice(None), *kpos)]
                    y[(slice(None), slice(gi * cog, (gi + 1) * cog), *o)] += xs_g @ wk
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2].reshape(1, -1, *[1] * nd)
    return [y.astype(x.dtype)]


register("ConvTranspose", _convt_eval, _convt_infer, kind="window", epilogue=True)

# -- channels-last twins, made by the nhwc_layout pass (their outputs come shaped) -------------

register("ConvNHWC", kind="gemm", epilogue=True, half="compute", internal=True)
for _pool in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
    register(f"{_pool}NHWC", kind="window", epilogue=True, half="follow", internal=True)
