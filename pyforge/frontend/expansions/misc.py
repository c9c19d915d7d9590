"""LpNormalization and CumProd as subgraphs of ops pyforge has kernels for."""

from __future__ import annotations

import numpy as np

from ...errors import DataDependentError
from ..expand import Builder, expands


@expands("LpNormalization")
def _lp_normalization(b: Builder) -> None:
    """x / ||x||_p along the axis; a zero norm gives 0, as ORT gives it."""
    x, p = b.input(0), int(b.attrs["p"])
    v = b.value(x)
    if p not in (1, 2) or v.dtype.kind != "f":
        b.fail(f"p={p} on {v.dtype} (p is 1 or 2, on floats)")
    axes = b.const([int(b.attrs["axis"])], np.int64)  # ReduceL1/L2's rule checks its range
    norm = b.op("ReduceL1" if p == 1 else "ReduceL2", [x, axes], keepdims=1)
    zero, one = b.const(0, v.dtype), b.const(1, v.dtype)
    safe = b.op("Where", [b.op("Equal", [norm, zero]), one, norm])
    b.op("Div", [x, safe], outputs=[b.output(0)])


@expands("CumProd")
def _cum_prod(b: Builder) -> None:
    """A scan by doubling: log2(n) rounds of y *= y shifted k places (ones shifted in), k = 1, 2,
    4...; integers exact, floats multiplied in a tree order, not left to right."""
    x, axis = b.input(0), b.value(b.input(1))
    shape, dtype = b.value(x).shape, b.value(x).dtype
    if axis.const is None:  # compile() then runs the model in stages, the axis read first
        raise DataDependentError(b.op_type, b.name, b.opset, "a run-time axis", [axis.name])
    a = int(np.ravel(axis.const)[0])
    if not -len(shape) <= a < len(shape):
        b.bad(f"axis {a} out of range for rank {len(shape)}")
    a %= len(shape)
    n, reverse = shape[a], bool(b.attrs["reverse"])

    def shifted(y: str, k: int) -> str:
        """y moved k places along the axis (away from the scan's start), ones shifted in."""
        ones = b.const(np.ones([k if d == a else s for d, s in enumerate(shape)], dtype))
        lo, hi = (k, n) if reverse else (0, n - k)
        lo, hi, axes = (b.const([i], np.int64) for i in (lo, hi, a))
        part = b.op("Slice", [y, lo, hi, axes])
        return b.op("Concat", [part, ones] if reverse else [ones, part], axis=a)

    y, k = x, 1
    while k < n:
        y, k = b.op("Mul", [y, shifted(y, k)]), 2 * k
    if b.attrs["exclusive"] and n:
        y = shifted(y, 1)
    b.op("Identity", [y], outputs=[b.output(0)])
