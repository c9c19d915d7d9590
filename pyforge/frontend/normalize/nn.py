"""Neural-network ops: window attributes (auto_pad, strides, pads, dilations) made explicit per
axis, Gemm's and the norms' scalars typed, Softmax's pre-13 2-d coercion made a flag.
"""

from __future__ import annotations

from ...errors import ShapeError
from ...ir import Node
from ...ops.registry import bad_attr, fail, norm_axis
from .common import normalizes


def _window_attrs(
    node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...], pool: bool = False
) -> None:
    """Normalise strides/pads/dilations/auto_pad into explicit per-axis lists."""
    nd = len(kernel)
    strides = list(node.attr("strides") or [1] * nd)
    dilations = list(node.attr("dilations") or [1] * nd)
    pads = list(node.attr("pads") or [0] * (2 * nd))
    auto_pad = node.attrs.pop("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        bad_attr(node, f"strides/dilations/pads do not match a {nd}-d kernel")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            # ORT sizes a pool's SAME pads by the undilated kernel (the spec: the dilated one)
            span = kernel[i] if pool else (kernel[i] - 1) * dilations[i] + 1
            total = (out - 1) * strides[i] + span - spatial[i]
            if total < 0 and pool:  # ORT pads by C's rounding toward zero or refuses
                fail(node, f"SAME padding below zero ({total}): kernel smaller than stride")
            total = max(0, total)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nd] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad not in ("NOTSET", ""):
        bad_attr(node, f"auto_pad={auto_pad!r}")
    node.attrs.update(kernel_shape=list(kernel), strides=strides, dilations=dilations, pads=pads)


@normalizes("Conv")
def _conv_normalize(node: Node) -> None:
    x, w = node.inputs[0], node.inputs[1]
    if len(x.shape) < 3:
        bad_attr(node, f"input rank {len(x.shape)} < 3")
    kernel = tuple(node.attr("kernel_shape") or w.shape[2:])
    _window_attrs(node, x.shape[2:], kernel)
    node.attrs["group"] = int(node.attrs["group"])
    if x.shape[1] != w.shape[1] * node.attrs["group"]:
        raise ShapeError(node.op, node.name, f"input channels {x.shape[1]} != {w.shape[1]} x group")


@normalizes("MaxPool", "AveragePool")
def _pool_normalize(node: Node) -> None:
    x = node.inputs[0]
    if len(x.shape) > 4:
        fail(node, f"{len(x.shape) - 2}-d pooling")
    if len(node.outputs) > 1:
        fail(node, "the Indices output of MaxPool")
    # shared by MaxPool, AveragePool and LpPool: an attribute the op lacks means "off"
    if node.attrs.get("storage_order"):
        fail(node, "storage_order=1")
    _window_attrs(node, x.shape[2:], tuple(node.attr("kernel_shape")), pool=True)
    node.attrs["ceil_mode"] = int(node.attrs.get("ceil_mode", 0))
    node.attrs["count_include_pad"] = int(node.attrs.get("count_include_pad", 0))


@normalizes("BatchNormalization")
def _bn_normalize(node: Node) -> None:
    if node.attrs["training_mode"]:
        fail(node, "training_mode=1")
    if any(o is not None and o.name for o in node.outputs[1:]):
        node.outputs = node.outputs[:1]  # running stats outputs are only meaningful in training
    node.attrs["epsilon"] = float(node.attrs["epsilon"])
    node.attrs.pop("momentum", None)
    node.attrs.pop("spatial", None)


@normalizes("Gemm")
def _gemm_normalize(node: Node) -> None:
    node.attrs = {
        "alpha": float(node.attrs["alpha"]),
        "beta": float(node.attrs["beta"]),
        "transA": int(node.attrs["transA"]),
        "transB": int(node.attrs["transB"]),
    }


@normalizes("Softmax", "LogSoftmax")
def _softmax_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    node.attrs["axis"] = norm_axis(node, int(node.attrs["axis"]), rank)
    # before opset 13 the input is coerced to 2-d at `axis`: reduce over all trailing dims
    node.attrs["flatten"] = int(node.opset < 13)


@normalizes("LpPool")
def _lppool_normalize(node: Node) -> None:
    _pool_normalize(node)
    node.attrs["p"] = int(node.attrs["p"])


@normalizes("ConvTranspose")
def _convt_normalize(node: Node) -> None:
    x, w = node.inputs[0], node.inputs[1]
    nd = len(x.shape) - 2
    if nd not in (1, 2):
        fail(node, f"{nd}-d transposed convolution")
    g = int(node.attrs["group"])
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    strides = list(node.attr("strides") or [1] * nd)
    dil = list(node.attr("dilations") or [1] * nd)
    out_pad = list(node.attr("output_padding") or [0] * nd)
    auto_pad = node.attrs["auto_pad"]
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    pads = node.attr("pads")
    out_shape = node.attr("output_shape")
    span = [(kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
    full = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + span[i] for i in range(nd)]
    if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if (
            out_shape is None
        ):  # ORT: in·stride, but never below the unpadded size (no negative pads)
            total = [max(0, full[i] - x.shape[2 + i] * strides[i]) for i in range(nd)]
            out_shape = [full[i] - total[i] for i in range(nd)]
        total = [full[i] - out_shape[i] for i in range(nd)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = small + big if auto_pad == "SAME_UPPER" else big + small
    else:
        pads = list(pads or [0] * (2 * nd))
        if out_shape is None:
            out_shape = [full[i] - pads[i] - pads[i + nd] for i in range(nd)]
    if x.shape[1] != w.shape[0] or x.shape[1] % g:
        raise ShapeError(node.op, node.name, f"input channels {x.shape[1]} vs weight {w.shape}")
    node.attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dil,
        "pads": pads,
        "group": g,
        "out_shape": list(out_shape),
    }
