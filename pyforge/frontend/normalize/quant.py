"""QuantizeLinear, DequantizeLinear: per tensor (axis None), per axis or blocked, the output
type made an attribute; integer matmuls' zero points checked. float8 and int4 have no numpy type
(the importer refuses them)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...errors import ShapeError
from ...ir import Node, Value
from ...ops.quant import QUANT_TYPES
from ...ops.registry import fail, norm_axis
from .common import normalizes


def _optional(node: Node, index: int) -> Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _scale_axis(node: Node) -> tuple[int | None, int]:
    """(axis, block): axis None for a per-tensor scale, else the axis its scale (and zero point)
    runs along; block > 0 when each scale covers that many elements of the axis."""
    x, scale, zero = node.inputs[0], node.inputs[1], _optional(node, 2)
    block = int(node.attrs.get("block_size", 0))
    one = scale.size == 1 and len(scale.shape) <= 1  # per tensor: () and (1,) alike, as ORT
    if (
        zero is not None
        and tuple(zero.shape) != tuple(scale.shape)
        and not (one and zero.size == 1 and len(zero.shape) <= 1)
    ):
        raise ShapeError(node.op, node.name, f"zero point {zero.shape} != scale {scale.shape}")
    if one and not block:
        return None, 0
    axis = norm_axis(node, int(node.attrs["axis"]), len(x.shape))
    if block:
        want = tuple(-(-d // block) if k == axis else d for k, d in enumerate(x.shape))
    else:
        want = (x.shape[axis],)
    if tuple(scale.shape) != want:
        raise ShapeError(
            node.op, node.name, f"scale {scale.shape} for axis {axis} of input {x.shape}"
        )
    return axis, block


@normalizes("QuantizeLinear")
def _quantize_normalize(node: Node) -> None:
    zero = _optional(node, 2)
    if zero is not None:
        dtype = np.dtype(zero.dtype)
    elif int(node.attrs.get("output_dtype", 0)):
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attrs["output_dtype"])))
    else:
        dtype = np.dtype(np.uint8)
    if dtype not in QUANT_TYPES or node.inputs[0].dtype != np.float32:
        fail(node, f"quantising {node.inputs[0].dtype} to {dtype}")
    axis, block = _scale_axis(node)
    node.attrs = {"axis": axis, "block": block, "dtype": dtype}


@normalizes("DequantizeLinear")
def _dequantize_normalize(node: Node) -> None:
    x = node.inputs[0]
    if np.dtype(x.dtype) not in (*QUANT_TYPES, np.dtype(np.int32)):
        fail(node, f"dequantising {x.dtype}")
    axis, block = _scale_axis(node)
    node.attrs = {"axis": axis, "block": block}


@normalizes("DynamicQuantizeLinear")
def _dynamic_normalize(node: Node) -> None:
    if node.inputs[0].dtype != np.float32:
        fail(node, f"input of type {node.inputs[0].dtype}")
    node.attrs = {k: v for k, v in node.attrs.items() if k == "output"}


@normalizes("MatMulInteger")
def _matmul_integer_normalize(node: Node) -> None:
    _check_integer_matmul(
        node, node.inputs[0], node.inputs[1], _optional(node, 2), _optional(node, 3)
    )
    node.attrs = {}


@normalizes("QLinearMatMul")
def _qlinear_matmul_normalize(node: Node) -> None:
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = node.inputs
    _check_integer_matmul(node, a, b, a_zero, b_zero)
    n = b.shape[-1]
    for v, per_column in ((a_scale, ()), (y_scale, ()), (y_zero, ()), (b_scale, (n,))):
        if not (v.size == 1 and len(v.shape) <= 1) and tuple(v.shape) != per_column:
            raise ShapeError(node.op, node.name, f"scale or zero point of shape {v.shape}")
    node.attrs = {}


def _check_integer_matmul(node: Node, a: Value, b: Value, a_zero, b_zero) -> None:
    if len(a.shape) < 2 or len(b.shape) < 2:
        fail(node, "a 1-d operand")
    for v in (a, b):
        if np.dtype(v.dtype) not in QUANT_TYPES[:2]:
            fail(node, f"operand of type {v.dtype}")
    # per-row zero points of A ([M]) and per-column ones of B ([N]), as ORT takes them
    for zero, size in ((a_zero, a.shape[-2]), (b_zero, b.shape[-1])):
        scalar = zero is None or (zero.size == 1 and len(zero.shape) <= 1)
        if not scalar and tuple(zero.shape) != (size,):
            raise ShapeError(node.op, node.name, f"zero point {zero.shape}, want () or ({size},)")
