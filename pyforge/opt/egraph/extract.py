"""Extraction: one e-node per needed e-class, acyclic, minimising the sum of the chosen e-nodes'
costs (a shared e-class is paid once, as a computed tensor is).

``greedy`` gives the first incumbent (each class's cheapest tree cost); ``branch_and_bound``
searches from it with two lower bounds: every class that a still-needed class must contain
whichever e-node it takes (``must``, a greatest fixed point) costs at least its cheapest e-node;
and an e-node whose every extraction would be a cycle is never tried (propagation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .egraph import EGraph, ENode

Cost = Callable[[ENode], float]
Choice = dict[int, ENode]


@dataclass
class SearchLog:
    explored: int = 0  # search states visited
    pruned: int = 0  # states cut because their lower bound reached the incumbent
    incumbents: list[tuple[float, float]] = field(default_factory=list)  # (seconds, cost)
    greedy_cost: float = math.inf
    root_bound: float = 0.0
    seconds: float = 0.0
    optimal: bool = True  # False when the time budget ended the search

    def line(self) -> str:
        end = "optimal" if self.optimal else "time budget reached, best found"
        return (
            f"{self.explored} states explored, {self.pruned} pruned by bound, "
            f"{len(self.incumbents)} incumbents, greedy extraction {self.greedy_cost:.6g} -> "
            f"{self.incumbents[-1][1] if self.incumbents else math.inf:.6g} "
            f"(root bound {self.root_bound:.6g}), {self.seconds * 1e3:.1f} ms, {end}"
        )


@dataclass
class Extraction:
    choice: Choice
    cost: float
    log: SearchLog


def dag_cost(eg: EGraph, root: int, choice: Choice, cost: Cost) -> float:
    """The cost of the classes reachable from ``root`` under ``choice``; inf on a cycle."""
    total, state = 0.0, {}  # class -> 1 on the path, 2 done

    def visit(c: int) -> bool:
        nonlocal total
        c = eg.find(c)
        if state.get(c) == 2:
            return True
        if state.get(c) == 1 or c not in choice:
            return False
        state[c] = 1
        n = choice[c]
        if not all(visit(ch) for ch in n.children):
            return False
        state[c] = 2
        total += cost(n)
        return True

    return total if visit(root) else math.inf


def reachable(eg: EGraph, root: int) -> list[int]:
    """The classes some e-node path from ``root`` reaches (``root`` included)."""
    seen, stack = {eg.find(root)}, [eg.find(root)]
    while stack:
        for n in eg.nodes(stack.pop()):
            for ch in n.children:
                if ch not in seen:
                    seen.add(ch)
                    stack.append(ch)
    return sorted(seen)


def greedy(eg: EGraph, cost: Cost, classes: list[int] | None = None) -> Choice:
    """Each class's e-node of least tree cost (children's best costs summed), to a fixed point;
    over ``classes`` only when given (closed under children: ``reachable``)."""
    best: dict[int, tuple[float, ENode]] = {}
    changed = True
    while changed:
        changed = False
        for c in eg.classes if classes is None else classes:
            nodes = eg.classes[c]
            for n in sorted(nodes, key=lambda n: (n.op, n.children)):  # ties: a fixed order
                t = cost(n) + sum(best.get(ch, (math.inf,))[0] for ch in n.children)
                if t < best.get(c, (math.inf,))[0]:
                    best[c], changed = (t, n), True
    return {c: n for c, (_, n) in best.items()}


def must_classes(eg: EGraph) -> dict[int, frozenset[int]]:
    """For each class, the classes every acyclic extraction of it contains (itself included)."""
    every = frozenset(eg.classes)
    must = {c: every for c in eg.classes}
    changed = True
    while changed:
        changed = False
        for c, nodes in eg.classes.items():
            common = None
            for n in nodes:
                under = frozenset().union(*(must[ch] for ch in n.children))
                common = under if common is None else common & under
            new = (common or frozenset()) | {c}
            if new != must[c]:
                must[c], changed = new, True
    return must


def branch_and_bound(
    eg: EGraph,
    root: int,
    cost: Cost,
    time_budget: float = 5.0,
    on_bound: Callable[[Choice, float], None] | None = None,
    must: dict[int, frozenset[int]] | None = None,
) -> Extraction:
    """The least-cost acyclic extraction of ``root`` (optimal unless the budget ran out).
    ``on_bound(partial choice, lower bound)`` sees every bound the search uses (for the oracle);
    ``must``: ``must_classes(eg)``, when several searches share one e-graph."""
    t0 = time.perf_counter()
    root = eg.find(root)
    log = SearchLog()
    must = must_classes(eg) if must is None else must
    # propagation: an e-node reading a class that must contain its own class always cycles
    reach = reachable(eg, root)  # only these can be needed
    options = {
        c: sorted(
            (n for n in eg.classes[c] if not any(c in must[ch] for ch in n.children)),
            key=lambda n: (cost(n), n.op, n.children),
        )
        for c in reach
    }
    cheapest = {c: min((cost(n) for n in ns), default=math.inf) for c, ns in options.items()}
    incumbent = greedy(eg, cost, reach)
    best_cost = dag_cost(eg, root, incumbent, cost)
    best = dict(incumbent) if best_cost < math.inf else {}
    log.greedy_cost = best_cost
    if best_cost < math.inf:
        log.incumbents.append((time.perf_counter() - t0, best_cost))
    chosen: Choice = {}

    def bound(paid: float, needed: frozenset[int]) -> float:
        rest = frozenset().union(*(must[c] for c in needed)) - chosen.keys()
        return paid + sum(cheapest[c] for c in rest)

    def cycles(c: int, n: ENode) -> bool:
        stack, seen = list(n.children), set()
        while stack:
            x = stack.pop()
            if x == c:
                return True
            if x in chosen and x not in seen:
                seen.add(x)
                stack.extend(chosen[x].children)
        return False

    def search(paid: float, needed: frozenset[int]) -> None:
        nonlocal best, best_cost
        log.explored += 1
        lb = bound(paid, needed)
        if on_bound is not None:
            on_bound(dict(chosen), lb)
        if lb >= best_cost:
            log.pruned += 1
            return
        if not needed:
            best, best_cost = dict(chosen), paid
            log.incumbents.append((time.perf_counter() - t0, paid))
            return
        if time.perf_counter() - t0 > time_budget:
            log.optimal = False
            return
        c = min(needed, key=lambda x: (len(options[x]), x))  # forced classes first
        for n in options[c]:
            if cycles(c, n):
                continue
            chosen[c] = n
            new = frozenset(ch for ch in n.children if ch not in chosen)
            search(paid + cost(n), (needed - {c}) | new)
            del chosen[c]

    log.root_bound = bound(0.0, frozenset({root}))
    search(0.0, frozenset({root}))
    log.seconds = time.perf_counter() - t0
    return Extraction(best, best_cost, log)
