"""The e-graph pass over pyforge's IR: each set of GEMMs that read one tensor (Q, K and V of an
attention block; gate and up of an MLP) is a region whose e-class holds the GEMMs apart and,
by a rewrite rule, one merged GEMM over the concatenated weights followed by a split. Branch and
bound over measured kernel costs picks per region; the graph is rewritten to the choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...ir import Graph, Node, Value
from .egraph import EGraph, ENode
from .extract import SearchLog, branch_and_bound, must_classes
from .impl import (
    OPENBLAS_OPS,
    Backend,
    GemmGroup,
    _plain,
    blas_rules,
    epilogue_rules,
    find_groups,
    mark_openblas,
    serial_rules,
    split_epilogue,
)
from .rules import Rule, SaturationReport, Subst, saturate

# an OpenBLAS alternative is costed at this times its measured time: a kernel timed alone on a
# loaded machine must look >= 10% cheaper than own sgemm before the plan leaves own sgemm
OPENBLAS_MARGIN = 1.10
# and a one-thread alternative at this: it must look >= 10% cheaper than the split GEMM
SERIAL_MARGIN = 1.10
# an epilogue run as a kernel of its own is charged this fraction of its fused group's own
# sgemm time on top of its measured time: the cut must look >= 10% cheaper than the fused
# group (the anchor and the group are timed apart; on a loaded machine they differ by noise)
EPILOGUE_GUARD = 0.10
# and it is one more step: each candidate's time is net of a timed run's overhead, which holds
# one step's dispatch, so the cut's second kernel is charged a step of its own ("step" kind)
STEP = ("step", ((1,),), "float32")
# offer the epilogue-apart alternative at all. Off: measured A/B (benchmarks/egraph.py
# --ab-epilogue, ninth session, 11 models, load 9-60) it was within the noise everywhere it
# acted (predicted 1-3%) and magika's min was 13-17% worse in two of three runs; BENCHMARKS.md
EPILOGUE_APART = False
# (kind, shapes, dtype) -> (seconds, how: "measured" | "cached" | "analytic")
KernelCost = Callable[[str, tuple, str], tuple[float, str]]


@dataclass
class Region:
    x: Value
    gemms: list[tuple[Node, Node]]  # (MatMul, its bias Add), in graph order
    alternatives: dict[str, tuple[float, str]] = field(default_factory=dict)
    chosen: str = "apart"


@dataclass
class Report:
    regions: list[Region]
    groups: list[GemmGroup] = field(default_factory=list)  # one per fused GEMM group elsewhere
    saturation: SaturationReport | None = None
    searches: list[SearchLog] = field(default_factory=list)  # one per region
    seconds: float = 0.0
    predicted: tuple[float, float] = (0.0, 0.0)  # simulated seconds: greedy's plan, the chosen
    one_thread: int = 0  # GEMMs (regions' and groups') chosen to run on one thread

    def search_line(self) -> str:
        s = self.searches
        optimal = "all optimal" if all(g.optimal for g in s) else "time budget reached"
        return (
            f"{len(s)} searches: {sum(g.explored for g in s)} states explored, "
            f"{sum(g.pruned for g in s)} pruned by bound, greedy extraction "
            f"{sum(g.greedy_cost for g in s) * 1e3:.3f} ms -> "
            f"{sum(g.incumbents[-1][1] for g in s if g.incumbents) * 1e3:.3f} ms, "
            f"{sum(g.seconds for g in s) * 1e3:.1f} ms searching, {optimal}; "
            f"{sum(g.chosen.startswith('openblas') for g in self.groups)} of {len(self.groups)} "
            f"other GEMM groups on OpenBLAS, {sum(g.chosen.endswith('apart') for g in self.groups)}"
            f" with the epilogue apart, {self.one_thread} GEMMs on one thread"
        )


def _bias(add: Node, mm: Node) -> Value | None:
    other = [v for v in add.inputs if v is not mm.outputs[0]]
    if add.op != "Add" or len(other) != 1 or other[0].const is None:
        return None
    b, y = other[0], mm.outputs[0]
    want = (1, y.shape[1], 1, 1) if mm.op == "Conv" else (y.shape[-1],)  # per output channel
    return b if b.shape == want and add.outputs[0].shape == y.shape else None


_GEOMETRY = ("dilations", "group", "kernel_shape", "pads", "strides")


def _key(mm: Node) -> tuple:
    """What GEMMs must share to be merged: their input and, for convs, the window geometry."""
    if mm.op == "MatMul":
        return (id(mm.inputs[0]),)
    return (id(mm.inputs[0]), mm.inputs[1].shape[1:], *(str(mm.attr(a)) for a in _GEOMETRY))


def find_regions(graph: Graph) -> list[Region]:
    """GEMMs by constant 2-d weights, or convs (group 1) of one window geometry, each with a
    bias Add as its one reader, sharing an input."""
    users = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    by_input: dict[tuple, Region] = {}
    for mm in graph.nodes:
        rank = {"MatMul": 2, "Conv": 4}.get(mm.op)
        if rank is None or len(mm.inputs) != 2 or id(mm.outputs[0]) in outputs:
            continue
        x, w = mm.inputs
        readers = users.get(id(mm.outputs[0]), [])
        if w.const is None or len(w.shape) != rank or len(x.shape) < 2 or len(readers) != 1:
            continue
        if x.dtype != np.float32 or w.dtype != np.float32 or _bias(readers[0], mm) is None:
            continue
        if mm.op == "Conv" and (mm.attr("group", 1) != 1 or len(x.shape) != 4):
            continue
        by_input.setdefault(_key(mm), Region(x, [])).gemms.append((mm, readers[0]))
    return [r for r in by_input.values() if 2 <= len(r.gemms) <= 3]


def _merge_rule(n: int, op: str = "GemmBias") -> Rule:
    parts = [(op, "?x", f"?w{i}", f"?b{i}") for i in range(n)]
    ws = ("Concat", *(f"?w{i}" for i in range(n)))
    bs = ("Concat", *(f"?b{i}" for i in range(n)))
    name = f"merge-{n}-{'gemms' if op == 'GemmBias' else 'convs'}"
    return Rule(name, ("Gemms", *parts), ("Split", (op, "?x", ws, bs)))


# a ConvBias is costed as the conv it is; in the e-graph its tensors have GEMM shapes (x: output
# pixels by the window's K, w: K by output channels), so merging reads like the GEMMs'
RULES = [_merge_rule(2), _merge_rule(3), _merge_rule(2, "ConvBias"), _merge_rule(3, "ConvBias")]


def _shape(eg: EGraph, c: int, leaves: dict[int, tuple]) -> tuple:
    """The shape of class ``c``'s tensor (every e-node of a class gives the same one)."""
    c = eg.find(c)
    if c in leaves:
        return leaves[c]
    n = min(eg.nodes(c), key=lambda n: n.op)
    if n.op in ("GemmBias", "ConvBias"):
        return _shape(eg, n.children[0], leaves)[:-1] + _shape(eg, n.children[1], leaves)[-1:]
    parts = [_shape(eg, k, leaves) for k in n.children]
    return parts[0][:-1] + (sum(p[-1] for p in parts),)  # Concat (Gemms: its parts, side by side)


class _Costs:
    """E-node costs from the kernel cost function, memoised; how each was found is kept."""

    def __init__(self, eg: EGraph, leaves: dict[int, tuple], cost: KernelCost):
        self.eg, self.leaves, self.cost = eg, leaves, cost
        self.memo: dict[ENode, tuple[float, str]] = {}
        self.specs: list[tuple] = []  # a group leaf's payload indexes its spec
        self.parts: list[tuple | None] = []  # and its (anchor, epilogue) specs, cut apart
        self.convs: dict[int, tuple] = {}  # a conv region's x class -> (x shape, conv attrs)

    def __call__(self, n: ENode) -> float:
        if n not in self.memo:
            self.memo[n] = self._price(n)
        return self.memo[n][0]

    def request(self, n: ENode) -> tuple[str, tuple, str] | None:
        """The kernel ``n`` runs as the cost function names it; None: free (leaves, tuples,
        constant concatenations, folded at compile)."""

        def shape(c: int) -> tuple:
            return _shape(self.eg, c, self.leaves)

        blas, serial = _impl(n.op)  # "XBlasSerial": X on OpenBLAS, on one thread
        op, how = n.op.removesuffix("Serial").removesuffix("Blas"), "/blas" * blas
        how += "@serial" * serial  # (costs.py: bound own_gemm=False; "@serial" in the label)
        if op == "GemmBias":
            return "gemm_bias" + how, (shape(n.children[0]), shape(n.children[1])), "float32"
        if op == "Gemm":  # a fused GEMM group: its spec is the leaf's payload
            spec = next(iter(self.eg.nodes(n.children[0]))).payload
            return "group" + how, (self.specs[spec],), "float32"
        if op == "GemmAnchor":  # the group's anchor alone
            spec = next(iter(self.eg.nodes(n.children[0]))).payload
            return "group" + how, (self.parts[spec][0],), "float32"
        if op == "Epilogue":  # the group's epilogue alone, reading the anchor's output
            return "group", (self.parts[self._group(n)][1],), "float32"
        if op == "ConvBias":  # costed as the conv + bias it is
            x, attrs = self.convs[self.eg.find(n.children[0])]
            return "group" + how, (_conv_spec(x, attrs, shape(n.children[1])[-1]),), "float32"
        if n.op == "Split":  # back into the parts the merged weight's Concat joined
            g = next(m for m in self.eg.nodes(n.children[0]) if m.op in ("GemmBias", "ConvBias"))
            cat = next(m for m in self.eg.nodes(g.children[1]) if m.op == "Concat")
            parts = tuple(shape(k)[-1] for k in cat.children)
            if g.op == "ConvBias":  # channels: axis 1 of the conv's output
                x, attrs = self.convs[self.eg.find(g.children[0])]
                y = _conv_spec(x, attrs, sum(parts))[0][3]
                return "split", (y, parts, 1), "float32"
            return "split", (shape(n.children[0]), parts), "float32"
        return None

    def _group(self, n: ENode) -> int:
        """The group an Epilogue e-node cuts (its bare GEMM's leaf payload)."""
        a = next(m for m in self.eg.nodes(n.children[0]) if m.op == "GemmAnchor")
        return next(iter(self.eg.nodes(a.children[0]))).payload

    def _price(self, n: ENode) -> tuple[float, str]:
        req = self.request(n)
        if req is None:
            return 0.0, "free"
        seconds, how = self.cost(*req)
        if n.op == "Epilogue":
            step, how_step = self.cost(*STEP)
            whole, how_whole = self.cost("group", (self.specs[self._group(n)],), "float32")
            hows = "+".join(sorted({how, how_step, how_whole}))
            return seconds + step + EPILOGUE_GUARD * whole, hows
        blas, serial = _impl(n.op)
        return seconds * (OPENBLAS_MARGIN if blas else 1) * (SERIAL_MARGIN if serial else 1), how

    def total(self, n: ENode) -> tuple[float, str]:
        """An alternative's cost with its kernels' one level down (the region's GEMMs)."""
        below = [c for c in n.children if self.eg.find(c) not in self.leaves]
        nodes = [n] + [min(self.eg.nodes(c), key=self) for c in below]
        hows = sorted({self.memo[m][1] for m in nodes if m in self.memo} - {"free"})
        return sum(self(m) for m in nodes), "+".join(hows) or "free"


def optimise(
    graph: Graph,
    cost: KernelCost,
    budget: float = 5.0,
    prefetch: Callable[[list[tuple[str, tuple, str]]], None] | None = None,
    backend: Backend | None = None,
) -> tuple[Graph, Report]:
    """Choose, per region, GEMMs apart or one merged GEMM and a split, and for every GEMM own
    sgemm or OpenBLAS; rewrite the graph. ``prefetch(kernels)``, when given, measures every
    kernel the search may ask for at once (alternated, so the alternatives see the same load)
    before ``cost`` is asked. Without ``backend`` (the runtime's GEMM facts) no GEMM is offered
    OpenBLAS."""
    t0 = time.perf_counter()
    report = Report(find_regions(graph))
    taken = {id(n) for r in report.regions for pair in r.gemms for n in pair}
    report.groups = find_groups(graph, taken)
    eg, leaves, roots, greedy = EGraph(), {}, [], []  # greedy: the e-nodes greedy's plan runs
    costs = _Costs(eg, leaves, cost)

    def leaf(v: Value) -> int:
        c = eg.add(ENode("tensor", payload=v.name))
        leaves[c] = v.shape
        return c

    for r in report.regions:
        conv = r.gemms[0][0] if r.gemms[0][0].op == "Conv" else None
        if conv is None:
            x = leaf(r.x)
            parts = [(x, leaf(mm.inputs[1]), leaf(_bias(add, mm))) for mm, add in r.gemms]
        else:  # GEMM shapes (see RULES); the conv's own kept for costing
            y = conv.outputs[0].shape
            k = int(np.prod(conv.inputs[1].shape[1:]))
            x = leaf(Value(r.x.name, (int(np.prod(y[2:])), k), r.x.dtype))
            costs.convs[x] = (r.x.shape, tuple(sorted(conv.attrs.items())))
            parts = [
                (
                    x,
                    leaf(Value(mm.inputs[1].name, (k, mm.inputs[1].shape[0]), r.x.dtype)),
                    leaf(_bias(add, mm)),
                )
                for mm, add in r.gemms
            ]
        op = "GemmBias" if conv is None else "ConvBias"
        greedy += [ENode(op, p) for p in parts]
        roots.append(eg.add(ENode("Gemms", tuple(eg.add(ENode(op, p)) for p in parts))))
    for i, g in enumerate(report.groups):
        costs.specs.append(g.spec)
        costs.parts.append(g.parts)
        greedy.append(ENode("Gemm", (eg.add(ENode("group", payload=i)),)))
        roots.append(eg.add(greedy[-1]))

    def mnk(eg: EGraph, s: Subst) -> tuple[tuple[int, int, int], bool]:
        """The matched GEMM's (m, n, k) as own sgemm sees it, and whether it is a conv."""
        if "?g" in s:
            g = report.groups[next(iter(eg.nodes(s["?g"]))).payload]
            return g.mnk, g.members[0].op == "Conv"
        x, w = _shape(eg, s["?x"], leaves), _shape(eg, s["?w"], leaves)
        rows, cols = int(np.prod(x[:-1])), w[-1]  # a conv's GEMM: output channels by pixels
        conv = eg.find(s["?x"]) in costs.convs
        return ((cols, rows, w[0]) if conv else (rows, cols, w[0])), conv

    def own_would_run(eg: EGraph, s: Subst) -> bool:
        size, conv = mnk(eg, s)
        return (not conv or "Conv" in OPENBLAS_OPS) and backend.takes(*size)

    def splits(eg: EGraph, s: Subst, own: bool) -> bool:
        size = mnk(eg, s)[0]
        return backend.splits(*size, own and backend.takes(*size))

    def has_epilogue(eg: EGraph, s: Subst) -> bool:
        return report.groups[next(iter(eg.nodes(s["?g"]))).payload].parts is not None

    if roots:
        rules = RULES + (blas_rules(own_would_run) + serial_rules(splits) if backend else [])
        if EPILOGUE_APART:
            rules += epilogue_rules(has_epilogue, own_would_run if backend else None)
        report.saturation = saturate(eg, rules, max_iterations=6)
        must = must_classes(eg)
        if prefetch is not None:
            nodes = [n for ns in eg.classes.values() for n in ns]
            reqs = {costs.request(n) for n in nodes}
            reqs |= {STEP} if any(n.op == "Epilogue" for n in nodes) else set()
            prefetch(sorted((r for r in reqs if r is not None), key=repr))
    choice: dict[int, ENode] = {}
    for root in roots:
        # regions and groups share no e-class, so each is searched alone: the optima add up
        found = branch_and_bound(eg, root, costs, budget / len(roots), must=must)
        report.searches.append(found.log)
        choice.update(found.choice)
    chosen = sum(g.incumbents[-1][1] for g in report.searches if g.incumbents)
    report.predicted = (sum(costs(eg.canonical(n)) for n in greedy), chosen)
    blas: list[Node] = []
    serial: list[Node] = []

    def impl(node: Node, op: str) -> None:  # ``node`` runs the e-node ``op`` chose
        on_blas, one_thread = _impl(op)
        (blas if on_blas else []).append(node)
        (serial if one_thread else []).append(node)

    for r, root in zip(report.regions, roots):
        for n in sorted(eg.nodes(root), key=lambda n: n.op):  # apart, then merged
            r.alternatives["merged" if n.op == "Split" else "apart"] = costs.total(n)
        top = choice[eg.find(root)]
        r.chosen = "merged" if top.op == "Split" else "apart"
        if r.chosen == "merged":
            impl(_merge(graph, r), choice[eg.find(top.children[0])].op)
        else:
            for (mm, _), c in zip(r.gemms, top.children):
                impl(mm, choice[eg.find(c)].op)
    for g, root in zip(report.groups, roots[len(report.regions) :]):
        for n in eg.nodes(root):
            if n.op != "Epilogue":
                g.alternatives[_name(n.op)] = costs.total(n)
                continue
            e = costs(n)
            for a in eg.nodes(n.children[0]):  # the bare GEMM's own alternatives
                t = costs(a)
                hows = "+".join(sorted({costs.memo[n][1], costs.memo[a][1]} - {"free"}))
                kind = "openblas" if a.op == "GemmAnchorBlas" else "own"
                g.alternatives[f"{kind}, epilogue apart"] = (e + t, hows)
        top = choice[eg.find(root)]
        if top.op == "Epilogue":
            anchor = choice[eg.find(top.children[0])]
            g.chosen = ("openblas" if anchor.op == "GemmAnchorBlas" else "own") + ", epilogue apart"
            split_epilogue(graph, g)
        else:
            g.chosen = _name(top.op)
            impl(g.members[0], top.op)
        if g.chosen == "openblas, epilogue apart":
            blas.append(g.members[0])
    if backend:
        mark_openblas(blas, backend.tag)
        mark_openblas(serial, backend.serial)
    report.one_thread = len(serial)
    report.seconds = time.perf_counter() - t0
    return graph, report


def _impl(op: str) -> tuple[bool, bool]:
    """Whether the e-node ``op`` runs its GEMM on OpenBLAS, and on one thread."""
    return op.removesuffix("Serial").endswith("Blas"), op.endswith("Serial")


def _name(op: str) -> str:
    """A group's alternative as explain names it: "own", "openblas, one thread"..."""
    blas, serial = _impl(op)
    return ("openblas" if blas else "own") + ", one thread" * serial


def _conv_spec(x: tuple, attrs: tuple, co: int) -> tuple:
    """A conv (its attrs, x's shape) with ``co`` output channels and its bias Add, as a spec."""
    a = dict(attrs)
    kh, kw = a["kernel_shape"]
    (dh, dw), (sh, sw), p = a.get("dilations", [1, 1]), a.get("strides", [1, 1]), a["pads"]
    oh = (x[2] + p[0] + p[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (x[3] + p[1] + p[3] - dw * (kw - 1) - 1) // sw + 1
    y, f = (x[0], co, oh, ow), np.dtype(np.float32).str
    conv = ("Conv", _plain(attrs), (("x", x, f), ("c", (co, x[1], kh, kw), f)), y, f)
    return conv, ("Add", (), (0, ("c", (1, co, 1, 1), f)), y, f)


def _merge(graph: Graph, r: Region) -> Node:
    """One MatMul over the weights side by side, one bias Add, one Split node per part."""
    mms, adds = [m for m, _ in r.gemms], [a for _, a in r.gemms]
    conv = mms[0].op == "Conv"  # weights side by side: a conv's on axis 0, its outputs' on 1
    ws = [m.inputs[1].const for m in mms]
    w = graph.constant(np.concatenate(ws, axis=0 if conv else 1), "merged_w")
    bs = [_bias(a, m).const for m, a in r.gemms]
    b = graph.constant(np.concatenate(bs, axis=1 if conv else 0), "merged_b")
    name = "+".join(m.name for m in mms)
    y0 = mms[0].outputs[0].shape
    shape = (y0[0], w.shape[0], *y0[2:]) if conv else r.x.shape[:-1] + (w.shape[1],)
    mm_out = Value(graph.fresh_name("merged_mm"), shape, np.dtype(np.float32))
    y = Value(graph.fresh_name("merged"), shape, np.dtype(np.float32))
    opset = mms[0].opset
    new = [
        Node(mms[0].op, [r.x, w], [mm_out], dict(mms[0].attrs), f"{name}:merged", opset),
        Node("Add", [mm_out, b], [y], name=f"{name}:bias", opset=opset),
    ]
    widths = [m.outputs[0].shape[1 if conv else -1] for m in mms]
    for k, add in enumerate(adds):
        attrs = {"axis": 1 if conv else len(shape) - 1, "split": widths, "output": k}
        new.append(
            Node("Split", [y], list(add.outputs), attrs, name=f"{add.name}:part", opset=opset)
        )
    gone = {id(n) for n in mms + adds}
    at = min(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    # the parts take their place at the first GEMM's; a part's readers all come after its Add
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    for k, n in enumerate(new):
        graph.add_node(n, at + k)
    return new[0]
