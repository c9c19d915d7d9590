"""Einsum, parsed at import into one letter string per operand and one for the output.

Ellipses become upper-case letters (broadcast dims of size 1 are refused); every letter left out
of the output is summed over, so the kernel is one loop nest per output element.
"""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register


def _einsum_eval(node: Node, xs):
    a = node.attrs
    y = np.einsum(",".join(a["inputs"]) + "->" + a["output"], *xs)
    return [np.asarray(y).astype(xs[0].dtype)]


def _einsum_infer(node: Node):
    a = node.attrs
    return [(tuple(a["dims"][c] for c in a["output"]), node.inputs[0].dtype)]


register("Einsum", _einsum_eval, _einsum_infer, kind="reduce", epilogue=True)
