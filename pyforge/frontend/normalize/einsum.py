"""Einsum: the equation parsed into one letter string per operand and one for the output.

Ellipses become upper-case letters (broadcast dims of size 1 are refused); the output letters are
ONNX's implicit ones when the equation has no "->".
"""

from __future__ import annotations

from ...ir import Node
from ...ops.registry import fail
from .common import normalizes


@normalizes("Einsum")
def _einsum_normalize(node: Node) -> None:
    eq = node.attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(node.inputs):
        fail(node, f"equation {eq!r} names {len(terms)} operands, got {len(node.inputs)}")
    ell_rank = 0
    for term, v in zip(terms, node.inputs):
        if "..." in term:
            ell_rank = max(ell_rank, len(v.shape) - (len(term) - 3))
    ell = "".join(chr(ord("A") + i) for i in range(ell_rank))
    subs, dims = [], {}
    for term, v in zip(terms, node.inputs):
        if "..." in term:
            k = len(v.shape) - (len(term) - 3)
            term = term.replace("...", ell[ell_rank - k :])
        if not term.isalpha() and term:
            fail(node, f"equation {eq!r}")
        if len(term) != len(v.shape):
            fail(node, f"term {term!r} does not match rank {len(v.shape)}")
        for ch, d in zip(term, v.shape):
            if dims.setdefault(ch, d) != d:
                fail(node, f"broadcasting letter {ch!r} ({dims[ch]} vs {d})")
        subs.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(subs)
        out = ell + "".join(
            sorted(c for c in set(letters) if c.islower() and letters.count(c) == 1)
        )
    if any(c not in dims for c in out):
        fail(node, f"output letters of {eq!r} not in any operand")
    node.attrs = {"inputs": subs, "output": out, "dims": dims}
