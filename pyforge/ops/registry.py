"""The op registry: one entry per op with its shape rule, numpy reference, kind and flags.

Rules see canonical nodes: the frontend (``pyforge/frontend/normalize``) has already turned ONNX's
opset-specific forms into one (constant inputs such as Reshape's shape or Clip's bounds are
attributes). ``infer(node)`` gives output (shape, dtype) pairs; ``evaluate(node, arrays)``
computes outputs with numpy, used for constant folding and as the cpu fallback of ops that have
no generated kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import BadAttributeError, ShapeError, UnsupportedOperatorError
from ..ir import Node, Value

Infer = Callable[[Node], list[tuple[tuple[int, ...], np.dtype]]]
Evaluate = Callable[[Node, list], list[np.ndarray]]


# What an op's computation looks like, in the spirit of TVM's op patterns; passes read this.
KINDS = (
    "elementwise",  # one output element from the inputs' elements at the same (broadcast) place
    "view",  # the input's bytes under another shape: no kernel
    "injective",  # each output element reads input elements at computed places (gather, pad)
    "gemm",  # a matrix product: a GEMM library call
    "window",  # each output element reduces a spatial window (pools, direct convs)
    "reduce",  # each output element reduces over axes (ReduceSum, ArgMax, Einsum)
    "rows",  # each output row needs its whole input row (softmax, norms)
    "opaque",  # anything else: never fused with a neighbour
)
HALF = (None, "compute", "follow")


@dataclass
class OpDef:
    """One op: its rules and what it is. ``kind`` is one of KINDS.

    ``epilogue``: its lowering yields one output element at a time, so an elementwise tail may
    fuse into its kernel; ``half``: "compute" runs in float16 under precision="fp16", "follow"
    is exact in float16 and runs half when fed half; ``reads_half``: the inputs it takes float16
    as they are (widened at the load, as a Cast would) while it stays float32; ``nhwc``: its channels-last twin op;
    ``internal``: made by a pass, never read from ONNX."""

    name: str
    evaluate: Evaluate | None = None
    infer: Infer | None = None
    kind: str = "opaque"
    epilogue: bool = False
    half: str | None = None
    reads_half: tuple[int, ...] = ()
    nhwc: str | None = None
    internal: bool = False
    min_opset: int = 1
    # input positions that must be constants (shapes, axes, pads...): a backend that sees them as
    # run-time graph inputs specialises the model on their values
    const_inputs: tuple[int, ...] = ()
    # the result depends only on input shapes and dtypes, so it folds even for run-time inputs
    shape_only: bool = False
    # a multi-output op is imported as one single-output copy per used output, attrs["output"] = k
    split_outputs: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.half not in HALF:
            raise ValueError(f"op {self.name}: kind {self.kind!r}, half {self.half!r}")


OPS: dict[str, OpDef] = {}


def register(
    name: str,
    evaluate: Evaluate | None = None,
    infer: Infer | None = None,
    **facts,
) -> OpDef:
    OPS[name] = OpDef(name, evaluate, infer, **facts)
    return OPS[name]


def kind_of(op: str) -> str:
    """The op's kind; "opaque" for an op the table does not know (the Fused group node)."""
    opdef = OPS.get(op)
    return opdef.kind if opdef is not None else "opaque"


def flag(op: str, name: str):
    opdef = OPS.get(op)
    return getattr(opdef, name) if opdef is not None else None


# -- helpers for rules ------------------------------------------------------------------------


def fail(node: Node, detail: str) -> None:
    raise UnsupportedOperatorError(node.op, node.name, node.opset, detail)


def bad_attr(node: Node, detail: str) -> None:
    raise BadAttributeError(node.op, node.name, detail)


def broadcast_shapes(node: Node, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(node.op, node.name, f"cannot broadcast shapes {list(shapes)}") from None


def norm_axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        bad_attr(node, f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def same_as_input(index: int = 0) -> Infer:
    def infer(node: Node):
        v = node.inputs[index]
        return [(v.shape, v.dtype)]

    return infer


def inputs_of(node: Node) -> list[Value]:
    return [v for v in node.inputs if v is not None]


def infer_node(node: Node) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The op's shape rule. Every op read from ONNX has one that reads only shapes and
    attributes (never the numpy reference on dummy arrays, which breaks on data-dependent
    indices and on symbolic dims); the internal twins come shaped from the pass that makes them."""
    opdef = OPS[node.op]
    if opdef.infer is None:
        fail(node, "no shape rule (an internal op must come with its outputs shaped)")
    return opdef.infer(node)
