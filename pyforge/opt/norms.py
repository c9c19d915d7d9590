"""RMSNorm written out in elementwise ops becomes one RMSNormalization (ops/norm.py), a row
kernel whose statistics take the row's threads together, where the decomposed form reduces each
row in one thread (ReduceMean's template) and runs three more kernels.

Recognised as exporters and hand-written decoders spell it, over trailing axes a.. of x:
    r = ReduceMean(Mul(x, x) | Pow(x, 2), axes=[a, .., rank-1], keepdims=1)
    s = Sqrt(Add(r, eps))                      eps a scalar constant
    n = Div(x, s) | Mul(x, Reciprocal(s)) | Mul(x, Div(1, s))
    y = Mul(n, w)                              w constant over x.shape[a:] (else a scale of ones)
Every intermediate must be read only by the pattern; anything else is left as it is.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from .match import Match, scalar
from .passes import register_pass


class _Match(Match):
    def inner(self, v: Value, op: str) -> Node | None:
        """The producer of ``v`` when it is an ``op`` whose result only the pattern reads."""
        node = v.producer
        return node if node is not None and node.op == op and self.private(v) else None

    def rstd_of(self, node: Node) -> tuple[Value, Value, float, list[Node]] | None:
        """(x, the Sqrt's value, eps, swallowed nodes) when ``node`` is x / sqrt(mean(x²) + eps)."""
        if node.op == "Div":
            x, s, gone = node.inputs[0], node.inputs[1], [node]
        elif node.op == "Mul":
            for a, b in ((0, 1), (1, 0)):
                r = node.inputs[b]
                rec = self.inner(r, "Reciprocal") or self.inner(r, "Div")
                if rec is None or (rec.op == "Div" and scalar(rec.inputs[0]) != 1.0):
                    continue
                x, s, gone = node.inputs[a], rec.inputs[-1], [rec, node]
                break
            else:
                return None
        else:
            return None
        sq = self.inner(s, "Sqrt")
        add = sq and self.inner(sq.inputs[0], "Add")
        if add is None:
            return None
        for m, e in ((0, 1), (1, 0)):
            eps, mean = scalar(add.inputs[e]), self.inner(add.inputs[m], "ReduceMean")
            if eps is None or mean is None or not mean.attrs["keepdims"]:
                continue
            sqr = self.inner(mean.inputs[0], "Mul") or self.inner(mean.inputs[0], "Pow")
            if sqr is None:
                continue
            if sqr.op == "Mul" and not (sqr.inputs[0] is x and sqr.inputs[1] is x):
                continue
            if sqr.op == "Pow" and (sqr.inputs[0] is not x or scalar(sqr.inputs[1]) != 2.0):
                continue
            return x, mean, eps, [sqr, mean, add, sq, *gone]
        return None


def _rms(graph: Graph, m: _Match, node: Node) -> tuple[Node, list[Node]] | None:
    found = m.rstd_of(node)
    if found is None:
        return None
    x, mean, eps, gone = found
    rank, axes = len(x.shape), mean.attrs["axes"]
    if x.dtype != np.float32 or not axes or axes != list(range(axes[0], rank)):
        return None
    a, out = axes[0], node.outputs[0]
    if out.shape != x.shape:
        return None
    row, scale = tuple(x.shape[a:]), None
    users = m.users.get(id(out), [])
    mul = users[0] if m.private(out) and users[0].op == "Mul" else None
    if mul is not None and mul.outputs[0].shape != x.shape:
        mul = None  # the weight broadcasts the result to more dims
    w = None if mul is None else mul.inputs[1] if mul.inputs[0] is out else mul.inputs[0]
    if w is not None and w.const is not None and w.dtype == np.float32:
        # a scale per row too (the q and k heads' norms as one) when it stays within x's shape
        tail = w.shape
        while len(tail) > len(row) and tail[0] == 1:
            tail = tail[1:]
        if len(tail) <= len(x.shape):
            tail_c = np.ascontiguousarray(w.const.reshape(tail))
            scale, out = graph.constant(tail_c, "rms_scale"), mul.outputs[0]
            gone.append(mul)
    if scale is None:
        scale = graph.constant(np.ones(row, np.float32), "rms_scale")
    attrs = {"axis": a, "epsilon": eps}
    return Node("RMSNormalization", [x, scale], [out], attrs, node.name, 23), gone


@register_pass("rms_norm")
def fuse_rms_norm(graph: Graph) -> Graph:
    """Replace every exact decomposed RMSNorm by one RMSNormalization node."""
    m, gone_ids = _Match(graph), set()
    for node in [n for n in graph.nodes if n.op in ("Div", "Mul")]:
        found = None if id(node) in gone_ids else _rms(graph, m, node)
        if found is None:
            continue
        new, gone = found
        gone_ids |= {id(n) for n in gone}
        last = max(i for i, n in enumerate(graph.nodes) if id(n) in gone_ids)
        graph.nodes = (
            [n for n in graph.nodes[: last + 1] if id(n) not in gone_ids]
            + [new]
            + [n for n in graph.nodes[last + 1 :] if id(n) not in gone_ids]
        )
        new.outputs[0].producer = new
        m = _Match(graph)
    return graph


def _junction(m: _Match, n2: Node) -> tuple[Node, list[Node], int] | None:
    """(ResidualRMSNorm, the nodes it replaces, the Add) for y = RMSNorm(h = r + RMSNorm(x)),
    both over the last axis of one shape, without bias; y's private Cast to float16 joins."""
    add = n2.inputs[0].producer
    if add is None or add.op != "Add" or len(n2.inputs) != 2:
        return None
    for a in (0, 1):
        n1, r = add.inputs[a].producer, add.inputs[1 - a]
        if n1 is not None and n1.op == "RMSNormalization" and m.private(add.inputs[a]):
            break
    else:
        return None
    h, y, x = add.outputs[0], n2.outputs[0], n1.inputs[0]
    shape, row = h.shape, h.shape[-1:] if h.shape else None
    rows = [n.attrs["axis"] in (-1, len(shape) - 1) for n in (n1, n2)]
    if not all(rows) or len(n1.inputs) != 2 or x.shape != shape or r.shape != shape:
        return None
    w1, w2 = n1.inputs[1], n2.inputs[1]
    f32 = np.dtype(np.float32)
    if w1.shape != row or w2.shape != row or {r.dtype, h.dtype, w1.dtype, w2.dtype} != {f32}:
        return None
    gone, users = [n1, add, n2], m.users.get(id(y), [])
    if m.private(y) and users[0].op == "Cast" and users[0].attrs.get("to") == np.float16:
        gone.append(users[0])
        y = users[0].outputs[0]
    attrs = {"epsilon": n1.attrs["epsilon"], "epsilon2": n2.attrs["epsilon"], "to": y.dtype.name}
    return Node("ResidualRMSNorm", [x, w1, r, w2], [h, y], attrs, n2.name), gone, add


@register_pass("residual_rms_norm")
def fuse_residual_rms_norm(graph: Graph) -> Graph:
    """RMSNorm, residual Add, RMSNorm (a decoder layer's two junctions) as one row kernel."""
    m = _Match(graph)
    for n2 in [n for n in graph.nodes if n.op == "RMSNormalization"]:
        found = _junction(m, n2)
        if found is None:
            continue
        new, gone, add = found
        at = graph.nodes.index(add)  # x and r exist there, and h is read after it
        ids = {id(n) for n in gone}
        graph.nodes = (
            [n for n in graph.nodes[:at] if id(n) not in ids]
            + [new]
            + [n for n in graph.nodes[at:] if id(n) not in ids]
        )
        for o in new.outputs:
            o.producer = new
        m = _Match(graph)
    return graph
