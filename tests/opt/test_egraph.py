"""The e-graph core: hash-consing, union-find, congruence after rebuild, rules and their limits,
extraction on hand-made cases."""

from __future__ import annotations

import math

from pyforge.opt.egraph import (
    EGraph,
    ENode,
    Rule,
    branch_and_bound,
    dag_cost,
    ematch,
    greedy,
    must_classes,
    saturate,
)


def _term(eg: EGraph, t) -> int:
    if isinstance(t, str):
        return eg.add(ENode(t))
    return eg.add(ENode(t[0], tuple(_term(eg, k) for k in t[1:])))


def test_hash_consing_shares_equal_terms():
    eg = EGraph()
    a = _term(eg, ("f", "x", ("g", "y")))
    b = _term(eg, ("f", "x", ("g", "y")))
    assert a == b and eg.size == 4


def test_congruence_after_union_and_rebuild():
    eg = EGraph()
    fa, fb = _term(eg, ("f", ("h", "a"))), _term(eg, ("f", ("h", "b")))
    assert eg.find(fa) != eg.find(fb)
    eg.union(eg.add(ENode("a")), eg.add(ENode("b")))
    eg.rebuild()
    assert eg.find(fa) == eg.find(fb)  # two levels of congruence
    assert len(eg.classes) == 3


def test_ematch_binds_a_repeated_variable_to_one_class():
    eg = EGraph()
    same = _term(eg, ("mul", "x", "x"))
    _term(eg, ("mul", "x", "y"))
    hits = [(c, s) for c in eg.class_ids() for s in ematch(eg, ("mul", "?a", "?a"), c)]
    assert [c for c, _ in hits] == [same]


def test_saturation_reaches_a_fixed_point_and_respects_limits():
    rules = [
        Rule("comm", ("add", "?a", "?b"), ("add", "?b", "?a")),
        Rule("assoc", ("add", ("add", "?a", "?b"), "?c"), ("add", "?a", ("add", "?b", "?c"))),
    ]
    eg = EGraph()
    root = _term(eg, ("add", ("add", ("add", "a", "b"), "c"), "d"))
    rep = saturate(eg, rules, max_iterations=50, max_nodes=10_000)
    assert rep.stopped_by == "saturated"
    # every bracketing and order of a+b+c+d is one class: 4! orders x 5 bracketings
    assert eg.find(_term(eg, ("add", "d", ("add", "c", ("add", "b", "a"))))) == eg.find(root)
    small = EGraph()
    _term(small, ("add", ("add", ("add", "a", "b"), "c"), "d"))
    assert saturate(small, rules, max_nodes=20).stopped_by == "nodes"
    one = EGraph()
    _term(one, ("add", ("add", ("add", "a", "b"), "c"), "d"))
    assert saturate(one, rules, max_iterations=1).stopped_by == "iterations"


def test_condition_gates_a_rule():
    eg = EGraph()
    _term(eg, ("neg", ("neg", "x")))
    never = Rule("dneg", ("neg", ("neg", "?x")), "?x", condition=lambda eg, s: False)
    assert saturate(eg, [never]).applied == 0
    rep = saturate(eg, [Rule("dneg", ("neg", ("neg", "?x")), "?x")])
    assert rep.applied == 1


def _shared():
    # root = pair(A, B); A and B each: either cheap private (3) or via the shared s (s costs 4,
    # each use 0). Tree costs pick the private forms (3+3); the DAG optimum shares s (4).
    eg = EGraph()
    leaf = eg.add(ENode("leaf"))
    s = eg.add(ENode("s", (leaf,)))
    a = eg.add(ENode("usea", (s,)))
    b = eg.add(ENode("useb", (s,)))
    eg.union(a, eg.add(ENode("pa", (leaf,))))
    eg.union(b, eg.add(ENode("pb", (leaf,))))
    eg.rebuild()
    price = {"leaf": 0, "s": 4, "usea": 0, "useb": 0, "pa": 3, "pb": 3, "pair": 0}
    return eg, eg.add(ENode("pair", (a, b))), lambda n: price[n.op]


def test_shared_subterm_is_paid_once_so_greedy_is_beaten():
    eg, root, cost = _shared()
    assert dag_cost(eg, root, greedy(eg, cost), cost) == 6
    found = branch_and_bound(eg, root, cost)
    assert found.cost == 4 and found.log.optimal and found.log.greedy_cost == 6
    assert {n.op for n in found.choice.values()} >= {"s", "usea", "useb"}
    assert found.log.root_bound == 0 and found.log.explored > 1


def test_cycles_are_never_extracted_and_must_sets():
    eg = EGraph()
    x = eg.add(ENode("x"))
    f = eg.add(ENode("f", (x,)))
    eg.union(x, f)  # x = f(x): the class holds a self-loop e-node
    eg.rebuild()
    root = eg.add(ENode("g", (x,)))
    found = branch_and_bound(eg, root, lambda n: {"x": 5, "f": 0, "g": 1}[n.op])
    assert found.cost == 6
    assert must_classes(eg)[eg.find(root)] == {eg.find(root), eg.find(x)}
    bad = {eg.find(root): ENode("g", (eg.find(x),)), eg.find(x): ENode("f", (eg.find(x),))}
    assert dag_cost(eg, root, bad, lambda n: 1) == math.inf


def test_time_budget_ends_the_search_with_the_incumbent():
    eg, root, cost = _shared()
    found = branch_and_bound(eg, root, cost, time_budget=0.0)
    assert found.cost == 6 and not found.log.optimal  # the greedy incumbent, not proven
    assert "time budget" in found.log.line()
