"""Rewrite rules as data (pattern -> pattern, with a condition) and equality saturation.

A pattern is a variable ``"?x"`` or a tuple ``(op, *child patterns)``; a rule adds its right-hand
side to the class its left-hand side matched and merges the two.

>>> comm = Rule("add-comm", ("Add", "?a", "?b"), ("Add", "?b", "?a"))
>>> report = saturate(eg, [comm], max_iterations=4)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .egraph import EGraph, ENode

Pattern = str | tuple
Subst = dict[str, int]


@dataclass(frozen=True)
class Rule:
    """``lhs`` -> ``rhs`` where ``condition(egraph, subst)`` holds (always, when None)."""

    name: str
    lhs: Pattern
    rhs: Pattern
    condition: Callable[[EGraph, Subst], bool] | None = None


def ematch(eg: EGraph, pattern: Pattern, c: int, subst: Subst | None = None) -> list[Subst]:
    """Every substitution under which ``pattern`` matches an e-node of class ``c``."""
    subst = {} if subst is None else subst
    c = eg.find(c)
    if isinstance(pattern, str):
        if pattern in subst:
            return [subst] if eg.find(subst[pattern]) == c else []
        return [{**subst, pattern: c}]
    op, kids = pattern[0], pattern[1:]
    out = []
    for n in eg.nodes(c):
        if n.op != op or len(n.children) != len(kids):
            continue
        partial = [subst]
        for kid, ch in zip(kids, n.children):
            partial = [s2 for s in partial for s2 in ematch(eg, kid, ch, s)]
        out += partial
    return out


def instantiate(eg: EGraph, pattern: Pattern, subst: Subst) -> int:
    if isinstance(pattern, str):
        return subst[pattern]
    return eg.add(ENode(pattern[0], tuple(instantiate(eg, k, subst) for k in pattern[1:])))


@dataclass
class SaturationReport:
    iterations: int = 0
    applied: int = 0  # merges that changed the e-graph
    nodes: int = 0
    stopped_by: str = "saturated"  # or "iterations", "nodes", "time"
    seconds: float = 0.0


def saturate(
    eg: EGraph,
    rules: list[Rule],
    max_iterations: int = 16,
    max_nodes: int = 20_000,
    time_limit: float = 1.0,
) -> SaturationReport:
    """Apply every rule everywhere until nothing changes or a limit is reached."""
    rep, t0 = SaturationReport(), time.perf_counter()
    while True:
        if rep.iterations >= max_iterations:
            rep.stopped_by = "iterations"
            break
        matches = [
            (r, c, s)
            for r in rules
            for c in list(eg.class_ids())
            for s in ematch(eg, r.lhs, c)
            if r.condition is None or r.condition(eg, s)
        ]
        rep.iterations += 1
        changed = 0
        for r, c, s in matches:
            changed += eg.union(c, instantiate(eg, r.rhs, s))
            if eg.size > max_nodes:
                break
        eg.rebuild()
        rep.applied += changed
        if eg.size > max_nodes:
            rep.stopped_by = "nodes"
            break
        if time.perf_counter() - t0 > time_limit:
            rep.stopped_by = "time"
            break
        if not changed:
            break
    rep.nodes, rep.seconds = eg.size, time.perf_counter() - t0
    return rep
