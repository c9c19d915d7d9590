"""Implementation alternatives per GEMM on the cpu: each fused GEMM group (a MatMul, Gemm or
Conv with its elementwise epilogue, as fusion will group it) runs on pyforge's own AVX2 sgemm
or on OpenBLAS. The e-class of a group holds ``Gemm`` (own) and, by the rule ``gemm-on-openblas``
where own sgemm would run it at all, ``GemmBlas``; each is costed by timing the group itself
(``lower_numba/costs.py``, kind ``group`` or ``group/blas``). A group chosen for OpenBLAS gets
the backend's tag (``exec.cpu.own.OPENBLAS``) in its anchor's name, which its GEMM step's label
carries to the runtime. The runtime's facts (which sizes own sgemm takes, the tag) come in as a
``Backend`` from the compiler: this layer imports no exec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...ir import Graph, Node, Value
from ...ops.registry import kind_of
from ..fusion import _partition
from .egraph import EGraph
from .rules import Rule, Subst

# the anchors given an OpenBLAS alternative. Convs were too (and Conv is handled throughout),
# but ResNet-18 measured 8-13% slower (median, three runs) with 4-5 convs moved to OpenBLAS
# though each conv timed alone was faster there: a cost not seen kernel by kernel
OPENBLAS_OPS = ("MatMul", "Gemm")
# the anchors given a group's e-class (and so the one-thread alternative)
GEMM_OPS = ("MatMul", "Gemm", "Conv")


@dataclass
class GemmGroup:
    members: list[Node]
    spec: tuple  # what costs.py rebuilds and times: [op, attrs, refs, shape, dtype] per member
    mnk: tuple[int, int, int]
    alternatives: dict[str, tuple[float, str]] = field(default_factory=dict)
    chosen: str = "own"
    # (the anchor alone, the epilogue alone) as specs: the group cut in two kernels; None when
    # it has no epilogue (or one that cannot be rebuilt alone)
    parts: tuple[tuple, tuple] | None = None


def _plain(v):
    """``v`` as hashable plain data (what a cost key's json and a graph's attrs both take)."""
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    raise TypeError(type(v).__name__)


def _spec(members: list[Node]) -> tuple | None:
    """The group as data; None where it cannot be rebuilt alone (several outputs, odd attrs)."""
    made: dict[int, int] = {}
    out = []
    for i, m in enumerate(members):
        if len(m.outputs) != 1:
            return None
        refs: list = []
        for v in m.inputs:
            if v is None or id(v) in made:
                refs.append(None if v is None else made[id(v)])
                continue
            r = ["c" if v.const is not None else "x", list(v.shape), v.dtype.str]
            if v.const is not None and v.const.size <= 8:  # the epilogue's scalars, exactly
                r.append(v.const.ravel().tolist())
            refs.append(r)
        try:
            attrs = tuple((k, _plain(a)) for k, a in sorted(m.attrs.items()))
        except TypeError:
            return None
        y = m.outputs[0]
        out.append((m.op, attrs, _plain(refs), y.shape, y.dtype.str))
        made[id(y)] = i
    return tuple(out)


def _mnk(anchor: Node) -> tuple[int, int, int]:
    """A GEMM's (m, n, k) as own sgemm sees it: a Conv's output channels by output pixels."""
    y, w = anchor.outputs[0], anchor.inputs[1]
    if anchor.op == "Conv":
        return w.shape[0], int(np.prod(y.shape[2:])), int(np.prod(w.shape[1:]))
    k = (
        anchor.inputs[0].shape[-1]
        if anchor.op == "MatMul"
        else int(np.prod(w.shape)) // y.shape[-1]
    )
    return int(np.prod(y.shape[:-1])), y.shape[-1], k


def find_groups(graph: Graph, taken: set[int]) -> list[GemmGroup]:
    """The float32 GEMM groups fusion will make whose anchor (MatMul, Gemm, Conv) is not in
    ``taken`` (ids of nodes a parallel-GEMM region decides)."""
    out = []
    for members in _partition(graph, True):
        a = members[0]
        if kind_of(a.op) != "gemm" or id(a) in taken or a.op not in GEMM_OPS:
            continue
        if (
            a.outputs[0].dtype != np.float32
            or len(a.inputs) < 2
            or a.op == "Conv"
            and a.attr("group", 1) != 1
        ):
            continue
        spec = _spec(members)
        if spec is not None:
            parts = (_spec(members[:1]), _spec(members[1:])) if len(members) > 1 else None
            parts = parts if parts and None not in parts else None
            out.append(GemmGroup(members, spec, _mnk(a), parts=parts))
    return out


@dataclass(frozen=True)
class Backend:
    """The cpu runtime's GEMM facts: ``takes(m, n, k)``, whether own sgemm runs a GEMM this size
    (else OpenBLAS runs it either way: no alternative), and ``tag``, the label mark that sends a
    step to OpenBLAS; ``splits(m, n, k, own)``, whether own sgemm (or OpenBLAS) runs it on
    several threads (else no one-thread alternative), and ``serial``, the mark for one."""

    takes: Callable[[int, int, int], bool]
    tag: str
    splits: Callable[[int, int, int, bool], bool] = lambda m, n, k, own: False
    serial: str = "@serial"


def blas_rules(ok: Callable[[EGraph, Subst], bool]) -> list[Rule]:
    """Each GEMM on OpenBLAS as well, where ``ok``: own sgemm would run it (else the same)."""
    return [
        Rule("gemm-on-openblas", ("Gemm", "?g"), ("GemmBlas", "?g"), ok),
    ] + [
        Rule(f"{op}-on-openblas", (op, "?x", "?w", "?b"), (f"{op}Blas", "?x", "?w", "?b"), ok)
        for op in ("GemmBias", "ConvBias")
    ]


def serial_rules(splits: Callable[[EGraph, Subst, bool], bool]) -> list[Rule]:
    """Each GEMM, on either implementation, on one thread as well, where ``splits(eg, s,
    own)``: the runtime would split it over several (a split GEMM stalls whenever another
    process holds one of its threads' cores)."""
    out = []
    for op in ("Gemm", "GemmBias", "ConvBias"):
        kids = ("?g",) if op == "Gemm" else ("?x", "?w", "?b")
        for impl, own in (("", True), ("Blas", False)):
            ok = lambda eg, s, own=own: splits(eg, s, own)
            name = f"{op}{impl}-on-one-thread"
            out.append(Rule(name, (op + impl, *kids), (f"{op}{impl}Serial", *kids), ok))
    return out


def epilogue_rules(apart: Callable[[EGraph, Subst], bool], ok) -> list[Rule]:
    """A GEMM group's epilogue as a kernel of its own after the bare GEMM, where ``apart``: the
    group has one; the bare GEMM on OpenBLAS as well, where ``ok`` (see ``blas_rules``)."""
    rules = [Rule("epilogue-apart", ("Gemm", "?g"), ("Epilogue", ("GemmAnchor", "?g")), apart)]
    if ok is not None:
        rules.append(Rule("anchor-on-openblas", ("GemmAnchor", "?g"), ("GemmAnchorBlas", "?g"), ok))
    return rules


def split_epilogue(graph: Graph, g: GemmGroup) -> None:
    """Cut ``g`` after its anchor: a same-shape Reshape (a view, which fusion steps over and
    lowering makes an alias) between the anchor and its epilogue's first member, so fusion
    starts the epilogue as a kernel of its own."""
    a, first = g.members[0], g.members[1]
    y = a.outputs[0]
    v = Value(graph.fresh_name(f"{y.name}/apart"), y.shape, y.dtype)
    cut = Node("Reshape", [y], [v], {"shape": list(y.shape)}, f"{a.name}:epilogue_apart", a.opset)
    first.inputs = [v if x is y else x for x in first.inputs]
    graph.add_node(cut, next(i for i, n in enumerate(graph.nodes) if n is a) + 1)


def mark_openblas(nodes: list[Node], tag: str) -> None:
    """Name each GEMM anchor for OpenBLAS: its GEMM step's label (``op name``) carries it."""
    for n in nodes:
        if tag not in n.name:
            n.name += tag
