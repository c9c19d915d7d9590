"""Attention as one op: MatMul(q, kᵀ) -> scale -> mask -> Softmax(last axis) -> MatMul(·, v)
becomes FusedAttention (ops/attention.py), so no (Sq, Sk) score matrix is ever stored.

Recognised as torch and the com.microsoft expansions write it: the scale a Mul or Div by a
scalar constant on q, on k or on the scores; the mask an Add of any broadcastable tensor or a
Where(cond, scores, scalar); the transposes that split heads and the Unsqueeze-Expand-Reshape
that repeats key/value heads (grouped-query attention) read through, not run. Anything else
(softmax on another axis, a scale after the mask, a score used twice) is left as it is.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from ..ops.attention import MAX_HEAD
from ..ops.registry import kind_of
from .match import Match, scalar
from .passes import register_pass

IDENTITY = (0, 1, 2, 3)


class _Match(Match):
    def scores(self, v: Value, shape: tuple) -> tuple | None:
        """(the q kᵀ MatMul, scale, mask steps in order, swallowed nodes) computing ``v``."""
        node = v.producer
        if node is None or not self.private(v) or v.shape != shape:
            return None
        if node.op == "MatMul":
            return node, 1.0, [], [node]
        if node.op in ("Mul", "Div"):
            for a, c in ((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),):
                s, inner = scalar(node.inputs[c]), self.scores(node.inputs[a], shape)
                if s and inner and not inner[2]:  # a scale after a mask would scale the mask
                    mm, scale, steps, nodes = inner
                    return mm, scale * (s if node.op == "Mul" else 1 / s), steps, nodes + [node]
            return None
        if node.op == "Add":
            for a, m in ((0, 1), (1, 0)):
                other = node.inputs[m]
                if len(other.shape) > 4 or np.broadcast_shapes(other.shape, shape) != shape:
                    continue
                inner = self.scores(node.inputs[a], shape)
                if inner and other.dtype == v.dtype:
                    mm, scale, steps, nodes = inner
                    return mm, scale, steps + [("add", other)], nodes + [node]
            return None
        if node.op == "Where":
            cond = node.inputs[0]
            if len(cond.shape) > 4 or np.broadcast_shapes(cond.shape, shape) != shape:
                return None
            for a, f, keep in ((1, 2, True), (2, 1, False)):
                fill, inner = scalar(node.inputs[f]), self.scores(node.inputs[a], shape)
                if fill is not None and inner:
                    mm, scale, steps, nodes = inner
                    step = ("where", cond, keep, fill)
                    return mm, scale, steps + [step], nodes + [node]
        return None

    def operand(self, v: Value, perm: tuple, scaled: bool) -> tuple | None:
        """(source value, perm, scale, head groups): canonical = transpose(source, perm), read
        back through Transposes, scalar Mul/Div (when ``scaled``) and a head-repeating Expand."""
        scale, groups = 1.0, 1
        while (node := v.producer) is not None:
            if node.op == "Transpose":
                perm = tuple(node.attrs["perm"][p] for p in perm)
                v = node.inputs[0]
            elif node.op in ("Mul", "Div") and scaled:
                pairs = ((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),)
                found = [(a, scalar(node.inputs[c])) for a, c in pairs]
                found = [(a, s) for a, s in found if s and node.inputs[a].shape == v.shape]
                if not found:
                    break
                a, s = found[0]
                scale *= s if node.op == "Mul" else 1 / s
                v = node.inputs[a]
            elif kind_of(node.op) == "view" and perm[:2] == (0, 1) and len(v.shape) == 4:
                repeated = _repeated_heads(v)
                if repeated is None:
                    break
                v, g = repeated
                groups *= g
            else:
                break
        return (v, perm, scale, groups) if len(v.shape) == 4 else None


def _repeated_heads(v: Value) -> tuple[Value, int] | None:
    """v (B, N*G, T, h) = Reshape(Expand(u (B, N, 1, T, h))), u a view of s (B, N, T, h):
    (s, G)."""
    e = v.producer.inputs[0]
    if e.producer is None or e.producer.op != "Expand" or len(e.shape) != 5:
        return None
    u = e.producer.inputs[0]
    b, n, g, t, h = e.shape
    if v.shape != (b, n * g, t, h) or u.shape != (b, n, 1, t, h):
        return None
    if u.producer is None or kind_of(u.producer.op) != "view":
        return None
    s = u.producer.inputs[0]
    return (s, g) if s.shape == (b, n, t, h) else None


def _canon(shape: tuple, perm: tuple) -> tuple:
    return tuple(shape[p] for p in perm)


def _attention(
    graph: Graph, m: _Match, sm: Node, max_rows: int = 1 << 30
) -> tuple[Node, list[Node]] | None:
    """The FusedAttention node replacing the pattern ending in Softmax ``sm``, and the nodes it
    replaces; None where the pattern does not hold exactly."""
    x = sm.inputs[0]
    if len(x.shape) != 4 or sm.attrs["axis"] % 4 != 3 or x.dtype != np.float32:
        return None
    p = sm.outputs[0]
    pv = m.users.get(id(p), [None])[0]
    if not m.private(p) or pv.op != "MatMul" or pv.inputs[0] is not p:
        return None
    found = m.scores(x, x.shape)
    if found is None:
        return None
    mm, scale, steps, nodes = found
    a, bt = mm.inputs
    if len(a.shape) != 4 or len(bt.shape) != 4 or len(pv.inputs[1].shape) != 4:
        return None
    q = m.operand(a, IDENTITY, True)
    k = m.operand(bt, (0, 1, 3, 2), True)
    v = m.operand(pv.inputs[1], IDENTITY, False)
    if q is None or k is None or v is None or q[3] != 1 or k[3] != v[3]:
        return None
    qs, ks, vs = (_canon(t[0].shape, t[1]) for t in (q, k, v))
    bsz, heads, _, d = qs
    if qs[:2] != x.shape[:2] or ks[3] != d or ks[2] != vs[2] or ks[1] != vs[1]:
        return None
    if ks[0] not in (1, bsz) or vs[0] not in (1, bsz) or heads % ks[1] or heads != ks[1] * k[3]:
        return None
    if max(d, vs[3]) > MAX_HEAD or any(t[0].dtype != np.float32 for t in (q, k, v)):
        return None
    if qs[2] > max_rows and d >= 128:
        return None  # a wide head's long query stays GEMMs around a row softmax (CompileOptions)
    nodes += [sm, pv]
    out, out_perm = pv.outputs[0], IDENTITY
    t = m.users.get(id(out), [None])[0]
    if m.private(out) and t.op == "Transpose":
        out, out_perm = t.outputs[0], tuple(t.attrs["perm"])
        nodes.append(t)
    attrs = {
        "q_perm": list(q[1]),
        "k_perm": list(k[1]),
        "v_perm": list(v[1]),
        "out_perm": list(out_perm),
        "mask": [s[0] for s in steps],
        "keep": next((s[2] for s in steps if s[0] == "where"), True),
        "fill": next((s[3] for s in steps if s[0] == "where"), 0.0),
    }
    if sum(s[0] == "where" for s in steps) > 1:
        return None  # one keep/fill pair per node
    scale_c = graph.constant(np.asarray([scale * q[2] * k[2]], np.float32), "attention_scale")
    inputs = [q[0], k[0], v[0], scale_c] + [s[1] for s in steps]
    node = Node("FusedAttention", inputs, [out], attrs, pv.name, 1)
    return node, nodes


@register_pass("attention")
def fuse_attention(graph: Graph, max_rows: int = 1 << 30) -> Graph:
    """Replace every exact attention pattern by one FusedAttention node (a head of 128 or
    wider: of at most ``max_rows`` queries)."""
    for sm in [n for n in graph.nodes if n.op == "Softmax"]:
        found = _attention(graph, _Match(graph), sm, max_rows)
        if found is None:
            continue
        node, gone = found
        last = max(graph.nodes.index(n) for n in gone)
        gone_ids = {id(n) for n in gone}
        keep = [n for n in graph.nodes[: last + 1] if id(n) not in gone_ids]
        graph.nodes = keep + [node] + graph.nodes[last + 1 :]
        node.outputs[0].producer = node
    return graph
