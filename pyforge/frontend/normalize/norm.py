"""Normalizations: axis and epsilon made canonical, GroupNormalization's opset-dependent scale
layout made a flag, InstanceNormalization as one group per channel.
"""

from __future__ import annotations

from ...ir import Node
from ...ops.registry import bad_attr, fail, norm_axis
from .common import normalizes


@normalizes("LayerNormalization", "RMSNormalization")
def _norm_normalize(node: Node) -> None:
    x = node.inputs[0]
    node.attrs = {
        "axis": norm_axis(node, int(node.attrs["axis"]), len(x.shape)),
        "epsilon": float(node.attrs["epsilon"]),
    }


@normalizes("GroupNormalization", "InstanceNormalization")
def _group_normalize(node: Node) -> None:
    x = node.inputs[0]
    if len(x.shape) < 3:
        bad_attr(node, f"input rank {len(x.shape)} < 3")
    c = x.shape[1]
    groups = c if node.op == "InstanceNormalization" else int(node.attr("num_groups"))
    if groups <= 0 or c % groups:
        bad_attr(node, f"{c} channels do not split into {groups} groups")
    # opset 18 GroupNormalization scales per group; from opset 21 (and Instance-) per channel
    per_group = node.op == "GroupNormalization" and node.opset < 21
    if node.op == "GroupNormalization" and int(node.attrs["stash_type"]) != 1:
        fail(node, "stash_type other than float32")
    node.attrs = {
        "groups": groups,
        "epsilon": float(node.attrs["epsilon"]),
        "per_group": int(per_group),
    }


@normalizes("LRN")
def _lrn_normalize(node: Node) -> None:
    if len(node.inputs[0].shape) < 2:
        bad_attr(node, "LRN input rank < 2")
    size = int(node.attr("size"))
    if size <= 0:
        bad_attr(node, f"size={size}")
    node.attrs = {
        "size": size,
        "alpha": float(node.attrs["alpha"]),
        "beta": float(node.attrs["beta"]),
        "bias": float(node.attrs["bias"]),
    }


@normalizes("MeanVarianceNormalization")
def _mvn_normalize(node: Node) -> None:
    rank = len(node.inputs[0].shape)
    axes = sorted({norm_axis(node, int(a), rank) for a in node.attrs["axes"]})
    if not axes:
        bad_attr(node, "empty axes")
    node.attrs = {"axes": axes}
