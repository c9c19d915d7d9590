"""The normalize table and the helpers its rules share.

A rule takes a node as ONNX wrote it (attribute defaults already filled from the schema) and
rewrites it in place into the op's one canonical form: constant inputs become attributes, legacy
and opset-dependent spellings become one, and what is invalid ONNX is refused here, before any
op rule of ``pyforge.ops`` sees the node.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import DataDependentError
from ...ir import Node
from ...ops import OPS
from ...ops.registry import bad_attr, norm_axis

Normalize = Callable[[Node], None]

# op -> its rule; an op without one is imported as ONNX wrote it
NORMALIZE: dict[str, Normalize] = {}


def normalizes(*ops: str) -> Callable[[Normalize], Normalize]:
    """Register the decorated function as the import rule of ``ops``."""

    def add(rule: Normalize) -> Normalize:
        for op in ops:
            # a typo or a second rule for one op would silently leave a form un-normalised
            if op not in OPS or op in NORMALIZE:
                raise ValueError(f"normalize rule for {op}: unknown op or ruled twice")
            NORMALIZE[op] = rule
        return rule

    return add


def const_input(node: Node, index: int, what: str, required: bool = True) -> np.ndarray | None:
    """The value of a constant input, or a clear error when it is computed at run time."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        if required:
            bad_attr(node, f"missing input {index} ({what})")
        return None
    if v.const is None:
        detail = f"input {index} ({what}) must be known before the run"
        raise DataDependentError(node.op, node.name, node.opset, detail, [v.name])
    return v.const


def take_const_inputs(node: Node, names: list[str], first: int = 1) -> None:
    """Move constant inputs ``first..`` into attrs under ``names`` (None where absent)."""
    for i, key in enumerate(names, start=first):
        arr = const_input(node, i, key, required=False)
        node.attrs[key] = None if arr is None else arr.tolist()
    node.inputs = node.inputs[:first]


def normalize_axis_attr(node: Node) -> None:
    """The ``axis`` attribute (default 0) made non-negative against the first input's rank."""
    node.attrs["axis"] = norm_axis(node, int(node.attrs["axis"]), len(node.inputs[0].shape))


def check_const_indices(node: Node, index: int, dims) -> None:
    """Constant indices outside [-dim, dim) are a model error, refused at compile time
    (``dims`` is one size, or one per index column along the last axis, as in GatherND)."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None or v.const is None or not np.size(v.const):
        return
    d = np.broadcast_to(np.asarray(dims, np.int64), np.shape(v.const))
    bad = (v.const < -d) | (v.const >= d)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        bad_attr(node, f"index {v.const[at]} at {list(at)} is out of range [-{d[at]}, {d[at]})")


@normalizes("Gather", "GatherElements")
def normalize_gather(node: Node) -> None:
    """Gather and GatherElements: axis made non-negative, constant indices checked."""
    normalize_axis_attr(node)
    check_const_indices(node, 1, node.inputs[0].shape[node.attrs["axis"]])
