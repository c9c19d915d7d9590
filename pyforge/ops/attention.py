"""FusedAttention: softmax(scale * q kᵀ, masked) v as one op, made by opt/attention.py.

Inputs ``q, k, v``, the scale (a one-element tensor, so that one compiled kernel serves every
head size) then one tensor per mask step. Each of q, k, v is read through a permutation
(``q_perm``...: the canonical operand is ``np.transpose(input, perm)``), so the transposes that
split heads need no kernel of their own: canonically q is (B, H, Sq, D), k (B|1, Hk, Sk, D),
v (B|1, Hk, Sk, Dv), query head h reading key/value head h // (H / Hk) (grouped-query attention).
``mask`` lists the steps applied to the scaled scores, in order: "add" adds its input
(broadcast to (B, H, Sq, Sk)); "where" keeps a score where its boolean input equals ``keep``
and puts ``fill`` elsewhere. The canonical output (B, H, Sq, Dv) is written through
``out_perm``.
"""

from __future__ import annotations

import numpy as np

from ..ir import Node
from .registry import register

# widest head either lowering takes (its per-thread accumulator and shared tiles are sized by it)
MAX_HEAD = 256


def canonical(node: Node, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The canonical (B, H, S, D) shapes of q, k and v."""
    perms = (node.attrs["q_perm"], node.attrs["k_perm"], node.attrs["v_perm"])
    return [tuple(s[p] for p in perm) for s, perm in zip(shapes, perms)]


def _infer(node: Node):
    q, _, v = canonical(node, [x.shape for x in node.inputs[:3]])
    out = (q[0], q[1], q[2], v[3])
    return [(tuple(out[p] for p in node.attrs["out_perm"]), node.inputs[0].dtype)]


def _evaluate(node: Node, xs):
    a = node.attrs
    q, k, v = (np.transpose(x, a[p]) for x, p in zip(xs, ("q_perm", "k_perm", "v_perm")))
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    s = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64)) * xs[3]
    for step, m in zip(a["mask"], xs[4:]):
        s = s + m if step == "add" else np.where(m == a["keep"], s, a["fill"])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    o = np.matmul(e / e.sum(axis=-1, keepdims=True), v.astype(np.float64))
    return [np.ascontiguousarray(np.transpose(o, a["out_perm"])).astype(xs[0].dtype)]


register("FusedAttention", _evaluate, _infer, kind="rows", internal=True)
