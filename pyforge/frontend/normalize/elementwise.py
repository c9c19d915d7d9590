"""Elementwise ops: legacy broadcast attributes dropped (opset < 7), float-only ops refused on
integers, Clip's bounds (inputs from opset 11) made attributes.
"""

from __future__ import annotations

from ...ir import Node
from ...ops.elementwise import BINARY, FLOAT_ONLY, UNARY, VARIADIC
from ...ops.registry import broadcast_shapes, fail
from .common import const_input, normalizes


def _clip_normalize(node: Node) -> None:
    if node.opset >= 11:
        for i, key in ((1, "min"), (2, "max")):
            arr = const_input(node, i, key, required=False)
            node.attrs[key] = None if arr is None else float(arr)
        node.inputs = node.inputs[:1]


@normalizes(*BINARY)
def _binary_normalize(node: Node) -> None:
    if node.attrs.get("broadcast") and node.attrs.get("axis") is not None:
        fail(node, "legacy broadcast with an axis attribute (opset < 7)")
    if node.opset < 7 and not node.attrs.get("broadcast"):
        shapes = {v.shape for v in node.inputs if v is not None}
        if len(shapes) > 1 and node.op not in VARIADIC:
            fail(node, "opset < 7 without broadcast=1 needs equal shapes")
    node.attrs.pop("broadcast", None)
    node.attrs.pop("consumed_inputs", None)
    node.inputs = [v for v in node.inputs if v is not None]
    floored = node.op == "Mod" and not node.attrs["fmod"]
    if floored and node.inputs[0].dtype.kind == "f" and node.opset < 28:  # 28 made it valid
        fail(node, "fmod=0 on floats before opset 28")
    if node.op == "PRelu" and node.inputs[0].shape != broadcast_shapes(
        node, node.inputs[0].shape, node.inputs[1].shape
    ):
        fail(node, "slope broadcasting beyond the input shape")


@normalizes(*UNARY)
def _unary_normalize(node: Node) -> None:
    node.attrs.pop("consumed_inputs", None)
    if node.op in FLOAT_ONLY and node.inputs[0].dtype.kind != "f":
        fail(node, f"{node.inputs[0].dtype} input (float only)")
    if node.op == "Clip":
        _clip_normalize(node)
