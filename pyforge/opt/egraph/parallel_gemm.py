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
from .impl import GemmGroup, blas_rules, find_groups, mark_openblas, own_runs
from .rules import Rule, SaturationReport, Subst, saturate

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

    def search_line(self) -> str:
        s = self.searches
        optimal = "all optimal" if all(g.optimal for g in s) else "time budget reached"
        return (
            f"{len(s)} searches: {sum(g.explored for g in s)} states explored, "
            f"{sum(g.pruned for g in s)} pruned by bound, greedy extraction "
            f"{sum(g.greedy_cost for g in s) * 1e3:.3f} ms -> "
            f"{sum(g.incumbents[-1][1] for g in s if g.incumbents) * 1e3:.3f} ms, "
            f"{sum(g.seconds for g in s) * 1e3:.1f} ms searching, {optimal}; "
            f"{sum(g.chosen == 'openblas' for g in self.groups)} of {len(self.groups)} other "
            "GEMM groups on OpenBLAS"
        )


def _bias(add: Node, mm: Node) -> Value | None:
    other = [v for v in add.inputs if v is not mm.outputs[0]]
    if add.op != "Add" or len(other) != 1 or other[0].const is None:
        return None
    b = other[0]
    n = mm.outputs[0].shape[-1]
    return b if b.shape == (n,) and add.outputs[0].shape == mm.outputs[0].shape else None


def find_regions(graph: Graph) -> list[Region]:
    """GEMMs by constant 2-d weights (each with a bias Add as its one reader) sharing an input."""
    users = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    by_input: dict[int, Region] = {}
    for mm in graph.nodes:
        if mm.op != "MatMul" or len(mm.inputs) != 2 or id(mm.outputs[0]) in outputs:
            continue
        x, w = mm.inputs
        readers = users.get(id(mm.outputs[0]), [])
        if w.const is None or len(w.shape) != 2 or len(x.shape) < 2 or len(readers) != 1:
            continue
        if x.dtype != np.float32 or w.dtype != np.float32 or _bias(readers[0], mm) is None:
            continue
        by_input.setdefault(id(x), Region(x, [])).gemms.append((mm, readers[0]))
    return [r for r in by_input.values() if 2 <= len(r.gemms) <= 3]


def _merge_rule(n: int) -> Rule:
    parts = [("GemmBias", "?x", f"?w{i}", f"?b{i}") for i in range(n)]
    ws = ("Concat", *(f"?w{i}" for i in range(n)))
    bs = ("Concat", *(f"?b{i}" for i in range(n)))
    return Rule(f"merge-{n}-gemms", ("Gemms", *parts), ("Split", ("GemmBias", "?x", ws, bs)))


RULES = [_merge_rule(2), _merge_rule(3)]


def _shape(eg: EGraph, c: int, leaves: dict[int, tuple]) -> tuple:
    """The shape of class ``c``'s tensor (every e-node of a class gives the same one)."""
    c = eg.find(c)
    if c in leaves:
        return leaves[c]
    n = min(eg.nodes(c), key=lambda n: n.op)
    if n.op == "GemmBias":
        return _shape(eg, n.children[0], leaves)[:-1] + _shape(eg, n.children[1], leaves)[-1:]
    parts = [_shape(eg, k, leaves) for k in n.children]
    return parts[0][:-1] + (sum(p[-1] for p in parts),)  # Concat (Gemms: its parts, side by side)


class _Costs:
    """E-node costs from the kernel cost function, memoised; how each was found is kept."""

    def __init__(self, eg: EGraph, leaves: dict[int, tuple], cost: KernelCost):
        self.eg, self.leaves, self.cost = eg, leaves, cost
        self.memo: dict[ENode, tuple[float, str]] = {}
        self.specs: list[tuple] = []  # a group leaf's payload indexes its spec

    def __call__(self, n: ENode) -> float:
        if n not in self.memo:
            self.memo[n] = self._price(n)
        return self.memo[n][0]

    def request(self, n: ENode) -> tuple[str, tuple, str] | None:
        """The kernel ``n`` runs as the cost function names it; None: free (leaves, tuples,
        constant concatenations, folded at compile)."""

        def shape(c: int) -> tuple:
            return _shape(self.eg, c, self.leaves)

        if n.op in ("GemmBias", "GemmBiasBlas"):
            kind = "gemm_bias" + "/blas" * (n.op == "GemmBiasBlas")
            return kind, (shape(n.children[0]), shape(n.children[1])), "float32"
        if n.op in ("Gemm", "GemmBlas"):  # a fused GEMM group: its spec is the leaf's payload
            spec = next(iter(self.eg.nodes(n.children[0]))).payload
            return "group" + "/blas" * (n.op == "GemmBlas"), (self.specs[spec],), "float32"
        if n.op == "Split":  # back into the parts the merged weight's Concat joined
            g = next(m for m in self.eg.nodes(n.children[0]) if m.op == "GemmBias")
            cat = next(m for m in self.eg.nodes(g.children[1]) if m.op == "Concat")
            parts = tuple(shape(k)[-1] for k in cat.children)
            return "split", (shape(n.children[0]), parts), "float32"
        return None

    def _price(self, n: ENode) -> tuple[float, str]:
        req = self.request(n)
        return (0.0, "free") if req is None else self.cost(*req)

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
) -> tuple[Graph, Report]:
    """Choose, per region, GEMMs apart or one merged GEMM and a split, and for every GEMM own
    sgemm or OpenBLAS; rewrite the graph. ``prefetch(kernels)``, when given, measures every
    kernel the search may ask for at once (alternated, so the alternatives see the same load)
    before ``cost`` is asked."""
    t0 = time.perf_counter()
    report = Report(find_regions(graph))
    taken = {id(n) for r in report.regions for pair in r.gemms for n in pair}
    report.groups = find_groups(graph, taken)
    eg, leaves, roots = EGraph(), {}, []
    costs = _Costs(eg, leaves, cost)

    def leaf(v: Value) -> int:
        c = eg.add(ENode("tensor", payload=v.name))
        leaves[c] = v.shape
        return c

    for r in report.regions:
        x = leaf(r.x)
        parts = [(x, leaf(mm.inputs[1]), leaf(_bias(add, mm))) for mm, add in r.gemms]
        roots.append(eg.add(ENode("Gemms", tuple(eg.add(ENode("GemmBias", p)) for p in parts))))
    for i, g in enumerate(report.groups):
        costs.specs.append(g.spec)
        roots.append(eg.add(ENode("Gemm", (eg.add(ENode("group", payload=i)),))))

    def own_would_run(eg: EGraph, s: Subst) -> bool:
        if "?g" in s:
            return own_runs(*report.groups[next(iter(eg.nodes(s["?g"]))).payload].mnk)
        x, w = _shape(eg, s["?x"], leaves), _shape(eg, s["?w"], leaves)
        return own_runs(int(np.prod(x[:-1])), w[-1], w[0])

    if roots:
        rules = RULES + blas_rules(own_would_run)
        report.saturation = saturate(eg, rules, max_iterations=6)
        must = must_classes(eg)
        if prefetch is not None:
            reqs = {costs.request(n) for ns in eg.classes.values() for n in ns}
            prefetch(sorted((r for r in reqs if r is not None), key=repr))
    choice: dict[int, ENode] = {}
    for root in roots:
        # regions and groups share no e-class, so each is searched alone: the optima add up
        found = branch_and_bound(eg, root, costs, budget / len(roots), must=must)
        report.searches.append(found.log)
        choice.update(found.choice)
    blas: list[Node] = []
    for r, root in zip(report.regions, roots):
        for n in sorted(eg.nodes(root), key=lambda n: n.op):  # apart, then merged
            r.alternatives["merged" if n.op == "Split" else "apart"] = costs.total(n)
        top = choice[eg.find(root)]
        r.chosen = "merged" if top.op == "Split" else "apart"
        if r.chosen == "merged":
            merged = _merge(graph, r)
            if choice[eg.find(top.children[0])].op == "GemmBiasBlas":
                blas.append(merged)
        else:
            blas += [mm for (mm, _), c in zip(r.gemms, top.children) if _blas(choice, eg, c)]
    for g, root in zip(report.groups, roots[len(report.regions) :]):
        for n in eg.nodes(root):
            g.alternatives["openblas" if n.op == "GemmBlas" else "own"] = costs.total(n)
        if choice[eg.find(root)].op == "GemmBlas":
            g.chosen = "openblas"
            blas.append(g.members[0])
    mark_openblas(blas)
    report.seconds = time.perf_counter() - t0
    return graph, report


def _blas(choice: dict[int, ENode], eg: EGraph, c: int) -> bool:
    return choice[eg.find(c)].op == "GemmBiasBlas"


def _merge(graph: Graph, r: Region) -> Node:
    """One MatMul over the weights side by side, one bias Add, one Split node per part."""
    mms, adds = [m for m, _ in r.gemms], [a for _, a in r.gemms]
    w = graph.constant(np.concatenate([m.inputs[1].const for m in mms], axis=1), "merged_w")
    b = graph.constant(np.concatenate([_bias(a, m).const for m, a in r.gemms]), "merged_b")
    name = "+".join(m.name for m in mms)
    shape = r.x.shape[:-1] + (w.shape[1],)
    mm_out = Value(graph.fresh_name("merged_mm"), shape, np.dtype(np.float32))
    y = Value(graph.fresh_name("merged"), shape, np.dtype(np.float32))
    opset = mms[0].opset
    new = [
        Node("MatMul", [r.x, w], [mm_out], name=f"{name}:merged", opset=opset),
        Node("Add", [mm_out, b], [y], name=f"{name}:bias", opset=opset),
    ]
    widths = [m.inputs[1].shape[1] for m in mms]
    for k, add in enumerate(adds):
        attrs = {"axis": len(shape) - 1, "split": widths, "output": k}
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
