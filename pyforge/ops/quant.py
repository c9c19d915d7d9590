"""The int8 ops ORT's quantisers write: QuantizeLinear, DequantizeLinear (per tensor or per
axis), DynamicQuantizeLinear, MatMulInteger. The references compute as ORT's cpu kernels do:
x / scale in float32, rounded half to even, then the zero point, then saturation; integer
products summed in int32."""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .nn import matmul_shape
from .registry import register

QUANT_TYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))


def along(node: Node, v: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | int:
    """A scale or zero point shaped to broadcast against an input of ``shape``: per tensor as it
    is, per axis along attrs["axis"], blocked repeated attrs["block"] times along it."""
    if v is None:
        return 0
    a, block = node.attrs["axis"], node.attrs.get("block", 0)
    if a is None:
        return v.reshape(())
    if block:
        return np.take(np.repeat(v, block, axis=a), np.arange(shape[a]), axis=a)
    return v.reshape([-1 if k == a else 1 for k in range(len(shape))])


def quantize(x: np.ndarray, scale, zero, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    q = np.rint(np.true_divide(x.astype(np.float32), np.float32(1) * scale, dtype=np.float32))
    return np.clip(q + zero, info.min, info.max).astype(dtype)


def _quantize_eval(node: Node, xs):
    x, shape = xs[0], np.shape(xs[0])
    zero = along(node, xs[2] if len(xs) > 2 else None, shape)
    return [quantize(x, along(node, xs[1], shape), np.int32(zero), node.attrs["dtype"])]


def _dequantize_eval(node: Node, xs):
    x, scale = xs[0], xs[1]
    zero = along(node, xs[2] if len(xs) > 2 else None, x.shape)
    diff = (x.astype(np.int32) - np.int32(zero)).astype(scale.dtype)
    return [diff * along(node, scale, x.shape)]


register(
    "QuantizeLinear",
    _quantize_eval,
    lambda n: [(n.inputs[0].shape, n.attrs["dtype"])],
    kind="injective",
    epilogue=True,
)
register(
    "DequantizeLinear",
    _dequantize_eval,
    lambda n: [(n.inputs[0].shape, n.inputs[1].dtype)],
    kind="injective",
    epilogue=True,
)

# -- DynamicQuantizeLinear: scale and zero point from the tensor's range, then uint8 -----------


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """ORT's scale and zero point: the range widened to hold 0, mapped onto [0, 255]."""
    lo = min(np.float32(x.min()) if x.size else np.float32(0), np.float32(0))
    hi = max(np.float32(x.max()) if x.size else np.float32(0), np.float32(0))
    scale = np.float32(1) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zero = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    return scale, np.uint8(zero)


def _dynamic_eval(node: Node, xs):
    scale, zero = dynamic_params(xs[0])
    outs = [quantize(xs[0], scale, np.int32(zero), np.dtype(np.uint8)), scale, zero]
    outs = [np.asarray(o) for o in outs]
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


def _dynamic_infer(node: Node):
    outs = [
        (node.inputs[0].shape, np.dtype(np.uint8)),
        ((), np.dtype(np.float32)),
        ((), np.dtype(np.uint8)),
    ]
    return outs if "output" not in node.attrs else [outs[node.attrs["output"]]]


# a reduction over the whole tensor before any element is written: one whole-output kernel
register("DynamicQuantizeLinear", _dynamic_eval, _dynamic_infer, split_outputs=True, kind="opaque")

# -- MatMulInteger ------------------------------------------------------------------------------


def _matmul_integer_eval(node: Node, xs):
    a, b = xs[0].astype(np.int32), xs[1].astype(np.int32)
    a_zero = xs[2] if len(xs) > 2 and xs[2] is not None else np.int32(0)
    b_zero = xs[3] if len(xs) > 3 and xs[3] is not None else np.int32(0)
    a = a - np.asarray(a_zero, np.int32).reshape(-1, 1) if np.size(a_zero) > 1 else a - a_zero
    return [np.matmul(a, b - np.asarray(b_zero, np.int32)).astype(np.int32)]


register(
    "MatMulInteger",
    _matmul_integer_eval,
    lambda n: [(matmul_shape(n), np.dtype(np.int32))],
    kind="reduce",
    epilogue=True,
)


def _qlinear_matmul_eval(node: Node, xs):
    """QLinearMatMul as ORT runs it: the int32 product, times a_scale * b_scale / y_scale in
    float32, clamped to the output range less its zero point, rounded half to even."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = xs
    acc = _matmul_integer_eval(node, [a, b, a_zero, b_zero])[0]
    scale = np.float32(a_scale.reshape(())) * b_scale.astype(np.float32).reshape(-1)
    scale = (scale / np.float32(y_scale.reshape(()))).astype(np.float32)
    info, zero = np.iinfo(y_zero.dtype), np.int32(y_zero.reshape(()))
    v = np.clip(acc.astype(np.float32) * scale, info.min - zero, info.max - zero)
    return [(np.rint(v) + zero).astype(y_zero.dtype)]


def _qlinear_matmul_infer(node: Node):
    shape = matmul_shape(Node(node.op, [node.inputs[0], node.inputs[3]], [], {}, node.name))
    return [(shape, node.inputs[7].dtype)]


register("QLinearMatMul", _qlinear_matmul_eval, _qlinear_matmul_infer, kind="reduce", epilogue=True)
